"""OCI image references, manifests and credentials, as upstream's image fetcher reads them (no I/O).

Three layouts carry a Wasm module (upstream's imagefetcher.go): a Docker image whose last layer is a gzip'd
tar with `plugin.wasm`; the same as an OCI image (OCI layer media type); and the Wasm OCI artifact, two
layers of which one is the module itself (`application/vnd.module.wasm.content.layer.v1+wasm`). The checksum
of an image is the digest of its manifest (what `WasmPlugin.sha256` names for an `oci://` URL).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

DOCKER_HUB = "index.docker.io"
DOCKER_HUB_AUTH_KEY = "https://index.docker.io/v1/"

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST_ACCEPT = ", ".join((OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_MANIFEST_LIST))

DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
WASM_LAYER = "application/vnd.module.wasm.content.layer.v1+wasm"

_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
_REPO = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")


class ImageError(ValueError):
    """A reference, manifest or credential that cannot be used."""


@dataclass(frozen=True)
class Reference:
    """`registry/repository` and a tag or a digest (`sha256:...`)."""

    registry: str
    repository: str
    tag: str = "latest"
    digest: str = ""

    @property
    def identifier(self) -> str:
        return self.digest or self.tag

    @property
    def name(self) -> str:
        """The repository's full name, without tag or digest (upstream's module name for an image)."""
        return f"{self.registry}/{self.repository}"


def parse_reference(text: str) -> Reference:
    """An image reference as Docker writes it (`ghcr.io/org/plugin:1.0`, `plugin@sha256:...`, `localhost:5000/x`)."""
    rest, digest = text, ""
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.match(digest):
            raise ImageError(f"invalid digest {digest!r} in image reference {text!r}")
    tag = ""
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1:]
        if not _TAG.match(tag):
            raise ImageError(f"invalid tag {tag!r} in image reference {text!r}")
    first, _, remainder = rest.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, remainder
    else:
        registry, repository = DOCKER_HUB, rest
        if "/" not in repository:
            repository = "library/" + repository
    if registry == "docker.io":
        registry = DOCKER_HUB
    if not _REPO.match(repository):
        raise ImageError(f"invalid repository {repository!r} in image reference {text!r}")
    return Reference(registry, repository, tag or "latest", digest)


def digest_hex(digest: str) -> str:
    """The hex of a `sha256:` digest; ImageError for anything else (the cache names files by it)."""
    match = _DIGEST.match(digest)
    if match is None:
        raise ImageError(f"unsupported digest {digest!r}")
    return match.group(1)


@dataclass(frozen=True)
class Layer:
    """The layer that holds the module, and how: `archive` (a gzip'd tar with plugin.wasm) or `raw` (the module)."""

    digest: str
    media_type: str
    size: int
    form: str


def parse_manifest(data: bytes) -> dict[str, Any]:
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise ImageError(f"manifest is not JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise ImageError("manifest is not a JSON object")
    return manifest


def is_index(manifest: dict[str, Any], content_type: str = "") -> bool:
    media = manifest.get("mediaType") or content_type.split(";")[0].strip()
    return media in (OCI_INDEX, DOCKER_MANIFEST_LIST) or ("manifests" in manifest and "layers" not in manifest)


def platform_manifest(index: dict[str, Any]) -> str:
    """The digest of linux/amd64's manifest in an index (the platform upstream's client picks by default)."""
    for item in index.get("manifests") or []:
        platform = item.get("platform") or {}
        if platform.get("os", "linux") == "linux" and platform.get("architecture", "amd64") == "amd64":
            return str(item.get("digest", ""))
    raise ImageError("the image index has no linux/amd64 manifest")


def _layers(manifest: dict[str, Any]) -> list[Layer]:
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not layers:
        raise ImageError("number of layers must be greater than zero")
    out = []
    for item in layers:
        if not isinstance(item, dict):
            raise ImageError("a layer of the manifest is not an object")
        out.append(Layer(str(item.get("digest", "")), str(item.get("mediaType", "")), int(item.get("size") or 0), ""))
    return out


def module_layer(manifest: dict[str, Any], content_type: str = "") -> Layer:
    """Which layer of `manifest` holds the module, by upstream's three layouts, or ImageError saying why none."""
    layers = _layers(manifest)
    media = manifest.get("mediaType") or content_type.split(";")[0].strip()
    last = layers[-1]
    if media == DOCKER_MANIFEST:
        if last.media_type != DOCKER_LAYER:
            raise ImageError(f"invalid media type {last.media_type} (expect {DOCKER_LAYER})")
        return Layer(last.digest, last.media_type, last.size, "archive")
    if last.media_type == OCI_LAYER:
        return Layer(last.digest, last.media_type, last.size, "archive")
    if len(layers) != 2:
        raise ImageError(f"the image is in invalid format as an OCI image: the last layer is {last.media_type}, not "
                         f"{OCI_LAYER}, and an artifact has 2 layers, not {len(layers)}")
    for layer in layers:
        if layer.media_type == WASM_LAYER:
            return Layer(layer.digest, layer.media_type, layer.size, "raw")
    raise ImageError(f"could not find the layer of type {WASM_LAYER}")


@dataclass(frozen=True)
class Credentials:
    """What a pull secret gives for one registry: a user and password, or a registry token (bearer)."""

    username: str = ""
    password: str = ""
    registry_token: str = ""

    def basic(self) -> str:
        return base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def pull_secret_credentials(secret: bytes, registry: str) -> Credentials | None:
    """The credentials a docker config JSON (the pull secret istiod sends) holds for `registry`; None: anonymous."""
    if secret.strip() == b"null":
        raise ImageError("the image pull secret is null")
    try:
        config = json.loads(secret)
    except ValueError as exc:
        raise ImageError(f"the image pull secret is not a docker config JSON: {exc}") from None
    auths = config.get("auths") if isinstance(config, dict) else None
    if not isinstance(auths, dict):
        return None
    key = DOCKER_HUB_AUTH_KEY if registry == DOCKER_HUB else registry
    entry = auths.get(key)
    if entry is None:  # the docker CLI also accepts the registry written as a URL
        entry = next((v for k, v in auths.items() if re.sub(r"^https?://", "", k).rstrip("/") == key), None)
    if not isinstance(entry, dict):
        return None
    username, password = str(entry.get("username") or ""), str(entry.get("password") or "")
    if entry.get("auth"):
        try:
            username, _, password = base64.b64decode(str(entry["auth"])).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise ImageError(f"the image pull secret's auth for {registry} is not base64 user:password: {exc}"
                             ) from None
    token = str(entry.get("registrytoken") or "")
    if not (username or password or token):
        return None
    return Credentials(username, password, token)


@dataclass(frozen=True)
class Challenge:
    scheme: str  # lower case: "basic" or "bearer"
    params: dict[str, str]


_PARAM = re.compile(r'([A-Za-z_][\w-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))')


def parse_challenge(header: str) -> Challenge:
    """A `WWW-Authenticate` header's first challenge (registries send one)."""
    scheme, _, rest = header.strip().partition(" ")
    params = {m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)) for m in _PARAM.finditer(rest)}
    return Challenge(scheme.lower(), params)


def token_from_response(data: bytes) -> str:
    """The bearer token of a token server's JSON answer (`token`, or OAuth2's `access_token`)."""
    try:
        answer = json.loads(data)
    except ValueError:
        raise ImageError("the token server's answer is not JSON") from None
    token = (answer.get("token") or answer.get("access_token")) if isinstance(answer, dict) else None
    if not token:
        raise ImageError("the token server's answer has no token")
    return str(token)
