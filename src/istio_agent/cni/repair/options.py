"""The repair controller's settings: install-cni's `--repair-*` flags, with upstream's defaults."""

from __future__ import annotations

from dataclasses import dataclass

VALIDATION_EXIT_CODE = 126  # what `pilot-agent istio-iptables --run-validation` exits with when capture is missing


@dataclass(frozen=True)
class RepairOptions:
    """Which pods are broken (their validation init container failed) and what to do with them.

    Field names follow upstream's flags (`--repair-<name>` with `_` for `-`).
    """

    enabled: bool = True
    node_name: str = ""  # `--repair-node-name`: "" watches pods on every node
    label_key: str = "cni.istio.io/uninitialized"
    label_value: str = "true"
    # Upstream has no `--repair-repair-pods` flag: the binary reads REPAIR_REPAIR_PODS (unset: false); Istio's
    # istio-cni chart sets it true. In-place repair finds the pod's netns through the host's procfs: inplace.py.
    repair_pods: bool = False
    delete_pods: bool = False
    label_pods: bool = False
    sidecar_annotation: str = "sidecar.istio.io/status"
    init_container_name: str = "istio-validation"
    init_container_termination_message: str = ""
    init_container_exit_code: int = VALIDATION_EXIT_CODE
    label_selectors: str = ""
    field_selectors: str = ""
    # Not upstream (which hard-codes it): where the host's /proc is, for in-place repair. Upstream's chart mounts
    # it at /host/proc when repair.repairPods is set; `/proc` when install-cni shares the host's PID namespace.
    host_proc_dir: str = "/host/proc"
