"""`python -m istiod_local.cli.reference [DIR]` (`make docs`): istiod-local's reference page.

`docs/reference/istiod-local.md`, rendered from the program's table
(`cli/flags.py`) by the product's `config/reference.py`; a test keeps it in sync.
"""

from __future__ import annotations

import sys
from pathlib import Path

from istio_agent.config.reference import write_pages
from istiod_local.cli.flags import ISTIOD_LOCAL

DOCS_DIR = Path("docs/reference")
PROGRAMS = (ISTIOD_LOCAL,)


def main(argv: list[str] | None = None) -> int:
    for path in write_pages(PROGRAMS, Path(argv[0]) if argv else DOCS_DIR):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
