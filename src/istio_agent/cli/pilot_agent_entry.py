"""`pilot-agent`'s console entry point: `pilot-agent istio-iptables ...` before click loads.

Istio's injection template runs capture as `pilot-agent istio-iptables <flags>` in the istio-init
container of every pod, so that form is on the per-pod path. Through click's group it would first
import click and the agent's command modules (~80 ms of CPU) only to hand the raw arguments to the
same parser; here it goes straight to the light `istio-iptables` CLI (`cli/iptables.py`), which
answers exactly as the click subcommand does (it too passes its arguments through unparsed).
`pilot-agent proxy ...` as Istio's templates write it (`cli/proxy_argv.py` says which lines) is
parsed without click too and goes to the same `run_proxy`: the running agent then never holds click
(~1.2 MB of anonymous memory with what it imports) and starts ~20 ms sooner. Everything else, `--help`
and every unusual form included, is the click group's.
"""

from __future__ import annotations

import sys

ISTIO_IPTABLES = "istio-iptables"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == ISTIO_IPTABLES:
        from istio_agent.cli import iptables

        del sys.argv[1]
        iptables.main()
        return
    if "proxy" in sys.argv[1:]:
        from istio_agent.cli.proxy_argv import parse

        call = parse(sys.argv[1:])
        if call is not None:
            from istio_agent.cli.proxy_run import run_proxy

            run_proxy(call.proxy_type, call.flags, call.log_options)
            return
    from istio_agent.cli.pilot_agent import main as pilot_agent

    pilot_agent()
