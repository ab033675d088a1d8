"""Envoy's supervisor with a stand-in process and admin API, in virtual time: argv, fate, and every drain decision."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from istio_agent.clock import VirtualClock
from istio_agent.config.errors import ConfigError
from istio_agent.envoy.argv import EnvoyLaunch
from istio_agent.envoy.bootstrap.options import BootstrapOptions
from istio_agent.envoy.drain import DrainPolicy
from istio_agent.envoy.options import BootstrapSource, EnvoyOptions
from istio_agent.envoy.stats import istio_listener_stats
from istio_agent.envoy.supervisor import ENVOY_FAILED_EXIT_CODE, EnvoySupervisor


class FakeProcess:
    def __init__(self, clock: VirtualClock, argv: Sequence[str], on_exit: Callable[[int], None]) -> None:
        self.clock = clock
        self.argv = list(argv)
        self.on_exit = on_exit
        self.stopped_at: float | None = None

    async def start(self) -> None:
        return None

    async def stop(self, grace: float = 5.0) -> None:
        self.stopped_at = self.clock.elapsed()


class FakeAdmin:
    """Records POSTs; answers each stats poll with the next active-connection count (None: no such stats)."""

    def __init__(self, clock: VirtualClock, active: Sequence[int | None] = ()) -> None:
        self.clock = clock
        self.active = list(active)
        self.posts: list[tuple[float, str]] = []
        self.polls: list[float] = []

    async def post(self, path: str) -> None:
        self.posts.append((self.clock.elapsed(), path))

    async def stats(self, filter_regex: str) -> str:
        self.polls.append(self.clock.elapsed())
        count = self.active.pop(0) if self.active else 0
        if count is None:
            return "server.live: 1\n"
        return f"listener.0.0.0.0_15006.downstream_cx_active: {count}\nlistener.admin.downstream_cx_active: 1\n"


def envoy_options(tmp_path: Path, drain: DrainPolicy, *, inbound_only: bool = True) -> EnvoyOptions:
    binary = tmp_path / "envoy"
    binary.write_text("#!/bin/sh\n")
    bootstrap = BootstrapOptions("sidecar~10.1.1.1~p.ns~ns.svc.cluster.local",
                                 {"configPath": str(tmp_path / "proxy")}, {})
    return EnvoyOptions(bootstrap=bootstrap, source=BootstrapSource(), workdir=tmp_path, binary_path=str(binary),
                        launch=EnvoyLaunch(config_file="", drain_duration=45.0, concurrency=2), drain=drain,
                        drain_inbound_only=inbound_only)


def supervised(tmp_path: Path, clock: VirtualClock, drain: DrainPolicy, admin: FakeAdmin,
               **kwargs: Any) -> tuple[EnvoySupervisor, list[FakeProcess]]:
    processes: list[FakeProcess] = []

    def spawn(argv: Sequence[str], *, on_exit: Callable[[int], None], cwd: str | None,
              preexec_user: tuple[int, int] | None, env: dict[str, str]) -> FakeProcess:
        processes.append(FakeProcess(clock, argv, on_exit))
        return processes[-1]

    return EnvoySupervisor(envoy_options(tmp_path, drain, **kwargs), admin, clock, spawn), processes  # type: ignore[arg-type]


def test_start_writes_the_bootstrap_and_runs_envoy_with_upstreams_argv(tmp_path: Path) -> None:
    clock = VirtualClock()

    async def scenario() -> list[str]:
        supervisor, processes = supervised(tmp_path, clock, DrainPolicy(5.0, False, 5.0), FakeAdmin(clock))
        await supervisor.start()
        return processes[0].argv

    argv = clock.run(scenario())
    config = tmp_path / "proxy/envoy-rev.json"
    assert config.is_file()
    assert argv[0] == str(tmp_path / "envoy")
    assert argv[1:5] == ["-c", str(config), "--drain-time-s", "45"]
    assert argv[-2:] == ["--concurrency", "2"]


def test_envoy_is_given_the_bootstrap_as_upstream_names_it_relative_to_its_work_directory(tmp_path: Path) -> None:
    """Upstream hands Envoy `path.Join(configPath, "envoy-rev.json")`: `etc/istio/proxy/envoy-rev.json` for the
    default `./etc/istio/proxy`, resolved by Envoy in the work directory it runs in."""
    clock = VirtualClock()
    options = envoy_options(tmp_path, DrainPolicy(5.0, False, 5.0))
    options = replace(options, bootstrap=replace(options.bootstrap, proxy_config={"configPath": "./etc/istio/proxy"}))
    started: list[tuple[Sequence[str], str | None]] = []

    def spawn(argv: Sequence[str], *, on_exit: Callable[[int], None], cwd: str | None,
              preexec_user: tuple[int, int] | None, env: dict[str, str]) -> FakeProcess:
        started.append((argv, cwd))
        return FakeProcess(clock, argv, on_exit)

    supervisor = EnvoySupervisor(options, FakeAdmin(clock), clock, spawn)  # type: ignore[arg-type]
    clock.run(supervisor.start())
    (argv, cwd), = started
    assert argv[1:3] == ["-c", "etc/istio/proxy/envoy-rev.json"] and cwd == str(tmp_path)
    assert (tmp_path / "etc/istio/proxy/envoy-rev.json").is_file()


def test_termination_drain_waits_the_drain_duration_then_stops_envoy(tmp_path: Path) -> None:
    clock = VirtualClock()
    admin = FakeAdmin(clock)

    async def scenario() -> FakeProcess:
        supervisor, processes = supervised(tmp_path, clock, DrainPolicy(5.0, False, 5.0), admin)
        await supervisor.start()
        await clock.sleep(100)
        await supervisor.drain()
        return processes[0]

    process = clock.run(scenario())
    assert admin.posts == [(100, "/drain_listeners?graceful&inboundonly")]
    assert process.stopped_at == 105
    assert admin.polls == [], "the plain policy never reads connection counts"


def test_exit_on_zero_connections_polls_after_the_minimum_and_stops_at_zero(tmp_path: Path) -> None:
    clock = VirtualClock()
    admin = FakeAdmin(clock, active=[3, 1, 0])

    async def scenario() -> FakeProcess:
        supervisor, processes = supervised(tmp_path, clock, DrainPolicy(30.0, True, 5.0), admin, inbound_only=False)
        await supervisor.start()
        await supervisor.drain()
        return processes[0]

    process = clock.run(scenario())
    assert admin.posts == [(0, "/drain_listeners?graceful")], "gateways drain every listener"
    assert admin.polls == [5, 6, 7]  # after MINIMUM_DRAIN_DURATION, then every second; Istio's own listeners excluded
    assert process.stopped_at == 7


def test_exit_on_zero_connections_stops_when_envoy_has_no_such_stats(tmp_path: Path) -> None:
    clock = VirtualClock()
    admin = FakeAdmin(clock, active=[None])

    async def scenario() -> FakeProcess:
        supervisor, processes = supervised(tmp_path, clock, DrainPolicy(30.0, True, 5.0), admin)
        await supervisor.start()
        await supervisor.drain()
        return processes[0]

    assert clock.run(scenario()).stopped_at == 5


def test_envoy_exiting_mid_drain_ends_the_wait(tmp_path: Path) -> None:
    clock = VirtualClock()

    async def scenario() -> tuple[FakeProcess, int]:
        supervisor, processes = supervised(tmp_path, clock, DrainPolicy(60.0, False, 5.0), FakeAdmin(clock))
        await supervisor.start()
        clock.call_at(clock.now() + 2, lambda: processes[0].on_exit(0))
        await supervisor.drain()
        return processes[0], await supervisor.wait_exit()

    process, code = clock.run(scenario())
    assert process.stopped_at == 2
    assert code == 0


def test_wait_exit_reports_upstreams_code_for_a_failed_envoy(tmp_path: Path) -> None:
    clock = VirtualClock()

    async def scenario() -> int:
        supervisor, processes = supervised(tmp_path, clock, DrainPolicy(5.0, False, 5.0), FakeAdmin(clock))
        await supervisor.start()
        clock.call_at(clock.now() + 1, lambda: processes[0].on_exit(-11))
        return await supervisor.wait_exit()

    assert clock.run(scenario()) == ENVOY_FAILED_EXIT_CODE == 255


def test_drain_listeners_does_nothing_before_envoy_runs(tmp_path: Path) -> None:
    clock = VirtualClock()
    admin = FakeAdmin(clock)

    async def scenario() -> None:
        supervisor, _ = supervised(tmp_path, clock, DrainPolicy(5.0, False, 5.0), admin)
        await supervisor.drain_listeners()
        await supervisor.drain()

    clock.run(scenario())
    assert admin.posts == []


def test_custom_config_file_is_envoys_config_unchanged(tmp_path: Path) -> None:
    """As upstream's agent: with customConfigFile nothing is rendered or written; Envoy runs that file."""
    clock = VirtualClock()
    custom = tmp_path / "mine.yaml"
    custom.write_text("admin: {address: {pipe: {path: /tmp/a}}}\n")
    supervisor, processes = supervised(tmp_path, clock, DrainPolicy(5.0, False, 5.0), FakeAdmin(clock))
    supervisor.options = replace(supervisor.options, bootstrap=replace(
        supervisor.options.bootstrap, proxy_config={"configPath": str(tmp_path / "proxy"),
                                                    "customConfigFile": str(custom)}))
    clock.run(supervisor.start())
    assert processes[0].argv[1:3] == ["-c", str(custom)]
    assert custom.read_text() == "admin: {address: {pipe: {path: /tmp/a}}}\n"
    assert not (tmp_path / "proxy/envoy-rev.json").exists()


def test_a_missing_custom_config_file_is_named_at_start(tmp_path: Path) -> None:
    clock = VirtualClock()
    supervisor, processes = supervised(tmp_path, clock, DrainPolicy(5.0, False, 5.0), FakeAdmin(clock))
    supervisor.options = replace(supervisor.options, bootstrap=replace(
        supervisor.options.bootstrap, proxy_config={"customConfigFile": "absent.json"}))
    with pytest.raises(ConfigError, match=r"customConfigFile absent\.json"):
        clock.run(supervisor.start())
    assert processes == []


class PortAdmin(FakeAdmin):
    """Connections only on a status listener moved to port 16021 (ENVOY_STATUS_PORT)."""

    async def stats(self, filter_regex: str) -> str:
        self.polls.append(self.clock.elapsed())
        return "listener.0.0.0.0_16021.downstream_cx_active: 4\nlistener.0.0.0.0_15006.downstream_cx_active: 0\n"


def test_drain_leaves_out_istio_listeners_on_the_configured_ports(tmp_path: Path) -> None:
    clock = VirtualClock()
    admin = PortAdmin(clock)
    policy = DrainPolicy(30.0, True, 5.0, istio_listener_stats=istio_listener_stats((15090, 16021)))

    async def scenario() -> FakeProcess:
        supervisor, processes = supervised(tmp_path, clock, policy, admin)
        await supervisor.start()
        await supervisor.drain()
        return processes[0]

    assert clock.run(scenario()).stopped_at == 5, "connections to the moved status port are not application traffic"


class FakeValidator:
    """Envoy's `--mode validate`, answering from a script of (exit code, output)."""

    def __init__(self, *answers: tuple[int, str]) -> None:
        self.answers = list(answers)
        self.calls: list[list[str]] = []

    async def __call__(self, argv: Sequence[str], env: dict[str, str], cwd: str) -> tuple[int, str]:
        self.calls.append(list(argv))
        return self.answers.pop(0)


UNREGISTERED_METADATA = ("error initializing configuration 'x': Didn't find a registered implementation for "
                         "'metadata_discovery' with type URL: 'istio.workload.BootstrapExtension'")


def waypoint_supervisor(tmp_path: Path, validator: FakeValidator) -> tuple[EnvoySupervisor, list[FakeProcess]]:
    clock = VirtualClock()
    processes: list[FakeProcess] = []

    def spawn(argv: Sequence[str], *, on_exit: Callable[[int], None], cwd: str | None,
              preexec_user: tuple[int, int] | None, env: dict[str, str]) -> FakeProcess:
        processes.append(FakeProcess(clock, argv, on_exit))
        return processes[-1]

    options = envoy_options(tmp_path, DrainPolicy(5.0, False, 5.0))
    options = replace(options, bootstrap=BootstrapOptions(
        "waypoint~10.1.1.1~w.ns~ns.svc.cluster.local", {"configPath": str(tmp_path / "proxy")}, {}))
    return EnvoySupervisor(options, FakeAdmin(clock), clock, spawn, validator), processes  # type: ignore[arg-type]


def extension_names(tmp_path: Path) -> list[str]:
    return [e["name"] for e in json.loads((tmp_path / "proxy/envoy-rev.json").read_text())["bootstrap_extensions"]]


def test_a_stock_envoy_runs_a_waypoint_without_istio_proxys_extension(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    validator = FakeValidator((1, UNREGISTERED_METADATA))
    supervisor, processes = waypoint_supervisor(tmp_path, validator)
    VirtualClock().run(supervisor.start())
    assert validator.calls[0][-2:] == ["--mode", "validate"] and validator.calls[0][1:3] == processes[0].argv[1:3]
    assert extension_names(tmp_path) == ["envoy.bootstrap.internal_listener"]
    assert "lacks istio-proxy's istio.workload.BootstrapExtension" in caplog.text


def test_istio_proxy_keeps_the_whole_bootstrap(tmp_path: Path) -> None:
    validator = FakeValidator((0, "configuration '/p/envoy-rev.json' OK"))
    supervisor, processes = waypoint_supervisor(tmp_path, validator)
    VirtualClock().run(supervisor.start())
    assert len(validator.calls) == 1 and processes
    assert extension_names(tmp_path) == ["metadata_discovery", "envoy.bootstrap.internal_listener"]


def test_another_validation_error_leaves_the_bootstrap_for_envoy_to_report(tmp_path: Path) -> None:
    validator = FakeValidator((1, "error initializing configuration: Unable to parse JSON as proto"))
    supervisor, processes = waypoint_supervisor(tmp_path, validator)
    VirtualClock().run(supervisor.start())
    assert extension_names(tmp_path) == ["metadata_discovery", "envoy.bootstrap.internal_listener"] and processes


def test_a_plain_sidecar_bootstrap_is_not_validated(tmp_path: Path) -> None:
    clock = VirtualClock()
    validator = FakeValidator()
    supervisor, _ = supervised(tmp_path, clock, DrainPolicy(5.0, False, 5.0), FakeAdmin(clock))
    supervisor._validate = validator
    clock.run(supervisor.start())
    assert validator.calls == []
