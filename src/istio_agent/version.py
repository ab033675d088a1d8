"""The version this build reports (node metadata ISTIO_VERSION, `pilot-agent version`)."""

from __future__ import annotations

from importlib import metadata

# The Istio release whose behaviour this implementation follows.
ISTIO_COMPAT_VERSION = "1.28.0"


def package_version() -> str:
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
