"""`pilot-agent proxy` run on the one lifecycle: the options loaded, the agent assembled and run on its own loop.

What the components are and how they are wired is `assembly.py`'s business;
starting, stopping and fate-sharing are `lifecycle.Lifecycle`'s. The assembly
(and with it every component) is imported only when the agent runs, so that
loading the options keeps the first CSR waiting for nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING

from istio_agent.agent.loader import load_agent_options
from istio_agent.agent.options import AgentFlags, AgentOptions
from istio_agent.config.errors import ConfigError
from istio_agent.lifecycle import START_FAILED_EXIT_CODE

if TYPE_CHECKING:
    from istio_agent.security.key_ahead import KeyAhead

__all__ = ["START_FAILED_EXIT_CODE", "load_options", "run_agent"]

log = logging.getLogger(__name__)


def load_options(flags: AgentFlags) -> AgentOptions | None:
    """`pilot-agent proxy`'s options, or None after printing the error (the caller exits with 1)."""
    try:
        return load_agent_options(flags)
    except ConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return None


def run_agent(options: AgentOptions, cap_malloc_arenas: bool = True, first_key: KeyAhead | None = None) -> int:
    """Run the agent for `options` on a new event loop; its exit code.

    `cap_malloc_arenas` is false when the operator set MALLOC_ARENA_MAX, which glibc has then applied.
    `first_key` is the workload key made ahead since the CLI started (`security/key_ahead.py`), if any.
    """
    import signal

    from istio_agent.agent.assembly import assemble
    from istio_agent.eventloop import new_event_loop
    from istio_agent.memory import limit_malloc_arenas

    if cap_malloc_arenas:
        limit_malloc_arenas()
    # asyncio's own loop, not uvloop: gRPC moves the agent's bytes on its own threads, and this loop carries
    # only gRPC's completions, the status server and Envoy's supervision. Measured by bench_memory (A/B, two
    # runs each): uvloop's import, loop and libuv workers cost the proxyless agent 2.6 MB RSS / 1.1 MB
    # anonymous and the sidecar 0.3-1 MB; bench_xds's push ratio did not move. The DNS proxy's own io thread
    # keeps its choice (DnsProxyOptions.use_uvloop), where uvloop serves the queries.
    loop = new_event_loop(prefer_uvloop=False)
    asyncio.set_event_loop(loop)
    agent = assemble(options, first_key)
    for sig in (signal.SIGTERM, signal.SIGINT):  # first: from here on a SIGTERM is a graceful stop
        loop.add_signal_handler(sig, agent.request_stop)
    for var in options.without_effect:
        log.warning("environment variable %s is set but has no effect here: %s", var.name, var.note)
    try:
        return loop.run_until_complete(agent.run())
    except (ConfigError, OSError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return START_FAILED_EXIT_CODE
    finally:
        loop.close()
