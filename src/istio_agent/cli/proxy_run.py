"""`pilot-agent proxy`'s body, after its flags are parsed (by click or by `proxy_argv`): no click here.

Both parsers end in `run_proxy`, so a line gives the same agent whichever read it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from istio_agent.cli.logging_setup import LogOptions, configure_logging

# grpcio's core registers fork handlers by default; with its resolver or poller threads busy, a fork for a child
# that runs code before exec (Envoy's preexec: process group, user, death signal) could abort in those handlers
# (seen once: Envoy exiting -6 on `ares_resolver ... channel_ != nullptr`). The agent never uses gRPC in a forked
# child, so they are off unless the operator asks for them. Read by gRPC when it initialises, after this import
# (both parsers, click's in cli/pilot_agent.py and the light one, import this module before the agent's).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


def run_proxy(proxy_type: str, flags: Mapping[str, Any], logging_options: LogOptions,
              unknown_args: Sequence[str] = ()) -> None:
    """Run the agent until it ends; exits the process with the agent's exit code."""
    configure_logging(logging_options)
    values = {**flags, "log_as_json": logging_options.as_json}
    from istio_agent.cli.first_key import start_first_key

    first_key = start_first_key(os.environ)  # made on a thread while the agent's modules load (key_ahead.py)
    from istio_agent.agent.options import AgentFlags
    from istio_agent.agent.run import START_FAILED_EXIT_CODE, load_options, run_agent

    if unknown_args:
        sys.stderr.write(f"ignoring unknown arguments: {' '.join(unknown_args)}\n")
    # Flags the agent uses go into AgentFlags by name; the rest (sts, profiling...) are accepted and unused.
    wanted = {f.name for f in dataclasses.fields(AgentFlags)}
    agent_flags = AgentFlags(proxy_type=proxy_type, **{k: v for k, v in values.items() if k in wanted})
    options = load_options(agent_flags)
    if options is None:
        sys.exit(START_FAILED_EXIT_CODE)
    if options.grpc_cipher_suites:
        # Process-wide in gRPC: set before the agent opens its first TLS channel (COMPLIANCE_POLICY).
        os.environ.setdefault("GRPC_SSL_CIPHER_SUITES", options.grpc_cipher_suites)
    # The agent caps glibc's malloc arenas itself (memory.py) unless the operator chose a cap: theirs stands.
    sys.exit(run_agent(options, cap_malloc_arenas=not os.environ.get("MALLOC_ARENA_MAX"), first_key=first_key))
