"""The upstream tier: upstream Istio's own Go commands (built by `make setup` at the pinned version, see
`upstream_peers.py`) as the oracle of differential tests over generated inputs.

The prerequisite checks are in `needs` and `upstream_peers`; the names tests/conftest.py offers are
re-exported here as the other tiers do.
"""

from __future__ import annotations

from needs import need, need_conformance, need_root, need_tool, require_all
from support import CONFORMANCE, ROOT, SHARED, VENV_BIN

__all__ = ["CONFORMANCE", "ROOT", "SHARED", "VENV_BIN", "need", "need_conformance", "need_root", "need_tool",
           "require_all"]
