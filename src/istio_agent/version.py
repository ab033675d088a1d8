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


# Upstream's BuildInfo as `version --output json|yaml` marshals it (its json tags), in its field order.
_JSON_KEYS = {"Version": "version", "GitRevision": "revision", "GolangVersion": "golang_version",
              "BuildStatus": "status", "GitTag": "tag"}


class VersionOutputError(ValueError):
    """`--output` other than '', yaml or json (upstream's message)."""


def long_form(info: dict[str, str]) -> str:
    """Go's `%#v` of the BuildInfo struct (upstream's LongForm)."""
    import json

    return "version.BuildInfo{" + ", ".join(f"{key}:{json.dumps(value)}" for key, value in info.items()) + "}"


def version_output(short: bool = False, output: str = "") -> str:
    """What upstream's `version` subcommand (istio's version.CobraCommand) prints for this build, newline
    included: `client version: <long form>` (with `--short`, the bare version), or the `clientVersion` object
    as indented JSON or as YAML (keys sorted, as sigs.k8s.io/yaml writes them, then Println's blank line)."""
    if output not in ("", "yaml", "json"):
        raise VersionOutputError("--output must be 'yaml' or 'json'")
    info = build_info()
    if output == "json":
        import json

        tagged = {_JSON_KEYS[key]: value for key, value in info.items()}
        return json.dumps({"clientVersion": tagged}, indent=2) + "\n"
    if output == "yaml":
        import json

        def scalar(value: str) -> str:
            plain = value and value.strip() == value and not any(c in value for c in ":#{}[],&*!|>'\"%@`")
            return value if plain else json.dumps(value)

        lines = sorted(f"  {_JSON_KEYS[key]}: {scalar(value)}\n" for key, value in info.items())
        return "clientVersion:\n" + "".join(lines) + "\n"
    return f"client version: {info['Version'] if short else long_form(info)}\n"
