"""Envoy as one of the agent's components: start it, share its fate, drain it, stop it.

- `start()` writes the bootstrap (built-in rendering or custom template), resolves
  the binary, reads the bootstrap override, and starts Envoy as a child process.
- `wait_exit()` returns when Envoy exits on its own, with the exit code the agent
  must then exit with: 0 when Envoy exited cleanly, upstream's -1 (255) otherwise.
- `drain()` is the SIGTERM path: POST `drain_listeners?graceful` (`&inboundonly`
  for sidecars), then wait `terminationDrainDuration`, or with
  `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` until no downstream connections are left
  (after `MINIMUM_DRAIN_DURATION`), then stop Envoy. The decisions are the pure
  `envoy.drain.next_step`; time comes from the clock.
- `drain_listeners()` is what `/drain` on the status server does.

A bootstrap using parts only istio-proxy knows (`envoy.istio_proxy_only`) is first
checked with this Envoy's `--mode validate`; a part it names as unregistered is left
out with a warning, so a stock Envoy still runs a waypoint.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from istio_agent.clock import Clock, SystemClock
from istio_agent.config.errors import ConfigError
from istio_agent.envoy.admin import AdminError, EnvoyAdmin
from istio_agent.envoy.argv import envoy_command, read_bootstrap_override
from istio_agent.envoy.bootstrap.render import write_bootstrap
from istio_agent.envoy.drain import next_step
from istio_agent.envoy.istio_proxy_only import (
    ISTIO_PROXY_ONLY_TYPES,
    istio_proxy_only_types,
    unregistered_type,
    without_types,
)
from istio_agent.envoy.options import EnvoyOptions
from istio_agent.envoy.process import EnvoyProcess, run_to_completion
from istio_agent.envoy.stats import ACTIVE_CONNECTIONS_FILTER, active_downstream_connections, parse_stats

log = logging.getLogger(__name__)

# Upstream's pilot-agent exits with -1 (255) when Envoy fails.
ENVOY_FAILED_EXIT_CODE = 255


class ChildProcess(Protocol):
    async def start(self) -> None: ...

    async def stop(self, grace: float = 5.0) -> None: ...


class ProcessFactory(Protocol):
    def __call__(self, argv: Sequence[str], *, on_exit: Callable[[int], None], cwd: str | None,
                 preexec_user: tuple[int, int] | None, env: dict[str, str]) -> ChildProcess: ...


# Runs `argv` (Envoy in validate mode) with `env` added, in `cwd`; returns its exit code and output.
Validator = Callable[[Sequence[str], dict[str, str], str], Awaitable[tuple[int, str]]]


class EnvoySupervisor:
    """The agent's Envoy; `admin` is the one admin client, shared with the status server."""

    name = "envoy"

    def __init__(self, options: EnvoyOptions, admin: EnvoyAdmin, clock: Clock | None = None,
                 spawn: ProcessFactory = EnvoyProcess, validate: Validator = run_to_completion) -> None:
        self.options = options
        self.admin = admin
        self._clock: Clock = clock or SystemClock()
        self._spawn = spawn  # tests pass a stand-in for the child process
        self._validate = validate
        self.process: ChildProcess | None = None
        self._exited: asyncio.Future[int] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self._exited is not None and not self._exited.done()

    async def start(self) -> None:
        opts = self.options
        source = opts.source
        custom = str(opts.bootstrap.proxy_config.get("customConfigFile") or "")
        if custom:
            # As upstream: a customConfigFile is Envoy's config as it stands; nothing is written.
            config_file, written_at = custom, opts.workdir / custom
            if not written_at.is_file():
                raise ConfigError(f"customConfigFile {custom}: no such file (Envoy runs it as its config)")
        else:
            written = write_bootstrap(opts.bootstrap, opts.workdir, istio_bootstrap=source.istio_bootstrap,
                                      template_file=source.template_file)
            # Envoy (run in the work directory) is given the file as upstream names it: `-c
            # etc/istio/proxy/envoy-rev.json` for the default configPath; the agent reads it where it wrote it.
            config_file, written_at = written.for_envoy, written.path
        override = read_bootstrap_override(source.override_path, source.host_ip) if source.override_path else ""
        launch = replace(opts.launch, config_file=config_file, config_override_json=override)
        if not custom and config_file.endswith(".json"):
            await self._fit_to_this_envoy(written_at, envoy_command(opts.binary_path, launch))
        self._exited = asyncio.get_running_loop().create_future()
        self.process = self._spawn(envoy_command(opts.binary_path, launch), on_exit=self._on_exit,
                                   cwd=str(opts.workdir), preexec_user=opts.run_as, env=dict(opts.extra_env))
        await self.process.start()

    async def _fit_to_this_envoy(self, bootstrap_file: Path, command: list[str]) -> None:
        """Leave out the istio-proxy-only parts this Envoy says it lacks (a no-op for istio-proxy)."""
        bootstrap = json.loads(bootstrap_file.read_text())
        present = istio_proxy_only_types(bootstrap)
        dropped: set[str] = set()
        while present - dropped:
            code, output = await self._validate([*command, "--mode", "validate"], dict(self.options.extra_env),
                                                str(self.options.workdir))
            missing = unregistered_type(output) if code != 0 else ""
            if missing not in present - dropped:
                return  # valid, or a problem of another kind: Envoy reports it when it starts
            dropped.add(missing)
            log.warning("this Envoy (%s) lacks istio-proxy's %s: left out of the bootstrap, running without %s",
                        command[0], missing, ISTIO_PROXY_ONLY_TYPES[missing])
            bootstrap = without_types(bootstrap, [missing])
            tmp = bootstrap_file.with_name(bootstrap_file.name + ".tmp")
            tmp.write_text(json.dumps(bootstrap, indent=2) + "\n")
            tmp.replace(bootstrap_file)

    def _on_exit(self, code: int) -> None:
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(ENVOY_FAILED_EXIT_CODE if code != 0 else 0)

    async def wait_exit(self) -> int:
        """Return when Envoy has exited on its own (not when the agent stopped it)."""
        assert self._exited is not None, "start() first"
        return await asyncio.shield(self._exited)

    async def drain_listeners(self) -> None:
        """Ask Envoy to drain its listeners gracefully (inbound only for sidecars), as `/drain` and SIGTERM do."""
        if not self.running:
            return
        path = "/drain_listeners?graceful" + ("&inboundonly" if self.options.drain_inbound_only else "")
        try:
            await self.admin.post(path)
        except AdminError as exc:
            log.warning("draining Envoy failed: %s", exc)

    async def drain(self) -> None:
        """The termination drain: drain listeners, wait as the policy says, then stop Envoy."""
        if not self.running:
            return
        policy = self.options.drain
        log.info("draining Envoy (%s)", "until no active connections" if policy.exit_on_zero_active_connections
                 else f"for {policy.termination_drain_duration:g}s")
        await self.drain_listeners()
        started = self._clock.now()
        active: int | str | None = "unpolled"
        while self.running:
            step = next_step(policy, started, self._clock.now(), active)
            if step.stop:
                log.info("stopping Envoy: %s", step.reason)
                break
            if step.wait > 0:
                await self._wait_or_exit(step.wait)
            if step.poll_connections and self._clock.now() - started >= policy.minimum_drain_duration:
                active = await self._active_connections()
        await self.stop()

    async def _wait_or_exit(self, seconds: float) -> None:
        """Sleep `seconds`, or less if Envoy exits meanwhile."""
        assert self._exited is not None
        sleeper: asyncio.Future[None] = asyncio.ensure_future(self._clock.sleep(seconds))
        exited: asyncio.Future[Any] = self._exited
        try:
            await asyncio.wait([sleeper, exited], return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()

    async def _active_connections(self) -> int | None:
        try:
            stats = parse_stats(await self.admin.stats(ACTIVE_CONNECTIONS_FILTER))
            return active_downstream_connections(stats, self.options.drain.istio_listener_stats)
        except AdminError as exc:
            log.warning("reading active connections failed: %s", exc)
            return None

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            await process.stop(self.options.stop_grace)
