"""A Wasm module out of what was downloaded: the bytes as they are, or inside gzip and tar, or an image layer.

Nothing here touches a file: an archive's member names are only compared (the base name `plugin.wasm`, as
upstream), never used as paths, so an image whose layer names `../../etc/x` cannot write anywhere; the cache
names its files by digests alone. Every expansion is capped, so a small gzip bomb costs at most the cap.
"""

from __future__ import annotations

import io
import tarfile
import zlib

WASM_MAGIC = b"\x00asm"
_GZIP_MAGIC = b"\x1f\x8b"
_TAR_MAGIC = b"ustar"
PLUGIN_FILE_NAME = "plugin.wasm"  # the module's name inside an image layer (upstream's)
ARCHIVE_OVERHEAD = 64 * 1024  # tar headers and padding beyond the module a capped archive may hold


class ModuleTooLarge(ValueError):
    """A module (or what expands from it) is over the size cap."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"Wasm module is larger than the limit of {limit} bytes (ISTIO_WASM_MAX_BINARY_SIZE_BYTES)")


class LayerError(ValueError):
    """An image layer does not hold a Wasm module where upstream looks for one."""


def is_wasm(data: bytes) -> bool:
    """A Wasm binary starts with its magic and a version: 8 bytes at least (upstream's check)."""
    return len(data) >= 8 and data[:4] == WASM_MAGIC


def gunzip(data: bytes, limit: int) -> bytes:
    """The gzip stream's content, at most `limit` bytes (ModuleTooLarge beyond)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise LayerError(f"not a gzip stream: {exc}") from None
    if len(out) > limit:
        raise ModuleTooLarge(limit)
    return out


def _first_tar_member(data: bytes, limit: int) -> bytes | None:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            member = archive.next()
            if member is None or not member.isfile():
                return None
            if member.size > limit:
                raise ModuleTooLarge(limit)
            stream = archive.extractfile(member)
            return stream.read() if stream is not None else None
    except tarfile.TarError:
        return None


def unbox(data: bytes, limit: int) -> bytes:
    """An HTTP download as a module: gzip and tar wrappers taken off (the tar's first file) while it is not one.

    Upstream's rule: whatever cannot be unwrapped is returned as it came, and the caller's Wasm check refuses it.
    """
    current = data
    for _ in range(8):  # nesting deeper than a tar.gz of a tar.gz is not a module
        if is_wasm(current):
            return current
        if current[:2] == _GZIP_MAGIC:
            try:
                current = gunzip(current, limit + ARCHIVE_OVERHEAD)
            except LayerError:
                return data
        elif len(current) > 262 and current[257:262] == _TAR_MAGIC:
            member = _first_tar_member(current, limit)
            if member is None:
                return data
            current = member
        else:
            return data
    return data


def plugin_from_tar_gz(layer: bytes, limit: int) -> bytes:
    """The `plugin.wasm` file of a Docker or OCI image layer (a gzip'd tar), wherever it sits in the archive."""
    content = gunzip(layer, limit + ARCHIVE_OVERHEAD)
    try:
        with tarfile.open(fileobj=io.BytesIO(content), mode="r:") as archive:
            for member in archive:
                if member.name.rsplit("/", 1)[-1] != PLUGIN_FILE_NAME:
                    continue
                if not member.isfile():
                    raise LayerError(f"{PLUGIN_FILE_NAME} in the image layer is not a regular file")
                if member.size > limit:
                    raise ModuleTooLarge(limit)
                stream = archive.extractfile(member)
                if stream is None:
                    break
                return stream.read()
    except tarfile.TarError as exc:
        raise LayerError(f"failed to parse layer as tar.gz: {exc}") from None
    raise LayerError(f"{PLUGIN_FILE_NAME} not found in the archive")


__all__ = ["LayerError", "ModuleTooLarge", "gunzip", "is_wasm", "plugin_from_tar_gz", "unbox"]
