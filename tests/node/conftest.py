"""The node tier's fixtures: the shared `registry`, `istiod` and `start_agent` (see `fixtures.py`).

The names tests/conftest.py offers are re-exported too, so that a test's old
`from conftest import ...` keeps working here; new code imports them from
`needs` and `support`.
"""

from __future__ import annotations

from fixtures import istiod, registry, start_agent
from needs import need, need_conformance, need_root, need_tool, require_all
from support import CONFORMANCE, ROOT, SHARED, VENV_BIN

__all__ = ["CONFORMANCE", "ROOT", "SHARED", "VENV_BIN", "istiod", "need", "need_conformance", "need_root",
           "need_tool", "registry", "require_all", "start_agent"]
