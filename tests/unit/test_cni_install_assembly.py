"""install-cni's assembly in-process: which components, in which order; run on the lifecycle with stand-ins for
them, SIGTERM stops them in reverse, a fatal start failure exits 1 after stopping what started, and the installer
loop shares the program's fate (its failure exits 1)."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import pytest
from fakes import RecordingPart as Part

from istio_agent.cni.install.assembly import PROGRAM, InstallCniAssembly, run_until_stopped
from istio_agent.cni.install.components import Installation, InstallerLoop, StartFailed
from istio_agent.cni.install.installer import InstallError, StepOutcome
from istio_agent.cni.install.metrics import InstallMetrics
from istio_agent.cni.install.options import InstallOptions
from istio_agent.cni.install.servers import Readiness
from istio_agent.cni.repair.options import RepairOptions
from istio_agent.kube.access import KubeAccess
from istio_agent.lifecycle import Component, Lifecycle

ACCESS = KubeAccess("https://127.0.0.1:6443", "/nonexistent/ca.crt", "/nonexistent/token")


def names(components: list[Component]) -> list[str]:
    return [str(getattr(c, "name", "")) for c in components]


def test_the_node_agent_starts_its_servers_then_installs_then_repairs(tmp_path: Path) -> None:
    options = InstallOptions(cni_agent_run_dir=str(tmp_path), log_uds_socket=str(tmp_path / "log.sock"),
                             readiness_port=8000, monitoring_port=15014, repair=RepairOptions(enabled=True))
    assembly = InstallCniAssembly(options, ACCESS, tmp_path / "istio-cni")
    assert names(assembly.node_stage()) == ["plugin log socket", "istio-cni fast path", "health server",
                                            "metrics server", "installation", "installer loop"]
    assert names(assembly.repair_stage()) == ["repair controller"]


def test_servers_without_a_port_and_repair_when_disabled_are_left_out(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    options = InstallOptions(cni_agent_run_dir=str(tmp_path), log_uds_socket=str(tmp_path / "log.sock"),
                             readiness_port=0, monitoring_port=0, repair=RepairOptions(enabled=False))
    assembly = InstallCniAssembly(options, ACCESS, tmp_path / "istio-cni")
    assert names(assembly.node_stage()) == ["plugin log socket", "istio-cni fast path", "installation",
                                            "installer loop"]
    with caplog.at_level(logging.INFO, "istio_agent.cni.install"):
        assert assembly.repair_stage() == []
    assert "CNI repair controller is disabled" in caplog.text


class Loop(Part):
    """Shares the program's fate, as the installer loop: `end(code)` ends it."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__(name, log)
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def wait_exit(self) -> int:
        return await asyncio.shield(self.exited)


def parts(log: list[str]) -> list[Component]:
    return [Part("plugin log socket", log), Part("health server", log), Part("installation", log),
            Loop("installer loop", log)]


async def started(lifecycle: Lifecycle, count: int) -> None:
    while len(lifecycle.started) < count:
        await asyncio.sleep(0)


async def test_sigterm_stops_every_component_in_reverse_and_exits_0(caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    repair_built: list[str] = []

    def repair_stage() -> list[Component]:
        repair_built.append(log[-1])
        return [Part("repair controller", log)]

    lifecycle = Lifecycle(parts(log), repair_stage, name=PROGRAM, logger=logging.getLogger("istio_agent.cni.install"))
    with caplog.at_level(logging.INFO, "istio_agent.cni.install"):
        run = asyncio.create_task(run_until_stopped(lifecycle))
        await started(lifecycle, 5)
        # The handler must be there: SIGTERM's default action would end the test run.
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        signal.raise_signal(signal.SIGTERM)
        assert await asyncio.wait_for(run, 5) == 0
    assert repair_built == ["start installer loop"], "repair is built once the installer runs"
    assert log == ["start plugin log socket", "start health server", "start installation", "start installer loop",
                   "start repair controller", "stop repair controller", "stop installer loop", "stop installation",
                   "stop health server", "stop plugin log socket"]
    assert ("CNI node agent started: plugin log socket, health server, installation, installer loop, "
            "repair controller") in caplog.text
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "the handler goes with the run"


async def test_a_fatal_start_failure_exits_1_after_stopping_what_started() -> None:
    log: list[str] = []
    components: list[Component] = [Part("plugin log socket", log), Part("fast path", log),
                                   Part("health server", log, StartFailed("port 8000 in use")),
                                   Part("installation", log)]
    assert await run_until_stopped(Lifecycle(components, name=PROGRAM)) == 1
    assert log == ["start plugin log socket", "start fast path", "start health server", "stop fast path",
                   "stop plugin log socket"]


async def test_another_start_failure_is_not_swallowed() -> None:
    log: list[str] = []
    with pytest.raises(RuntimeError, match="a bug"):
        await run_until_stopped(Lifecycle([Part("a", log), Part("b", log, RuntimeError("a bug"))], name=PROGRAM))
    assert log == ["start a", "start b", "stop a"]


async def test_the_installer_loop_ending_ends_the_node_agent_with_its_code() -> None:
    log: list[str] = []
    components = parts(log)
    loop = components[-1]
    assert isinstance(loop, Loop)
    lifecycle = Lifecycle(components, name=PROGRAM)
    run = asyncio.create_task(run_until_stopped(lifecycle))
    await started(lifecycle, 4)
    loop.exited.set_result(1)
    assert await asyncio.wait_for(run, 5) == 1
    assert log[-4:] == ["stop installer loop", "stop installation", "stop health server", "stop plugin log socket"]


class BrokenInstaller:
    """An installer whose first step raises `failure`: an InstallError (counted, then the loop ends with it, as
    upstream's installer returns its error) or anything else."""

    def __init__(self, failure: Exception) -> None:
        self.failure = failure
        self.steps = 0

    def in_effect(self) -> bool:
        return False

    def install_all(self) -> StepOutcome:
        self.steps += 1
        raise self.failure


class QuietWatcher:
    def ensure_watches(self) -> list[str]:
        return []

    async def wait(self, timeout: float) -> bool:
        await asyncio.sleep(0)
        return True


@pytest.mark.parametrize(("failure", "counted"), [
    (InstallError("COPY_BINARIES_FAILURE", "bin dir not writable"), True),
    (OSError("disk gone"), False),
])
async def test_the_real_installer_loop_failing_exits_1_and_reports_not_ready(
        failure: Exception, counted: bool, caplog: pytest.LogCaptureFixture) -> None:
    installation = Installation(InstallOptions(), Path("/nonexistent"), ACCESS)
    installation.installer = BrokenInstaller(failure)  # type: ignore[assignment]
    installation.watcher = QuietWatcher()  # type: ignore[assignment]
    readiness, metrics = Readiness(ready=True), InstallMetrics()
    loop = InstallerLoop(installation, readiness, metrics)
    with caplog.at_level(logging.INFO, "istio_agent.cni.install"):
        assert await Lifecycle([loop], name=PROGRAM).run() == 1
    assert f"installer failed: {failure}" in caplog.text
    assert "CNI node agent shutting down" in caplog.text
    assert not readiness.ready and metrics.registry.get_sample_value("istio_cni_install_ready") == 0
    installs = metrics.registry.get_sample_value("istio_cni_installs_total", {"result": "COPY_BINARIES_FAILURE"})
    assert installs == (1 if counted else None)
