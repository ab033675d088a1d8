"""The istio-proxy container's image and volumes (`node/container.py`): planned, then checked with real mounts.

The plan is pure; the rest runs as root with real `unshare`, `mount` and
`setpriv`, and looks at what uid 1337 can then do (exec, list, write) and at
the host's mount table afterwards, never at our own bookkeeping.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from needs import need_root, need_tool
from support import VENV_BIN

from istiod_local.node.container import (
    IMAGE_FS,
    WRITABLE_VOLUMES,
    AgentImage,
    agent_command,
    image_mounts,
    image_script,
    lay_out_pod,
    script_interpreter,
    unreadable,
)
from istiod_local.node.plan import PROXY_UID, as_user, in_netns

TOOL = "#!/bin/sh\necho ran as $(id -u)\n"


def _blocked_by(*tops: str) -> Callable[[str], str | None]:
    return lambda path: next((top for top in tops if path.startswith(top + "/")), None)


# ---- pure ---------------------------------------------------------------------------------------


def test_only_blocked_paths_are_mounted_each_under_a_tmpfs_over_its_topmost_blocked_directory() -> None:
    needed = ["/root/.pyenv/versions/3.11.7", "/root/.pyenv/versions/3.11.7/lib/python3.11",
              "/root/co/.venv", "/work/main/src", "/home/u/co/src"]
    commands = image_mounts(needed, "/run/stage", _blocked_by("/root", "/home/u"))
    assert commands == [
        ["mount", "--bind", "/home/u", "/run/stage"],
        ["mount", "-t", "tmpfs", "-o", "mode=0711,nosuid,nodev,noexec,size=1m", IMAGE_FS, "/home/u"],
        ["mkdir", "-m", "0711", "/home/u/co"],
        ["mkdir", "-m", "0711", "/home/u/co/src"],
        ["mount", "--bind", "/run/stage/co/src", "/home/u/co/src"],
        ["mount", "-o", "remount,bind,ro,nosuid,nodev", "/home/u/co/src"],
        ["umount", "/run/stage"],
        ["mount", "--bind", "/root", "/run/stage"],
        ["mount", "-t", "tmpfs", "-o", "mode=0711,nosuid,nodev,noexec,size=1m", IMAGE_FS, "/root"],
        ["mkdir", "-m", "0711", "/root/.pyenv"],
        ["mkdir", "-m", "0711", "/root/.pyenv/versions"],
        ["mkdir", "-m", "0711", "/root/.pyenv/versions/3.11.7"],
        ["mount", "--bind", "/run/stage/.pyenv/versions/3.11.7", "/root/.pyenv/versions/3.11.7"],
        ["mount", "-o", "remount,bind,ro,nosuid,nodev", "/root/.pyenv/versions/3.11.7"],
        ["mkdir", "-m", "0711", "/root/co"],          # the 3.11.7 subfolder came along; no mount of its own
        ["mkdir", "-m", "0711", "/root/co/.venv"],
        ["mount", "--bind", "/run/stage/co/.venv", "/root/co/.venv"],
        ["mount", "-o", "remount,bind,ro,nosuid,nodev", "/root/co/.venv"],
        ["umount", "/run/stage"],
    ]
    assert image_mounts(["/work/main/src", "/usr/lib/python3"], "/run/stage", _blocked_by("/root")) == []
    assert image_script([]) == ""
    assert image_script([["mkdir", "-m", "0711", "/home/a b"]]) == "mkdir -m 0711 '/home/a b'"


def test_the_agent_command_is_a_plain_netns_exec_when_nothing_needs_mounting() -> None:
    assert agent_command("ns1", "", ["pilot-agent", "proxy"]) == in_netns("ns1", ["pilot-agent", "proxy"], 1337, 1337)
    argv = agent_command("ns1", "mount --bind /a /b", ["pilot-agent", "proxy"])
    assert argv[:9] == ["ip", "netns", "exec", "ns1", "unshare", "--mount", "--propagation", "private", "--"]
    assert argv[9:12] == ["sh", "-c", 'set -e; mount --bind /a /b; exec "$@"']
    assert argv[12:] == ["sh", *as_user(1337, 1337), "--", "pilot-agent", "proxy"]
    assert {"--no-new-privs", "--bounding-set=-all", "--pdeathsig"} <= set(argv)


def test_the_interpreter_is_the_one_the_scripts_shebang_names(tmp_path: Path) -> None:
    (tmp_path / "agent").write_text("#!/opt/venv/bin/python3 -E\nimport sys\n")
    (tmp_path / "binary").write_bytes(b"\x7fELF...")
    assert script_interpreter(tmp_path / "agent") == "/opt/venv/bin/python3"
    assert script_interpreter(tmp_path / "binary") == script_interpreter(tmp_path / "missing") == ""


# ---- on disk (root) ------------------------------------------------------------------------------


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """A fresh 0700 directory, as a home directory is: uid 1337 cannot enter it. Removed afterwards."""
    need_root()
    for tool in ("setpriv", "unshare", "mount"):
        need_tool(tool)
    path = Path(tempfile.mkdtemp(prefix="ia-private-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _host_mounts(*paths: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if IMAGE_FS in line or any(str(path) in line for path in paths)]


def _as_proxy_user_in_image(script: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """`argv` as the agent would run it: its own mount namespace with `script` applied, then uid 1337."""
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                           f'set -e; {script}; exec "$@"', "sh", *as_user(PROXY_UID, PROXY_UID), "--", *argv],
                          capture_output=True, text=True, timeout=60)


def test_a_tool_under_a_0700_directory_runs_as_1337_and_nothing_else_there_is_visible(private_dir: Path) -> None:
    tree = private_dir / "checkout" / "venv" / "bin"
    tree.mkdir(parents=True)
    (private_dir / "checkout").chmod(0o700)  # a level below the covered one may be closed too
    tool = tree / "tool"
    tool.write_text(TOOL)
    tool.chmod(0o755)
    (private_dir / "secret").write_text("root's")
    stage = private_dir.with_name(private_dir.name + "-stage")
    stage.mkdir(mode=0o700)
    try:
        plain = subprocess.run([*as_user(PROXY_UID, PROXY_UID), "--", str(tool)], capture_output=True, text=True)
        assert "Permission denied" in plain.stderr
        script = image_script(image_mounts([str(tree.parent)], str(stage), lambda p: str(private_dir)))
        done = _as_proxy_user_in_image(script, "sh", "-c", f"{tool}; ls {private_dir}; cat {private_dir}/secret; "
                                       f"touch {tree}/new")
        assert done.stdout.strip() == f"ran as {PROXY_UID}", done
        errors = done.stderr.splitlines()
        assert "Permission denied" in errors[0]  # the covering levels are 0711: enter, never list
        assert "No such file" in errors[1]  # and hold nothing but the path to what is needed
        assert "Read-only file system" in errors[2], errors
        assert not (tree / "new").exists()
        assert _host_mounts(private_dir, stage) == []  # every mount lived in the process's namespace
    finally:
        stage.rmdir()


def test_the_nodes_own_agent_runs_as_1337_through_its_image(tmp_path: Path) -> None:
    need_root()
    for tool in ("setpriv", "unshare", "mount"):
        need_tool(tool)
    stage = tmp_path / "stage"
    image = AgentImage(VENV_BIN / "pilot-agent", str(VENV_BIN / "python"), stage, {"PATH": os.environ["PATH"]})
    needed = image.needed()
    assert str(Path(os.path.realpath(VENV_BIN / "python")).parent) in needed  # the real interpreter's folder
    script = image.script()
    assert bool(script) == stage.is_dir()  # the stage is made only when something is mounted
    done = _as_proxy_user_in_image(script, str(VENV_BIN / "pilot-agent"), "version")
    assert done.returncode == 0 and "version.BuildInfo" in done.stdout, done.stderr
    # The very interpreter root runs, its own library and standard library. (Without the image, setpriv's exec
    # may still start a binary under /root, as it holds its capabilities until execve; the loader, now
    # without them, then falls back to whatever libpython and prefix it finds, e.g. the distribution's.)
    which = [str(VENV_BIN / "python"), "-c", "import sys; print(sys.version, sys.base_prefix)"]
    own = subprocess.run(which, capture_output=True, text=True, check=True).stdout
    assert _as_proxy_user_in_image(script, *which).stdout == own
    assert _host_mounts(stage) == []


def test_a_needed_folder_1337_cannot_read_is_named(private_dir: Path) -> None:
    closed = private_dir / "src"
    closed.mkdir(mode=0o700)
    assert unreadable(str(closed), str(closed)) == f"{closed} is mode 0700"
    inner = closed / "pkg"
    inner.mkdir(mode=0o755)
    assert unreadable(str(inner), str(closed)) == f"{closed} is mode 0700"  # bound from src: src must open
    assert unreadable(str(inner), str(inner)) == ""  # levels above the bound folder are the tmpfs'


def test_the_pod_directory_gives_1337_its_volumes_and_only_read_access_elsewhere(tmp_path: Path) -> None:
    need_root()
    pod = tmp_path / "pod"
    old = os.umask(0o077)  # whatever the node's umask, the layout is the pod's
    try:
        for name, text in (("var/run/secrets/tokens/istio-token", "jwt"), ("var/run/secrets/istio/root-cert.pem", "c"),
                           ("etc/istio/pod/labels", 'app="echo"\n')):
            (pod / name).parent.mkdir(parents=True, exist_ok=True)
            (pod / name).write_text(text)
        lay_out_pod(pod)
    finally:
        os.umask(old)

    def owner_mode(path: str) -> tuple[int, int, int]:
        info = (pod / path).stat()
        return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)

    for volume in WRITABLE_VOLUMES:
        assert owner_mode(volume) == (1337, 1337, 0o750), volume
    assert owner_mode("var/run/secrets/tokens/istio-token") == (0, 1337, 0o640)
    assert owner_mode("var/run/secrets/istio/root-cert.pem") == (0, 0, 0o644)
    assert owner_mode("etc/istio/pod/labels") == (0, 0, 0o644)
    for folder in (".", "etc", "etc/istio", "etc/istio/pod", "var/run/secrets", "var/run/secrets/tokens", "var/lib"):
        assert owner_mode(folder) == (0, 0, 0o755), folder
