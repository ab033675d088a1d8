"""A reference-only case (`"score": false`) must not affect the result, as the kit's README says.

The whole conformance tier is run again (it takes seconds) against a copy of the kit in which every manifest has
one more case marked `"score": false` that has nothing else: no pod, no golden, no inputs. Each file of the kit
is a symlink to the real one except the manifests, so the copy is the kit plus those cases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from needs import need
from support import CONFORMANCE, ROOT

MANIFESTS = ("cases.json", "manifest.json")
REFERENCE_ONLY = {"name": "reference-only-material", "score": False}


def kit_with_reference_only_cases(target: Path) -> int:
    """A copy of the kit under `target` with a reference-only case added to every manifest; how many added."""
    added = 0
    target.mkdir(parents=True)
    for source in sorted(CONFORMANCE.rglob("*")):
        relative = source.relative_to(CONFORMANCE)
        destination = target / relative
        if source.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
        elif source.name in MANIFESTS:
            manifest = json.loads(source.read_text())
            manifest["cases"] = [*manifest["cases"], REFERENCE_ONLY]
            destination.write_text(json.dumps(manifest, indent=2))
            added += 1
        else:
            destination.symlink_to(source)
    return added


def test_the_tier_passes_with_a_reference_only_case_in_every_kit(tmp_path: Path) -> None:
    need(CONFORMANCE.is_dir(), f"the conformance kit is not at {CONFORMANCE}")
    kit = tmp_path / "kit"
    assert kit_with_reference_only_cases(kit) >= 5
    tier = Path(__file__).resolve().parent
    others = [str(path) for path in sorted(tier.glob("test_*.py")) if path.name != Path(__file__).name]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *others],
                          env={**os.environ, "ISTIO_AGENT_CONFORMANCE_DIR": str(kit)}, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
