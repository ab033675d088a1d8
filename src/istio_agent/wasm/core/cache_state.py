"""The Wasm cache's bookkeeping, sans-IO: which module a request means, when it is fetched again, what expires.

Upstream's rules (pkg/wasm/cache.go), with time passed in:
- a module is kept under (name, checksum): the name is the URL, or for `oci://` the image's repository without
  tag or digest; the checksum is the module's sha256 (HTTP) or the image's manifest digest (OCI);
- a request without a checksum takes the one last fetched for its URL, unless its pull policy says to fetch
  again: `Always` refetches whenever the WasmPlugin's resource version changed, `IfNotPresent` never does,
  and unset means IfNotPresent except for an `oci://...:latest` image (then Always);
- an entry unused for `module_expiry` is purged, and with it the URLs that pointed at it.
Beyond upstream: the state is saved as JSON beside the modules so that a restarted agent finds them again
(no refetch with IfNotPresent), and the total size is bounded (least recently used entries go first).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from istio_agent.wasm.core.oci import ImageError, parse_reference

OCI_PREFIX = "oci://"
UNSPECIFIED, IF_NOT_PRESENT, ALWAYS = "UNSPECIFIED_POLICY", "IfNotPresent", "Always"
PULL_POLICIES = frozenset({UNSPECIFIED, IF_NOT_PRESENT, ALWAYS})
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
STATE_VERSION = 1


def module_name(url: str) -> str:
    """The name a module is cached under: the URL, or `oci://registry/repository` for an image."""
    if url.startswith(OCI_PREFIX):
        try:
            return OCI_PREFIX + parse_reference(url[len(OCI_PREFIX):]).name
        except ImageError:
            return url
    return url


def ignores_resource_version(pull_policy: str, url: str) -> bool:
    """Whether a cached module serves a request whatever its resource version (upstream's pull-policy rule)."""
    if pull_policy == ALWAYS:
        return False
    if pull_policy == IF_NOT_PRESENT:
        return True
    split = urlsplit(url)
    return split.scheme != "oci" or not split.path.endswith(":latest")


def digest_in_url(url: str) -> str:
    """The sha256 an `oci://...@sha256:<hex>` URL pins, or ""."""
    if not url.startswith(OCI_PREFIX):
        return ""
    try:
        digest = parse_reference(url[len(OCI_PREFIX):]).digest
    except ImageError:
        return ""
    return digest.removeprefix("sha256:")


def module_file(name: str, checksum: str) -> str:
    """A module's path under the cache directory, made of digests only: `<sha256(name)>/<checksum>.wasm`."""
    if not _HEX64.match(checksum):
        raise ValueError(f"not a sha256 checksum: {checksum!r}")
    return f"{hashlib.sha256(name.encode()).hexdigest()}/{checksum}.wasm"


@dataclass(frozen=True)
class FetchRequest:
    """What the cache is asked for one resource (upstream's GetOptions and its URL), read from the ECDS."""

    url: str
    checksum: str
    resource_name: str
    resource_version: str
    pull_policy: str
    pull_secret: bytes | None
    timeout: float
    plugin_name: str


@dataclass(frozen=True)
class CacheKey:
    """One request for a module: where from, which checksum it asks for ("" for any), for which resource."""

    url: str
    checksum: str = ""
    resource_name: str = ""
    resource_version: str = ""

    @property
    def name(self) -> str:
        return module_name(self.url)


@dataclass
class Entry:
    path: str  # relative to the cache directory
    size: int
    last_used: float
    urls: set[str] = field(default_factory=set)


@dataclass
class _UrlChecksum:
    checksum: str
    versions: dict[str, str] = field(default_factory=dict)  # resource name -> resource version last seen


class CacheState:
    """Modules by (name, checksum) and the checksum last fetched per URL; every method takes `now`."""

    def __init__(self) -> None:
        self.modules: dict[tuple[str, str], Entry] = {}
        self.checksums: dict[str, _UrlChecksum] = {}

    def __len__(self) -> int:
        return len(self.modules)

    @property
    def total_size(self) -> int:
        return sum(entry.size for entry in self.modules.values())

    def lookup(self, key: CacheKey, pull_policy: str, now: float) -> tuple[Entry | None, str]:
        """The cached module for `key` (touched), or None; and the checksum to fetch and verify against."""
        checksum = key.checksum or digest_in_url(key.url)
        if not checksum and (known := self.checksums.get(key.url)) is not None:
            if (ignores_resource_version(pull_policy, key.url)
                    or known.versions.get(key.resource_name) == key.resource_version):
                checksum = known.checksum
            known.versions[key.resource_name] = key.resource_version
        entry = self.modules.get((key.name, checksum)) if checksum else None
        if entry is not None:
            entry.last_used = now
            self._remember(key, checksum)
        return entry, checksum

    def find(self, key: CacheKey, checksum: str, now: float) -> Entry | None:
        """The module already cached under `checksum` (learnt by a fetch's manifest), touched, or None."""
        entry = self.modules.get((key.name, checksum))
        if entry is not None:
            entry.last_used = now
            self._remember(key, checksum)
        return entry

    def _remember(self, key: CacheKey, checksum: str) -> bool:
        """Note `checksum` as the URL's latest, except for a URL pinned by digest (upstream's updateChecksum)."""
        if key.url.startswith(OCI_PREFIX) and "@" in key.url:
            return False
        known = self.checksums.setdefault(key.url, _UrlChecksum(checksum))
        known.checksum = checksum
        known.versions[key.resource_name] = key.resource_version
        return True

    def add(self, key: CacheKey, checksum: str, size: int, now: float) -> Entry:
        """A fetched module under (name, checksum); its relative path is `module_file(...)`."""
        remembered = self._remember(key, checksum)
        entry = self.modules.get((key.name, checksum))
        if entry is None:
            entry = self.modules[(key.name, checksum)] = Entry(module_file(key.name, checksum), size, now)
        entry.last_used = now
        if remembered:
            entry.urls.add(key.url)
        return entry

    def remove(self, name: str, checksum: str) -> Entry | None:
        entry = self.modules.pop((name, checksum), None)
        if entry is not None:
            for url in entry.urls:
                self.checksums.pop(url, None)
        return entry

    def expired(self, now: float, expiry: float) -> list[tuple[str, str]]:
        """Modules unused for longer than `expiry` seconds."""
        return [k for k, entry in self.modules.items() if now - entry.last_used > expiry]

    def over_budget(self, max_bytes: int, keep: tuple[str, str] | None = None) -> list[tuple[str, str]]:
        """Least recently used modules to drop so that the rest fit in `max_bytes` (`keep` stays)."""
        total = self.total_size
        victims = []
        for k, entry in sorted(self.modules.items(), key=lambda item: item[1].last_used):
            if total <= max_bytes:
                break
            if k == keep:
                continue
            victims.append(k)
            total -= entry.size
        return victims

    # --- saved between runs -----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "modules": [{"name": name, "checksum": checksum, "path": e.path, "size": e.size,
                         "last_used": e.last_used, "urls": sorted(e.urls)}
                        for (name, checksum), e in self.modules.items()],
            "checksums": {url: {"checksum": c.checksum, "versions": c.versions} for url, c in self.checksums.items()},
        }

    @classmethod
    def from_json(cls, data: Any, sizes: dict[str, int]) -> CacheState:
        """The state saved by `to_json`, keeping only modules whose file is there with its size (`sizes` by path)."""
        state = cls()
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            return state
        for item in data.get("modules") or []:
            try:
                name, checksum = str(item["name"]), str(item["checksum"])
                path = module_file(name, checksum)
                if sizes.get(path) != int(item["size"]):
                    continue
                state.modules[(name, checksum)] = Entry(path, int(item["size"]), float(item["last_used"]),
                                                        {str(u) for u in item.get("urls") or []})
            except (KeyError, TypeError, ValueError):
                continue
        known = {checksum for _, checksum in state.modules}
        for url, item in (data.get("checksums") or {}).items():
            if isinstance(item, dict) and item.get("checksum") in known:
                versions = item.get("versions") or {}
                state.checksums[str(url)] = _UrlChecksum(str(item["checksum"]),
                                                         {str(k): str(v) for k, v in versions.items()})
        return state
