"""Find a running pod's network namespace on this node by its IP, through the host's procfs (blocking I/O:
run it off the event loop; `procnet.py` holds the decisions).

Upstream's DaemonSet mounts the host's `/proc` at `/host/proc` when in-place repair is on, and install-cni
looks there (`--repair-host-proc-dir`); on a host where install-cni runs in the host's PID namespace, `/proc`
will do. Processes are grouped by namespace first (the `ns/net` file's device and inode), so each namespace's
address list is read once whatever the number of its processes. Reading another process's `ns/net` needs
ptrace rights over it (the chart's `SYS_PTRACE`); entering it, `SYS_ADMIN`.

Never returned: the host's own namespace (PID 1's) and install-cni's, whatever addresses they hold (a
hostNetwork pod shares the node's IP, and programming capture there would capture the node), nor any
namespace when two hold the pod's IP. Within the pod's namespace, the oldest process is the way in, as
upstream: the pause process, which lives as long as the pod.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from istio_agent.cni.repair.procnet import Holder, holds_address, net_file_for, oldest, start_time


class NetnsNotFound(LookupError):
    """No process under the proc directory is in a namespace holding the pod's IP (the message says what was seen)."""


@dataclass(frozen=True)
class PodNetns:
    """Where to enter the pod's namespace: `<proc>/<pid>/ns/net` of its oldest process."""

    path: str
    pid: int
    processes: int  # processes seen in it


def _netns_id(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def own_netns() -> tuple[int, int] | None:
    """The calling thread's network namespace (install-cni's, unless the thread entered another)."""
    return _netns_id("/proc/thread-self/ns/net")


def find_pod_netns(proc_dir: str, pod_ip: str, exclude: tuple[int, int] | None = None) -> PodNetns:
    """The namespace holding `pod_ip`, entered through its oldest process under `proc_dir` (NetnsNotFound when
    none; ValueError when `pod_ip` is not an IP). `exclude`: a namespace never returned (install-cni's own)."""
    net_file = net_file_for(pod_ip)
    try:
        pids = sorted(int(entry.name) for entry in os.scandir(proc_dir) if entry.name.isdigit())
    except OSError as exc:
        raise NetnsNotFound(f"cannot list processes in {proc_dir}: {exc.strerror or exc} (in-place repair needs the "
                            "host's /proc: mount it into install-cni, e.g. at /host/proc, and give "
                            "--repair-host-proc-dir)") from None
    never = {exclude, _netns_id(f"{proc_dir}/1/ns/net")} - {None}
    groups: dict[tuple[int, int], list[int]] = {}
    unreadable = 0
    for pid in pids:
        key = _netns_id(f"{proc_dir}/{pid}/ns/net")
        if key is None:
            unreadable += 1  # gone meanwhile, or no ptrace rights over it
        elif key not in never:
            groups.setdefault(key, []).append(pid)
    matches: list[list[int]] = []
    for members in groups.values():
        text = next((t for t in (_read(f"{proc_dir}/{pid}/net/{net_file}") for pid in members) if t is not None), None)
        if text is not None and holds_address(net_file, text, pod_ip):
            matches.append(members)
    if len(matches) > 1:
        # Pod IPs are unique on a node: two namespaces holding one means a stale namespace (its processes still
        # there) or a pod of another node sharing this kernel; entering the wrong one would capture a pod
        # that is not this one, so none is chosen (not upstream, which takes the oldest process of any).
        seen = ", ".join(str(members[0]) for members in matches)
        raise NetnsNotFound(f"{len(matches)} network namespaces hold {pod_ip} (processes {seen} in {proc_dir}): "
                            "not choosing one")
    if matches:
        members = matches[0]
        chosen = oldest(Holder(pid, start_time(_read(f"{proc_dir}/{pid}/stat") or "")) for pid in members)
        if chosen is not None:
            return PodNetns(f"{proc_dir}/{chosen.pid}/ns/net", chosen.pid, len(members))
    raise NetnsNotFound(f"no network namespace holding {pod_ip} among {len(groups)} namespaces of {len(pids)} "
                        f"processes in {proc_dir}" + (f" ({unreadable} unreadable)" if unreadable else ""))
