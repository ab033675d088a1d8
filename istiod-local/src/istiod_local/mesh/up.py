"""`istiod-local up`'s run: start the mesh, then check it, exit, or run with the live view; always clean up.

`run_up` is what the `up` command calls.
The live view is `istiod_local.meshview.run_view` in a thread, fed the
running pods (`MeshRun.view_targets`) and this run's events; on a terminal
it owns the screen, otherwise it and the event log print one line per event.
"""

from __future__ import annotations

import json
import queue
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from istiod_local.mesh.expect import table
from istiod_local.mesh.lock import LockedError
from istiod_local.mesh.runner import EventLog, MeshFileError, MeshRun, UpOptions, monitoring_supported
from istiod_local.node.plan import PlanError
from istiod_local.node.processes import NodeError

__all__ = ["DEFAULT_MESH", "UpOptions", "default_mesh", "interrupt_on_signals", "run_up"]

DEFAULT_MESH = Path(__file__).resolve().parents[4] / "examples" / "mesh.yaml"


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


# Ctrl-C, a kill, and the terminal closing (tmux kill-session, a closed ssh session) all stop the mesh.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def interrupt_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt, so each reaches the cleanup.

    SIGINT too: Python leaves it ignored when it started ignored (a background job of a
    non-interactive shell, nohup), and Ctrl-C or a caller's SIGINT must still stop everything.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, _interrupt)


def default_mesh() -> Path:
    """examples/mesh.yaml of this checkout, else of the working directory."""
    return DEFAULT_MESH if DEFAULT_MESH.is_file() else Path("examples/mesh.yaml")


def run_up(options: UpOptions, check: bool, once: bool, live: bool | None = None) -> int:
    """Bring the mesh up, then check it, exit, or run until interrupted; always tear everything down."""
    log = EventLog()
    run = MeshRun(options, log)
    result: dict[str, Any] | None = None
    status = 1
    try:
        if check or once:
            run.start()
            passed: bool | None = None
            if check:
                checked = run.check()
                passed = checked.passed
                print(table(checked.rows, run.plan), flush=True)
                if checked.notes:
                    print(f"not checked ({len(checked.notes)}: the check cannot derive what these do; never counted "
                          "as held):", flush=True)
                    for note in checked.notes:
                        print(f"  {note}", flush=True)
            result = {"pods": len(run.pods), "ready_s": round(run.ready_s or 0.0, 1),
                      "rss_per_pod_mb": run.rss_per_pod_mb(), "check_passed": passed}
            status = 0 if passed in (None, True) else 1
        else:
            status = _run_with_view(run, log, live)
    except KeyboardInterrupt:
        print("\nstopping", file=sys.stderr)
        status = 0 if result is None else status
    except MeshFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        status = 2
    except LockedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        status = 1
    except (NodeError, PlanError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        status = 1
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        try:
            run.close()
        except NodeError as exc:
            print(f"cleanup: {exc}", file=sys.stderr)
            status = status or 1
        if run.node is not None:
            print("removed the mesh's namespaces, processes, mounts and pod directories", file=sys.stderr)
    if result is not None:
        print(json.dumps(result), flush=True)
    return status


def _run_with_view(run: MeshRun, log: EventLog, live: bool | None) -> int:
    """Run until interrupted, with h6's live view (rich on a terminal, its plain log otherwise)."""
    from istiod_local.meshview import run_view

    terminal = sys.stdout.isatty() if live is None else live
    events: queue.Queue[Any] = queue.Queue()
    stop = threading.Event()
    viewers: list[threading.Thread] = []

    def start_view() -> None:
        # Once istiod-local is up, before the first pod: the view shows the pods coming up and turning ready.
        assert run.node is not None
        log.to_view(events, print_lines=False)  # the view shows them: live on a terminal, one line each otherwise
        monitoring = run.monitoring_addr if monitoring_supported() else None
        name = "istiod-local"
        if run.node.real_istiod is not None:  # the pods' control plane: its own monitoring port, same metric names
            monitoring, name = run.node.real_istiod.plan.monitoring_address, "istiod"
        viewer = threading.Thread(target=run_view, args=(run.view_targets, monitoring, stop, events),
                                  kwargs={"istiod_netns": run.node.plan.netns, "live": terminal,
                                          "istiod_name": name}, daemon=True, name="meshview")
        viewer.start()
        viewers.append(viewer)

    try:
        run.start(before_pods=start_view)
        run.run_forever()
    finally:
        stop.set()
        for viewer in viewers:
            viewer.join(5)
    return 0
