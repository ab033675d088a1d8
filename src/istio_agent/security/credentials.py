"""The bearer token the agent sends to the CA and to istiod (upstream's credential fetchers).

`JWT` (the default): the pod's token file, re-read at every call because Kubernetes
rotates it; no file, or an empty one, sends no authorization header, with a warning
(upstream's rule). `GoogleComputeEngine` (`CREDENTIAL_FETCHER_TYPE`): at every call,
the VM's identity token from the GCE metadata server
(`computeMetadata/v1/instance/service-accounts/default/identity?audience=<trust
domain>&format=full`, `Metadata-Flavor: Google`), written to the token file (0640,
replaced whole) for whoever else reads it, then sent. When the server does not
give one, the call fails (`CredentialError`), as upstream's does. Upstream's
fetcher also refreshes the file every 5 minutes when the token nears its expiry;
here every call asks anew, so the agent's own calls never send a stale one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from pathlib import Path
from urllib.parse import quote

from istio_agent.config.cloud_metadata import IDENTITY_TOKEN_PATH, gcp_request
from istio_agent.security.options import GCE_FETCHER, CredentialSource

log = logging.getLogger(__name__)

TOKEN_FILE_MODE = 0o640
GCE_TOKEN_TIMEOUT = 5.0  # one identity token request, retries of slow answers included


class CredentialError(Exception):
    """The platform credential could not be had: the call that needed it fails."""


def read_token(path: Path) -> str | None:
    """The bearer token in `path`, None (no authorization header, as upstream) when it is missing or empty.

    Upstream warns on every call that finds no token; so does this, naming the path tried.
    """
    try:
        token = path.read_text().strip()
    except OSError as exc:
        log.warning("no bearer token sent: cannot read token file %s: %s", path, exc.strerror or exc)
        return None
    if not token:
        log.warning("no bearer token sent: token file %s is empty", path)
    return token or None


async def bearer_token(source: CredentialSource, token_path: Path) -> str | None:
    """The token to send with one call to the CA or istiod; CredentialError when the platform gives none."""
    if source.fetcher != GCE_FETCHER:
        return read_token(token_path)
    return await gce_identity_token(source, token_path)


async def gce_identity_token(source: CredentialSource, token_path: Path) -> str:
    """The VM's identity token for `source.audience`, from the GCE metadata server, also written to `token_path`."""
    from istio_agent.httpio.client import fetch_once

    request = gcp_request(source.metadata_host,
                          f"{IDENTITY_TOKEN_PATH}?audience={quote(source.audience, safe='')}&format=full")
    try:
        async with asyncio.timeout(GCE_TOKEN_TIMEOUT):
            answer = await fetch_once(request.url, request.headers, limit=64 * 1024)
    except (OSError, ConnectionError, ValueError, TimeoutError) as exc:
        raise CredentialError(f"fetch platform credential: GCE metadata server {request.url}: "
                              f"{exc or type(exc).__name__}") from None
    if answer.status != 200:
        raise CredentialError(f"fetch platform credential: GCE metadata server answered {answer.status}: "
                              f"{answer.body[:200].decode(errors='replace')}")
    token = answer.body.decode(errors="replace")
    try:
        _write_token(token_path, token)
    except OSError as exc:
        raise CredentialError(f"fetch platform credential: writing {token_path}: {exc.strerror or exc}") from None
    return token.strip()


def _write_token(path: Path, token: str) -> None:
    """The token file replaced whole (a reader never sees half a token), mode 0640 as upstream's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(token)
        os.chmod(temporary, TOKEN_FILE_MODE)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
