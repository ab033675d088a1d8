"""`istiod-local up [MESH.yaml]`: a whole mesh described by one file, on this machine (root).

The command line only (its flags: the program's table, `flags.py`); the work
is `istiod_local.mesh.up.run_up`, imported when the command runs so that
`istiod-local serve` does not load the local node and the live view. Exit
codes: 0 (ready with `--once`; every expectation held with `--check`; stopped
by Ctrl-C/SIGTERM), 1 (a check failed, the node failed, or another `up` holds
the directory), 2 (the mesh file or the command line is wrong). With `--once`
or `--check` the last line on stdout is one JSON object: `{"pods", "ready_s", "rss_per_pod_mb", "check_passed"}`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from istio_agent.config import clickflags
from istiod_local.cli.flags import UP


@click.command("up", help=UP.summary)
@clickflags.arguments(UP.arguments, {"mesh_file": {"type": click.Path(dir_okay=False, path_type=Path)}})
@clickflags.options(UP.flags, {
    "dir": {"type": click.Path(file_okay=False, path_type=Path)}, "scale": {"type": click.IntRange(min=1)},
    "timeout": {"type": click.FloatRange(min=1)}}, show_default=True)
def up(mesh_file: Path | None, directory: Path, capture: str, cni: str, control_plane: str, scale: int, check: bool,
       once: bool, timeout: float, pod_cidr: str, live: bool | None) -> None:
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
    if control_plane == "istiod":
        if capture != "cni":
            raise click.UsageError("--control-plane istiod reads the pods from istiod-local's Kubernetes API, which "
                                   "only a --capture cni node serves")
        missing = upstream_commands().missing("pilot-discovery")
        if missing:
            raise click.UsageError(f"--control-plane istiod: {missing}")
    interrupt_on_signals()
    options = UpOptions(mesh_file=(mesh_file or default_mesh()).resolve(), directory=directory, capture=capture,
                        cni=cni, control_plane=control_plane, scale=scale, timeout=timeout, pod_cidr=pod_cidr)
    sys.exit(run_up(options, check, once, live))
