"""The local node's per-container wrapper for proxyless pods, run by a real `sh` with a stand-in `mount`."""

from __future__ import annotations

import subprocess
from pathlib import Path

from istiod_local.node import proxyless


def test_container_wrapper_binds_then_execs_from_root(tmp_path: Path) -> None:
    argv = proxyless.in_container("ns1", [("/a", "/b")], ["prog", "--x"], gid=1337)
    assert argv[:9] == ["ip", "netns", "exec", "ns1", "unshare", "--mount", "--propagation", "private", "--"]
    tail = argv[argv.index("sh", 9):]
    assert tail[4:8] == ["/a", "/b", "--", "setpriv"] and tail[-3:] == ["--", "prog", "--x"]
    # The script itself, run by a real sh with a stand-in for `mount`: pairs, `--`, then exec from `/`.
    fake = tmp_path / "mount"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/mounts\n")
    fake.chmod(0o755)
    script = proxyless.MOUNT_SCRIPT
    done = subprocess.run(["sh", "-c", script, "sh", "/s1", "/t1", "/s2", "/t2", "--", "sh", "-c", "pwd"],
                          capture_output=True, text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=True)
    assert done.stdout.strip() == "/"
    assert (tmp_path / "mounts").read_text().splitlines() == ["--bind /s1 /t1", "--bind /s2 /t2"]


def test_container_script_stops_when_a_mount_fails(tmp_path: Path) -> None:
    fake = tmp_path / "mount"
    fake.write_text("#!/bin/sh\nexit 32\n")
    fake.chmod(0o755)
    done = subprocess.run(["sh", "-c", proxyless.MOUNT_SCRIPT, "sh", "/s", "/t", "--", "echo", "started"],
                          capture_output=True, text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert done.returncode != 0 and "started" not in done.stdout
