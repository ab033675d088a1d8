"""The two ways a module arrives: an HTTP(S) download with upstream's retries, and an OCI registry pull.

`HttpFetcher` retries a download that failed to connect or got a retryable 5xx, with an exponential backoff
from 500 ms, up to WASM_HTTP_REQUEST_MAX_RETRIES attempts of WASM_HTTP_REQUEST_TIMEOUT each (upstream's
HTTPFetcher); the whole fetch is bounded by the caller. `ImageFetcher` speaks the registry API (distribution
v2 / OCI): the manifest by tag or digest (an index resolved to linux/amd64), anonymous or with the pull
secret's credentials (Basic, or a Bearer token from the realm the registry names, checked first), then the
module's layer, verified against its digest. `prepare()` returns the manifest digest before any layer is
read, so that a checksum mismatch costs no download (as upstream). A registry answering https in plain HTTP
is asked again over http (as upstream); WASM_INSECURE_REGISTRIES lifts TLS verification for its hosts.

Why not an OCI client library: `oras` (PyPI) is synchronous on requests and jsonschema, whose imports would
cost every agent memory for a fetch most never make; a pull is two or three GETs over `guarded_http`, which the
SSRF guard needs anyway.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from istio_agent.wasm.core import oci
from istio_agent.wasm.core.oci import Credentials, ImageError, Reference
from istio_agent.wasm.core.ssrf import realm_problem
from istio_agent.wasm.core.unbox import plugin_from_tar_gz, unbox
from istio_agent.wasm.guarded_http import Answer, BlockedAddress, FetchError, GuardedHttp, PlainHttpServer

log = logging.getLogger(__name__)
Sleep = Callable[[float], Awaitable[None]]
INITIAL_BACKOFF = 0.5
MAX_BACKOFF = 30.0
MANIFEST_LIMIT = 4 * 1024 * 1024  # go-containerregistry's cap on a manifest
_LOCAL_REGISTRIES = ("localhost", "127.0.0.1", "::1")


def retryable(status: int) -> bool:
    """5xx but those that will not change on a retry (upstream's rule)."""
    return status >= 500 and status not in (501, 505, 511)


class HttpFetcher:
    """An HTTP(S) module download with retries; the body unwrapped from gzip/tar when it is wrapped."""

    def __init__(self, http: GuardedHttp, sleep: Sleep, request_timeout: float, max_retries: int) -> None:
        self.http, self.sleep = http, sleep
        self.request_timeout, self.max_retries = request_timeout, max(1, max_retries)

    async def fetch(self, url: str, limit: int) -> bytes:
        backoff, attempts, last = INITIAL_BACKOFF, 0, ""
        while attempts < self.max_retries:
            attempts += 1
            try:
                answer = await self.http.get(url, limit=limit, timeout=self.request_timeout)
            except (FetchError, TimeoutError) as exc:
                if isinstance(exc, BlockedAddress):
                    raise  # the address will not change on a retry
                last = str(exc) or "timeout"
            else:
                if answer.status == 200:
                    return unbox(answer.body, limit)
                last = f"wasm module download request failed: status code {answer.status}"
                if not retryable(answer.status):
                    break
            if attempts < self.max_retries:
                await self.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
        raise FetchError(f"wasm module download failed after {attempts} attempts, last error: {last}")


@dataclass
class PreparedImage:
    """A resolved image: its manifest digest (the checksum), and `module()` to read the module's layer."""

    digest: str
    module: Callable[[], Awaitable[bytes]]


class ImageFetcher:
    """Pulls a Wasm module from an OCI registry."""

    def __init__(self, http: GuardedHttp, request_timeout: float) -> None:
        self.http = http
        self.request_timeout = request_timeout

    async def prepare(self, reference: str, pull_secret: bytes | None, limit: int) -> PreparedImage:
        ref = oci.parse_reference(reference)
        credentials = oci.pull_secret_credentials(pull_secret, ref.registry) if pull_secret is not None else None
        session = _RegistrySession(self.http, ref, credentials, self.request_timeout)
        answer = await session.get(f"/v2/{ref.repository}/manifests/{ref.identifier}",
                                   {"Accept": oci.MANIFEST_ACCEPT}, MANIFEST_LIMIT)
        manifest, digest = oci.parse_manifest(answer.body), hashlib.sha256(answer.body).hexdigest()
        content_type = answer.header("content-type") or ""
        if oci.is_index(manifest, content_type):
            child = oci.platform_manifest(manifest)
            answer = await session.get(f"/v2/{ref.repository}/manifests/{child}", {"Accept": oci.MANIFEST_ACCEPT},
                                       MANIFEST_LIMIT)
            manifest, digest = oci.parse_manifest(answer.body), hashlib.sha256(answer.body).hexdigest()
            content_type = answer.header("content-type") or ""
        layer = oci.module_layer(manifest, content_type)
        expected = oci.digest_hex(layer.digest)

        async def module() -> bytes:
            if layer.size > limit:
                raise ImageError(f"the module's layer is {layer.size} bytes, over the limit of {limit} bytes "
                                 f"(ISTIO_WASM_MAX_BINARY_SIZE_BYTES)")
            blob = (await session.get(f"/v2/{ref.repository}/blobs/{layer.digest}", {}, limit)).body
            if hashlib.sha256(blob).hexdigest() != expected:
                raise ImageError(f"layer {layer.digest} does not match its digest")
            return plugin_from_tar_gz(blob, limit) if layer.form == "archive" else blob

        return PreparedImage(digest, module)


class _RegistrySession:
    """GETs against one registry, authenticating on its first challenge and keeping the answer's credentials."""

    def __init__(self, http: GuardedHttp, ref: Reference, credentials: Credentials | None, timeout: float) -> None:
        self.http, self.ref, self.credentials, self.timeout = http, ref, credentials, timeout
        local = ref.registry.split(":")[0] in _LOCAL_REGISTRIES or ref.registry.startswith("[::1]")
        self.scheme = "http" if local else "https"
        self.authorization = ""
        if credentials is not None and credentials.registry_token:
            self.authorization = f"Bearer {credentials.registry_token}"

    async def get(self, path: str, headers: dict[str, str], limit: int) -> Answer:
        answer = await self._get(path, headers, limit)
        if answer.status == 401 and not self.authorization:
            await self._authenticate(answer.header("www-authenticate") or "")
            answer = await self._get(path, headers, limit)
        if answer.status != 200:
            raise FetchError(f"GET {self.ref.registry}{path}: status code {answer.status}: "
                             f"{answer.body[:200].decode('utf-8', 'replace').strip()}")
        return answer

    async def _get(self, path: str, headers: dict[str, str], limit: int) -> Answer:
        sent = dict(headers)
        if self.authorization:
            sent["Authorization"] = self.authorization
        url = f"{self.scheme}://{self.ref.registry}{path}"
        try:
            return await self.http.get(url, sent, limit=limit, timeout=self.timeout)
        except PlainHttpServer:
            if self.scheme != "https":
                raise
            log.info("Wasm: fetching image with plain text from %s", self.ref.registry)
            self.scheme = "http"
            return await self.http.get(f"http://{self.ref.registry}{path}", sent, limit=limit, timeout=self.timeout)

    async def _authenticate(self, header: str) -> None:
        challenge = oci.parse_challenge(header)
        if challenge.scheme == "basic":
            if self.credentials is None or not (self.credentials.username or self.credentials.password):
                raise FetchError(f"registry {self.ref.registry} asks for credentials and the plugin has no pull "
                                 "secret for it")
            self.authorization = f"Basic {self.credentials.basic()}"
            return
        if challenge.scheme != "bearer":
            raise FetchError(f"registry {self.ref.registry}: unsupported authentication {challenge.scheme!r}")
        realm = challenge.params.get("realm", "")
        problem = realm_problem(realm)
        if problem is not None:
            raise FetchError(f"rejected unsafe bearer realm: {problem}")
        query = {"scope": f"repository:{self.ref.repository}:pull"}
        if challenge.params.get("service"):
            query["service"] = challenge.params["service"]
        headers = {}
        if self.credentials is not None and (self.credentials.username or self.credentials.password):
            headers["Authorization"] = f"Basic {self.credentials.basic()}"
        separator = "&" if "?" in realm else "?"
        answer = await self.http.get(realm + separator + urlencode(query), headers, limit=MANIFEST_LIMIT,
                                     timeout=self.timeout)
        if answer.status != 200:
            raise FetchError(f"token server {realm}: status code {answer.status}")
        self.authorization = f"Bearer {oci.token_from_response(answer.body)}"
