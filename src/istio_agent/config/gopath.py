"""Go's `path.Join` for the paths upstream builds and hands on as built (to Envoy, into a bootstrap).

Upstream joins with `path.Join`, which cleans the result: `./etc/istio/proxy` + `XDS` is `etc/istio/proxy/XDS`,
relative stays relative. Writing the same string matters where it is seen (Envoy's command line, a bootstrap
field), even when both spellings name the same file.
"""

from __future__ import annotations

import os


def go_join(*parts: str) -> str:
    """Go's path.Join: the non-empty parts joined, then cleaned (Clean leaves one leading slash of several)."""
    joined = os.path.normpath(os.path.join(*parts))
    return "/" + joined.lstrip("/") if joined.startswith("//") else joined
