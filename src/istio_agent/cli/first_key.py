"""`pilot-agent proxy`'s first workload key, started before the agent's modules load (`security/key_ahead.py`).

The key's kind is read here from the container's environment, by the registry's
own declarations, before the options are resolved: resolving them needs the
agent's imports, the very time the key is to be made in. It is only a guess:
the secret cache takes the key only if it is what the resolved options ask for
(ProxyConfig's proxyMetadata, for one, can still change the algorithm), so a
wrong guess costs the head start and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from istio_agent.config import env
from istio_agent.config.errors import ConfigError
from istio_agent.security.key_ahead import KeyAhead, KeySpec
from istio_agent.security.options import KEY_FILE, MOUNTED_CERTS_DIR, WORKLOAD_CREDENTIALS_DIR


def first_key_spec(environ: Mapping[str, str], workdir: Path) -> KeySpec | None:
    """The key the first CSR will most likely want; None when there will be no CSR or the settings are invalid.

    Mounted workload keys (FILE_MOUNTED_CERTS, a key in ./etc/certs or the workload-spiffe-credentials) mean no
    CA and no CSR: no key is made for nothing. Invalid settings are left for the resolver to report.
    """
    environment = env.Environment(environ)
    try:
        if environment.get(env.FILE_MOUNTED_CERTS):
            return None
        algorithm = environment.get(env.ECC_SIGNATURE_ALGORITHM).strip().upper()
        curve = environment.get(env.ECC_CURVE).strip().upper() or "P256"
        rsa_bits = environment.get(env.WORKLOAD_RSA_KEY_SIZE)
    except ConfigError:
        return None
    if any((workdir / folder / KEY_FILE).exists() for folder in (MOUNTED_CERTS_DIR, WORKLOAD_CREDENTIALS_DIR)):
        return None
    if algorithm == "ECDSA":
        return KeySpec.ecdsa(curve) if curve in ("P256", "P384") else None
    if algorithm == "" and 2048 <= rsa_bits <= 8192:
        return KeySpec.rsa(rsa_bits)
    return None


def start_first_key(environ: Mapping[str, str], workdir: Path | None = None) -> KeyAhead | None:
    """Start making the first workload key on a daemon thread; None when no key is wanted."""
    spec = first_key_spec(environ, workdir or Path.cwd())
    return KeyAhead(spec).start() if spec is not None else None
