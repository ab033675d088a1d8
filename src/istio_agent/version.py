"""The version this build reports (node metadata ISTIO_VERSION, `pilot-agent version`)."""

from __future__ import annotations

# The Istio release whose behaviour this implementation follows.
ISTIO_COMPAT_VERSION = "1.28.0"


def package_version() -> str:
    # importlib.metadata (with zipfile, csv, email) is ~1 MB an agent never needs: only `pilot-agent version` asks.
    from importlib import metadata

    try:
        return metadata.version("istio-agent")
    except metadata.PackageNotFoundError:
        return "0.0.0-dev"


def build_info() -> dict[str, str]:
    return {
        "Version": ISTIO_COMPAT_VERSION,
        "GitRevision": f"istio-agent-py-{package_version()}",
        "GolangVersion": "none (Python)",
        "BuildStatus": "Clean",
        "GitTag": ISTIO_COMPAT_VERSION,
    }
