"""`istiod-local up [MESH.yaml]`: a whole mesh described by one file, on this machine (root).

The command line only; the work is `istiod_local.mesh.up.run_up`, imported when
the command runs so that `istiod-local serve` does not load the local node
and the live view. Exit codes: 0 (ready with `--once`; every expectation held
with `--check`; stopped by Ctrl-C/SIGTERM), 1 (a check failed, the node
failed, or another `up` holds the directory), 2 (the mesh file or the command
line is wrong). With `--once` or `--check` the last line on stdout is one
JSON object: `{"pods", "ready_s", "rss_per_pod_mb", "check_passed"}`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click


@click.command("up")
@click.argument("mesh_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--dir", "directory", default="run", show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="istiod-local's state, the registry, the node's logs and the run lock go here.")
@click.option("--capture", type=click.Choice(["cni", "init"]), default="cni", show_default=True,
              help="Who programs a sidecar pod's capture: the Istio CNI plugin or istio-init.")
@click.option("--cni", "cni", type=click.Choice(["istio-agent", "upstream"]), default="istio-agent", show_default=True,
              help="The node's CNI agent (with --capture cni): our install-cni and istio-cni, or upstream Istio's Go "
                   "ones (installed by `make upstream`, or in ISTIO_UPSTREAM_BIN).")
@click.option("--scale", type=click.IntRange(min=1), default=1, show_default=True,
              help="Multiply every deployment's replicas.")
@click.option("--check", is_flag=True, help="Probe every pair of workloads against the file's policies, print the "
                                            "table, exit 0 if every expectation held, 1 otherwise.")
@click.option("--once", is_flag=True, help="Exit once every pod is ready.")
@click.option("--timeout", type=click.FloatRange(min=1), default=120.0, show_default=True,
              help="Seconds to wait for each step (a pod's readiness, istiod-local's start).")
@click.option("--pod-cidr", default="10.244.0.0/24", show_default=True, help="The node's pod network.")
@click.option("--live/--plain", "live", default=None,
              help="The live view (default on a terminal) or the plain one-line-per-event log.")
def up(mesh_file: Path | None, directory: Path, capture: str, cni: str, scale: int, check: bool, once: bool,
       timeout: float, pod_cidr: str, live: bool | None) -> None:
    """Bring up the mesh MESH_FILE describes (default examples/mesh.yaml) on a local node; Ctrl-C removes it."""
    if os.geteuid() != 0:
        raise click.UsageError("istiod-local up builds network namespaces and iptables rules: run it as root")
    from istiod_local.mesh.up import UpOptions, default_mesh, interrupt_on_signals, run_up
    from istiod_local.node.upstream import upstream_commands

    if cni == "upstream":
        if capture != "cni":
            raise click.UsageError("--cni upstream is the node's CNI agent: it needs --capture cni")
        missing = upstream_commands().missing("install-cni", "istio-cni")
        if missing:
            raise click.UsageError(f"--cni upstream: {missing}")
    interrupt_on_signals()
    options = UpOptions(mesh_file=(mesh_file or default_mesh()).resolve(), directory=directory, capture=capture,
                        cni=cni, scale=scale, timeout=timeout, pod_cidr=pod_cidr)
    sys.exit(run_up(options, check, once, live))
