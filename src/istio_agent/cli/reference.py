"""`python -m istio_agent.cli.reference [DIR]` (`make docs`): the product's programs' reference pages.

Each page (`docs/reference/<program>.md`) is rendered from the program's
table by `config/reference.py`; a test keeps them in sync. It lives in `cli/`
because only the command lines may import every program's table (nothing
imports them); istiod-local's page has its own module in the local
environment (`istiod_local.cli.reference`), which the product never imports.
"""

from __future__ import annotations

import sys
from pathlib import Path

from istio_agent.capture.flags import ISTIO_IPTABLES
from istio_agent.cli.pilot_agent_flags import PILOT_AGENT
from istio_agent.cni.install.flags import INSTALL_CNI
from istio_agent.cni.plugin.variables import ISTIO_CNI
from istio_agent.config.reference import write_pages

DOCS_DIR = Path("docs/reference")
PROGRAMS = (PILOT_AGENT, ISTIO_IPTABLES, ISTIO_CNI, INSTALL_CNI)


def main(argv: list[str] | None = None) -> int:
    for path in write_pages(PROGRAMS, Path(argv[0]) if argv else DOCS_DIR):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
