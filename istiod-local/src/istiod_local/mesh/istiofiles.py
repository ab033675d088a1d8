"""Reading the Istio config files a mesh file names (`istioConfig:`), and noticing when they change (I/O).

Each entry is a file or a directory, relative to the mesh file's directory
(an absolute path as is). A directory holds every `*.yaml` and `*.yml` file
under it, in name order, as istiod's own `--configDir` walk takes them; other
files are skipped. `files_signature` is what `up` polls once a second
beside the mesh file itself: an edit, a new file or a removed one is an edit
of the mesh.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from istiod_local.controlplane.xds.yamlfields import RegistryError
from istiod_local.mesh.istioconfig import check_unique, parse_resources
from istiod_local.mesh.model import IstioResource, Mesh

SUFFIXES = (".yaml", ".yml")
MAX_FILE_BYTES = 4 * 1024 * 1024


class IstioFilesError(ValueError):
    """An `istioConfig:` entry cannot be read (missing, unreadable, too large) or holds a refused resource."""


def config_files(mesh_file: Path, entries: tuple[str, ...]) -> list[Path]:
    """The files the entries name, in order (a directory's YAML files sorted by path); IstioFilesError for an
    entry that does not exist."""
    base = mesh_file.parent
    out: list[Path] = []
    for entry in entries:
        path = (base / entry) if not Path(entry).is_absolute() else Path(entry)
        if path.is_dir():
            out += sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        elif path.is_file():
            out.append(path)
        else:
            raise IstioFilesError(f"{mesh_file}: istioConfig: {entry!r}: no such file or directory ({path})")
    return list(dict.fromkeys(out))


def files_signature(mesh_file: Path, entries: tuple[str, ...]) -> tuple[tuple[str, int, int, int], ...]:
    """What changes when any named file is edited, added or removed (an unreadable entry: empty)."""
    try:
        files = config_files(mesh_file, entries)
    except IstioFilesError:
        return ()
    out = []
    for path in files:
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.append((str(path), st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


def read_istio_config(mesh_file: Path, mesh: Mesh) -> Mesh:
    """`mesh` with the resources its `istioConfig:` files hold; IstioFilesError naming the file and line."""
    if not mesh.istio_config_paths:
        return mesh
    namespaces = [n.name for n in mesh.namespaces]
    resources: list[IstioResource] = []
    for path in config_files(mesh_file, mesh.istio_config_paths):
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise IstioFilesError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise IstioFilesError(f"{path}: {exc}") from None
        try:
            resources += parse_resources(text, _shown(path, mesh_file), namespaces)
        except RegistryError as exc:
            raise IstioFilesError(str(exc)) from None
    try:
        check_unique(resources)
    except RegistryError as exc:
        raise IstioFilesError(str(exc)) from None
    return dataclasses.replace(mesh, istio_config=tuple(resources))


def _shown(path: Path, mesh_file: Path) -> str:
    """A file as messages name it: relative to the working directory when under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
