"""Upstream Istio's own Go commands on the local node: where they are, and what a pod needs to run them.

The local node can run a pod's agent from upstream's Go `pilot-agent` instead of ours (a
deployment's `agent: upstream` in the mesh file, `PodSpec.agent_implementation`), and the node's CNI
agent from upstream's `install-cni` (which installs upstream's `istio-cni`: `NodeOptions.cni`). That
is what proves istiod-local speaks upstream's protocols as the real agent expects them, and lets the
two implementations stand side by side against the same pods.

Upstream's commands are built from the Go module proxy into `<checkout>/.upstream/bin` (`make
upstream`), or wherever `ISTIO_UPSTREAM_BIN` points. The Go agent also reads Envoy's bootstrap
template from `./var/lib/istio/envoy/envoy_bootstrap_tmpl.json`, a file of upstream's proxy image,
not of its binary: `make upstream` copies it from the Go module cache into `<that bin>/../share/`
(never into the repository: it is upstream's source), and the node lays it in each Go agent's pod
directory. Nothing here is needed for a node that runs only our own agent.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

UPSTREAM_BIN_ENV = "ISTIO_UPSTREAM_BIN"
DEFAULT_UPSTREAM_BIN = Path(__file__).resolve().parents[4] / ".upstream" / "bin"
# Agent implementations a pod may run: ours (the default) or upstream's Go pilot-agent.
OURS = "istio-agent"
UPSTREAM = "upstream"
AGENT_IMPLEMENTATIONS = (OURS, UPSTREAM)
# Who the node's CNI agent is: our install-cni (and istio-cni), or upstream's.
CNI_IMPLEMENTATIONS = (OURS, UPSTREAM)
# Where upstream's proxy image has the bootstrap template (relative: the agent's working directory is
# the pod's root), and the file's name in the share directory beside upstream's commands.
BOOTSTRAP_TEMPLATE = "var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
TEMPLATE_NAME = "envoy_bootstrap_tmpl.json"
COMMANDS = ("pilot-agent", "install-cni", "istio-cni")


def upstream_bin(environment: Mapping[str, str] | None = None) -> Path:
    """Upstream's commands: `ISTIO_UPSTREAM_BIN`, else `<checkout>/.upstream/bin`."""
    given = (os.environ if environment is None else environment).get(UPSTREAM_BIN_ENV, "")
    return Path(given) if given else DEFAULT_UPSTREAM_BIN


@dataclass(frozen=True)
class UpstreamCommands:
    """Upstream's installed commands and the agent's bootstrap template, found in one directory."""

    bin: Path

    @property
    def pilot_agent(self) -> Path:
        return self.bin / "pilot-agent"

    @property
    def install_cni(self) -> Path:
        return self.bin / "install-cni"

    @property
    def istio_cni(self) -> Path:
        return self.bin / "istio-cni"

    @property
    def bootstrap_template(self) -> Path:
        return self.bin.parent / "share" / TEMPLATE_NAME

    def missing(self, *commands: str) -> str:
        """Why `commands` (and, for pilot-agent, the bootstrap template) cannot run: "" when they can."""
        absent = [name for name in commands if not os.access(self.bin / name, os.X_OK)]
        if "pilot-agent" in commands and not self.bootstrap_template.is_file():
            absent.append(str(self.bootstrap_template))
        if not absent:
            return ""
        return (f"upstream's Go {', '.join(absent)} not installed in {self.bin} (run `make upstream`, which needs "
                f"`go` and the Go module proxy, or point {UPSTREAM_BIN_ENV} at a directory holding them)")


def upstream_commands(environment: Mapping[str, str] | None = None) -> UpstreamCommands:
    return UpstreamCommands(upstream_bin(environment))


def lay_bootstrap_template(commands: UpstreamCommands, pod_dir: Path) -> None:
    """Put upstream's bootstrap template where its image has it, under the pod's root (before `lay_out_pod`,
    which makes it root's and read-only, as an image's file is)."""
    target = pod_dir / BOOTSTRAP_TEMPLATE
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(commands.bootstrap_template, target)
