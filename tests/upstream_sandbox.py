"""Long-lived namespaces for one side of a differential test: a holder process in a new network namespace (and,
for commands with fixed paths, a new mount namespace under a private root), which every case's command joins
with `nsenter`.

Why a holder: a new namespace per case costs a process tree and its set-up each time, which multiplies by the
hundreds of cases a differential runs; the holder is set up once per test and each case only `nsenter`s it.

Why a private root: a command such as install-cni writes to fixed paths (`/host/opt/cni/bin`) that must be the
test's scratch directories. A mount point on the host's real path would be shared with whatever else on the
machine creates or removes that path (the local node's upstream install-cni does, on release), and removing a
directory detaches the mounts on it in every namespace. So the holder builds its root on a tmpfs: every
directory of the host's root bound at its own name (`/dev`, `/proc`, `/sys` with their submounts, the others
without: nothing of the holder's own tmpfs shows through `/tmp`), top-level symlinks copied, and `private`
directories (e.g. `/opt`, `/run`, `/host`) fresh tmpfs that the host never sees; `setup` then makes the scratch
layout inside (with `$NEW` the new root and `$TOP` the holder's directory on the host, both readable there).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from needs import need_root, need_tool
from upstream_peers import base_env

READY = "sandbox ready"
HOLDER = """set -e
ip link set lo up
if [ -n "$ADDRESSES" ]; then
  ip link add eth0 type veth peer name eth0-peer
  ip link set eth0 up
  for address in $ADDRESSES; do
    case "$address" in *:*) ip addr add "$address" dev eth0 nodad;; *) ip addr add "$address" dev eth0;; esac
  done
fi
if [ -n "$PRIVATE_ROOT" ]; then
  NEW="$TOP/root"
  mkdir -p "$NEW"
  mount -t tmpfs -o mode=0755 sandbox-root "$NEW"
  for entry in /*; do
    name="${entry#/}"
    case " $PRIVATE " in *" $name "*) continue;; esac
    if [ -L "$entry" ]; then ln -s "$(readlink "$entry")" "$NEW/$name"
    elif [ -d "$entry" ]; then
      mkdir "$NEW/$name"
      case "$name" in dev|proc|sys) mount --rbind "$entry" "$NEW/$name";; *) mount --bind "$entry" "$NEW/$name";; esac
    fi
  done
  for name in $PRIVATE; do mkdir "$NEW/$name" && mount -t tmpfs -o mode=0755 "sandbox-$name" "$NEW/$name"; done
  export NEW
  eval "$SETUP"
  cd /
  exec chroot "$NEW" sh -c 'echo "$READY"; exec sleep infinity'
fi
echo "$READY"
exec sleep infinity
"""


class Sandbox:
    """A holder process in its own network namespace (loopback up; with `addresses`, an interface holding them:
    a veth pair, both ends inside) and, with `private`, mount namespace under a private root where those
    top-level directories are empty tmpfs and `setup` (shell) built the rest.

    Ready once the holder runs under the new root: its READY line comes from there.

    `popen` runs a command inside: `nsenter` into the holder's namespaces (and root), the command `exec`ed, so
    the returned process is the command itself (a signal reaches it, its exit code is its own).
    """

    def __init__(self, top: Path, private: tuple[str, ...] = (), setup: str = "",
                 addresses: tuple[str, ...] = ()) -> None:
        self.top = top
        self.private = private
        self.setup = setup
        self.addresses = addresses
        self.nsenter = need_tool("nsenter")
        self.holder: subprocess.Popen[str] | None = None

    def __enter__(self) -> Sandbox:
        need_root()
        need_tool("unshare")
        self.top.mkdir(parents=True, exist_ok=True)
        argv = ["unshare", "--net", *(["--mount", "--propagation", "private"] if self.private else []),
                "sh", "-c", HOLDER]
        env = base_env({"TOP": str(self.top), "PRIVATE": " ".join(self.private), "SETUP": self.setup,
                        "PRIVATE_ROOT": "1" if self.private else "", "READY": READY,
                        "ADDRESSES": " ".join(self.addresses)})
        self.holder = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.holder.stdout is not None
        line = self.holder.stdout.readline().strip()
        if line != READY:
            self.__exit__()
            raise RuntimeError(f"the sandbox in {self.top} did not come up: {line!r}; "
                               f"{self.holder.stderr.read() if self.holder.stderr else ''}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.holder is not None and self.holder.poll() is None:
            self.holder.send_signal(signal.SIGKILL)
            self.holder.wait()

    @property
    def pid(self) -> int:
        assert self.holder is not None
        return self.holder.pid

    @property
    def netns(self) -> str:
        """The holder's network namespace, for `upstream_peers.in_netns`."""
        return f"/proc/{self.pid}/ns/net"

    def alive(self) -> bool:
        return self.holder is not None and self.holder.poll() is None

    def inside(self, path: str) -> Path:
        """A path of the sandbox's root as the host reaches it (through the holder's /proc entry)."""
        return Path(f"/proc/{self.pid}/root") / path.lstrip("/")

    def argv(self, argv: list[str], cwd: Path | None = None) -> list[str]:
        enter = [self.nsenter, f"--target={self.pid}", "--net"]
        if self.private:
            assert cwd is None, "a command under the private root starts in its / (nsenter opens a --wd=DIR "\
                "before it enters)"
            enter += ["--mount", "--root", "--wd"]
        return [*enter, "--", *argv]

    def popen(self, argv: list[str], env: dict[str, str], cwd: Path | None = None, **kwargs: object
              ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv(argv, cwd), env=env, cwd=None if self.private else cwd,
                                **kwargs)  # type: ignore[call-overload]

    def run(self, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(argv, cwd), env=env if env is not None else base_env(),
                              cwd=None if self.private else cwd, capture_output=True, text=True, timeout=timeout,
                              check=False)


@contextlib.contextmanager
def sandbox(top: Path, private: tuple[str, ...] = (), setup: str = "", addresses: tuple[str, ...] = ()
            ) -> Iterator[Sandbox]:
    with Sandbox(top, private, setup, addresses) as box:
        yield box


def same_directory(a: Path, b: Path) -> bool:
    """Whether two paths are the same directory (a bind mount's two names): device and inode."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)
