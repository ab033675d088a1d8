"""The istio-proxy container on the local node: the agent's user, its image and its volumes.

Istio's injector runs the istio-proxy container as uid/gid 1337 (runAsUser,
runAsGroup; allowPrivilegeEscalation false; capabilities drop ALL): the agent,
and the Envoy it starts, never run as root. The node runs every pod's agent,
sidecar or proxyless, the same way (`plan.as_user`: `setpriv --reuid 1337
--regid 1337 --clear-groups --no-new-privs`, no capabilities, and the death
signal). istio-iptables is not the agent's job: the node runs it as root, as
istio-init or the CNI plugin would. The agent needs no capability: its ports
(15020, 15053, Envoy's 15001/15006/15021/15090) are above 1024, and the
files it writes are in volumes it owns.

Two things a container has and a bare process lacks are rebuilt here.

**Image.** The agent is a Python program: the interpreter, the venv and the
sources are the container's image, and they may sit under a directory uid
1337 cannot enter (pyenv under /root, a checkout in a 0700 home). The agent
then gets its own mount namespace, as a container has, in which each topmost
such directory is covered by a small tmpfs (0711) holding only the path down
to what the interpreter needs, each of those bind-mounted back read-only.
Paths stay the same (the venv's pyvenv.cfg, the scripts' shebang lines, an
editable install's .pth keep working), nothing else under the covered
directory is visible to the agent, and the mounts die with its process:
nothing is mounted on the host. `image_mounts` plans that (pure),
`AgentImage` asks the interpreter what it needs, once per node. When
everything is reachable already there is nothing to mount and no mount
namespace.

**Volumes.** What the agent writes lives in the injected pod's emptyDir
volumes (`WRITABLE_VOLUMES`): `lay_out_pod` makes them 1337:1337 0750 in the
pod directory. Everything else there is root's and read-only for 1337: the
token 0640 with group 1337 (in a pod only the istio-proxy container mounts
it), the root certificate and the downward-API files 0644, directories 0755.
istiod-local's state, the CA key included, stays in the node's work
directory (its state directory is 0700 root), which the agent never needs.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from istiod_local.node.plan import AGENT_GID, AGENT_UID, as_user, in_netns
from istiod_local.node.processes import NodeError
from istiod_local.node.runtime import untraversable_ancestor

# The injected pod's emptyDir volumes the agent (and Envoy) write: bootstrap, XDS socket and gRPC
# bootstrap; SDS socket; workload certificates; OUTPUT_CERTS; the file-credential socket.
WRITABLE_VOLUMES = (
    "etc/istio/proxy",
    "var/lib/istio/data",
    "var/run/secrets/workload-spiffe-uds",
    "var/run/secrets/workload-spiffe-credentials",
    "var/run/secrets/credential-uds",
)
VOLUME_MODE = 0o750
TOKEN = "var/run/secrets/tokens/istio-token"
TOKEN_MODE = 0o640
READ_ONLY_FILE_MODE = 0o644
READ_ONLY_DIR_MODE = 0o755
IMAGE_FS = "ia-image"  # the covering tmpfs' source name, as mountinfo shows it
TRAVERSE_ONLY = "0711"
# What the interpreter reads: its prefixes, its executable's directory and its import path (.pth included).
IMAGE_QUERY = ("import json, os, sys; "
               "print(json.dumps([sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),"
               " *sys.path]))")


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def image_mounts(needed: Iterable[str], stage: str, blocked: Callable[[str], str | None]) -> list[list[str]]:
    """The commands (run as root in the agent's mount namespace) that let uid 1337 reach `needed`.

    `blocked(path)` is the topmost directory above `path` that uid 1337 cannot enter,
    or None. Each such directory is bound to `stage` (so what is under it stays at
    hand), covered by a tmpfs, and given back only the levels down to each needed
    path (0711, enter but not list) with that path bind-mounted read-only from the
    stage; then the stage is unmounted. Paths inside another needed one come along.
    """
    groups: dict[str, list[str]] = {}
    for path in sorted({os.path.normpath(p) for p in needed}):
        top = blocked(path)
        if top is not None:
            groups.setdefault(os.path.normpath(top), []).append(path)
    commands: list[list[str]] = []
    for top, paths in sorted(groups.items()):
        roots = [p for p in paths if not any(q != p and _within(p, q) for q in paths)]
        commands += [["mount", "--bind", top, stage],
                     ["mount", "-t", "tmpfs", "-o", f"mode={TRAVERSE_ONLY},nosuid,nodev,noexec,size=1m", IMAGE_FS,
                      top]]
        made: set[str] = set()
        for root in roots:
            parts = Path(os.path.relpath(root, top)).parts
            for depth in range(1, len(parts) + 1):
                level = os.path.join(top, *parts[:depth])
                if level not in made:
                    made.add(level)
                    commands.append(["mkdir", "-m", TRAVERSE_ONLY, level])
            commands += [["mount", "--bind", os.path.join(stage, *parts), root],
                         ["mount", "-o", "remount,bind,ro,nosuid,nodev", root]]
        commands.append(["umount", stage])
    return commands


def image_script(commands: Sequence[Sequence[str]]) -> str:
    """The commands as one `sh` line; an empty string when there is nothing to mount."""
    return "; ".join(shlex.join(command) for command in commands)


def agent_command(netns: str, image: str, argv: Sequence[str], uid: int = AGENT_UID, gid: int = AGENT_GID,
                  pdeathsig: str = "SIGTERM") -> list[str]:
    """A sidecar's istio-proxy container: the pod's network namespace, `image` mounted, then `argv` as 1337.

    The working directory is left as given (the pod directory). Every step execs,
    so the pid started is the agent's own, as with `plan.in_netns`.
    """
    if not image:
        return in_netns(netns, argv, uid, gid, pdeathsig)
    return ["ip", "netns", "exec", netns, "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", f'set -e; {image}; exec "$@"', "sh", *as_user(uid, gid, pdeathsig), "--", *argv]


def script_interpreter(script: Path) -> str:
    """The interpreter named by `script`'s `#!` line ("" when it has none): what the agent really runs."""
    try:
        with script.open("rb") as handle:
            first = handle.readline(4096)
    except OSError:
        return ""
    words = first[2:].decode(errors="replace").split() if first.startswith(b"#!") else []
    return words[0] if words else ""


def topmost_blocked(path: str) -> str | None:
    """The topmost directory above `path` that other users (uid 1337) cannot enter, if any."""
    found = untraversable_ancestor(Path(path))
    return str(found) if found is not None else None


def unreadable(path: str, root: str) -> str:
    """Why uid 1337 cannot read `path` when it reaches `root` (`path` or a folder above it): "" when it can.

    Levels above `root` are reachable already, or are made so by `image_mounts`.
    """
    here = Path(path)
    for level in [*reversed(here.parents), here]:
        if not _within(str(level), root):
            continue
        try:
            mode = level.stat().st_mode
        except OSError as exc:
            return f"{level}: {exc.strerror}"
        wanted = 0o005 if level == here else 0o001
        if mode & wanted != wanted:
            return f"{level} is mode {mode & 0o777:04o}"
    return ""


class AgentImage:
    """What one node's agents mount to reach their interpreter: asked once, then the same for every pod."""

    def __init__(self, pilot_agent: Path, python: str, stage: Path,
                 environment: Mapping[str, str] | None = None) -> None:
        self.pilot_agent = pilot_agent
        self.python = script_interpreter(pilot_agent) or python
        self.stage = stage
        self.environment = dict(environment or {})
        self._script: str | None = None

    def needed(self) -> list[str]:
        """Existing directories the agent's interpreter reads (a file on the import path counts as its folder)."""
        try:
            done = subprocess.run([self.python, "-c", IMAGE_QUERY], capture_output=True, text=True, timeout=60,
                                  env=self.environment, cwd="/")
            paths = json.loads(done.stdout) if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            raise NodeError(f"asking {self.python} for its paths: {exc}") from None
        if not isinstance(paths, list):
            raise NodeError(f"asking {self.python} for its paths failed: {done.stderr.strip()[-500:]}")
        found = []
        for entry in [*paths, str(self.pilot_agent.parent)]:
            real = os.path.realpath(entry) if entry else ""
            if real and os.path.isfile(real):
                real = os.path.dirname(real)
            if real and os.path.isdir(real):
                found.append(real)
        return sorted(set(found))

    def script(self) -> str:
        """The shell that mounts the image (made once; "" when uid 1337 reaches everything already)."""
        if self._script is None:
            needed = self.needed()
            blocked = {path: topmost_blocked(path) for path in needed}
            for path in needed:
                # A blocked path is bound from the outermost needed folder holding it: check from there down.
                root = min((q for q in needed if blocked[q] and _within(path, q)), key=len) if blocked[path] else path
                problem = unreadable(path, root)
                if problem:
                    raise NodeError(f"uid 1337 (the agent's user) cannot read {path}, which {self.python} needs: "
                                    f"{problem}")
            commands = image_mounts(needed, str(self.stage), topmost_blocked)
            if commands:
                self.stage.mkdir(mode=0o700, exist_ok=True)
            self._script = image_script(commands)
        return self._script


def lay_out_pod(pod_dir: Path, uid: int = AGENT_UID, gid: int = AGENT_GID) -> None:
    """Give the pod directory the injected pod's permissions: the agent's volumes its own, the rest root's.

    Runs after the mounted files are written, before the agent starts.
    """
    for volume in WRITABLE_VOLUMES:
        (pod_dir / volume).mkdir(parents=True, exist_ok=True)
    volumes = {pod_dir / volume for volume in WRITABLE_VOLUMES}
    for folder, subfolders, files in os.walk(pod_dir):
        here = Path(folder)
        if here in volumes:
            os.chown(here, uid, gid)
            here.chmod(VOLUME_MODE)
            subfolders[:] = []  # empty before the agent starts; nothing below to change
            continue
        os.chown(here, 0, 0)
        here.chmod(READ_ONLY_DIR_MODE)
        for name in files:
            path = here / name
            if path.relative_to(pod_dir) == Path(TOKEN):
                os.chown(path, 0, gid)
                path.chmod(TOKEN_MODE)
            else:
                os.chown(path, 0, 0)
                path.chmod(READ_ONLY_FILE_MODE)
