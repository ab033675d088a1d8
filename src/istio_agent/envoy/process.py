"""Running Envoy as a child process whose fate the agent shares.

Envoy's output is relayed line by line into the agent's log (logger
`istio_agent.envoy.proc`), so a pod has one log stream. When Envoy exits on
its own, `on_exit(returncode)` tells the agent, which then exits too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger("istio_agent.envoy.proc")

PR_SET_PDEATHSIG = 1
# Envoy can print very long lines (a rejected push names every failing resource). Lines up to
# this size are relayed whole; a longer one is dropped with a warning. Either way the pipe keeps
# draining: left full, it would block Envoy's logging and with it Envoy itself.
OUTPUT_LINE_LIMIT = 1 << 20


def _detach_and_die_with_parent(user: tuple[int, int] | None = None) -> None:
    """In the child before exec: own process group, the proxy user, and SIGKILL when the agent dies.

    A terminal's Ctrl-C (or a signal to the agent's process group) must reach only the
    agent, which then drains Envoy; and Envoy must never outlive a crashed agent.
    The user switch happens here rather than through `user=`/`group=` because
    uvloop's subprocess support rejects those; it comes before the death signal,
    which a credential change would clear.
    """
    import ctypes

    os.setpgid(0, 0)
    if user is not None:
        os.setgroups([])
        os.setgid(user[1])
        os.setuid(user[0])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


async def run_to_completion(argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None,
                            timeout: float = 30.0) -> tuple[int, str]:
    """Run a short-lived Envoy (`--mode validate`) with the agent's environment plus `env`: (exit code, output)."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **env}, cwd=cwd)
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        return -1, f"{argv[0]} did not finish within {timeout:g}s"
    return process.returncode or 0, output.decode(errors="replace")


class EnvoyProcess:
    def __init__(
        self,
        argv: Sequence[str],
        on_exit: Callable[[int], None],
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        preexec_user: tuple[int, int] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.on_exit = on_exit
        # The agent's own environment plus `env` (e.g. GRPC_SSL_CIPHER_SUITES under a compliance policy).
        self.env = {**os.environ, **env} if env else None
        self.cwd = cwd
        self.preexec_user = preexec_user
        self.proc: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self) -> None:
        user = self.preexec_user
        log.info("starting Envoy: %s", " ".join(self.argv))
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env=self.env, cwd=self.cwd, preexec_fn=lambda: _detach_and_die_with_parent(user),
            limit=OUTPUT_LINE_LIMIT,
        )
        self._tasks = [asyncio.create_task(self._relay_output()), asyncio.create_task(self._watch())]

    async def _relay_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            try:
                line = await self.proc.stdout.readline()
            except ValueError:  # longer than OUTPUT_LINE_LIMIT: readline has discarded what it held
                log.warning("Envoy printed a line over %d bytes; not relayed", OUTPUT_LINE_LIMIT)
                continue
            if not line:
                return
            log.info("%s", line.decode("utf-8", "replace").rstrip())

    async def _watch(self) -> None:
        assert self.proc is not None
        code = await self.proc.wait()
        if self._stopping:
            log.info("Envoy stopped (exit code %s)", code)
            return
        log.warning("Envoy exited on its own with code %s", code)
        self.on_exit(code)

    async def stop(self, grace: float = 5.0) -> None:
        """Terminate Envoy (SIGTERM, then SIGKILL after `grace` seconds) and wait for it."""
        self._stopping = True
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                await proc.wait()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 2.0)
