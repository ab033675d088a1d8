"""The live view in a real terminal: `istiod-local up` of the default mesh in tmux, read with capture-pane.

What issue 14 asks to be shown: every pod ready with its identity, non-zero request rates from the
Envoys' own stats, istiod-local's line, and a replica change in the mesh file showing up in the view
(the time it took is printed, not asserted). Ctrl-C then ends the run, which removes everything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from needs import need_file, need_root, need_tool
from support import ISTIOD_LOCAL, ROOT, poll

MESH = ROOT / "examples" / "mesh.yaml"
# (namespace, pod, service account) of the default mesh's pods with an agent.
MESHED = [("default", "sleep-1", "sleep"), ("default", "frontend-1", "frontend"),
          ("default", "reviews-v1-1", "reviews"), ("default", "reviews-v2-1", "reviews"),
          ("secure", "ratings-1", "ratings"), ("secure", "tcp-echo-1", "tcp-echo"),
          ("default", "greeter-1", "greeter"), ("default", "greeter-client-1", "greeter-client")]
HTTP_SERVICES = ("frontend.default", "reviews.default", "ratings.secure", "legacy.example.internal")
NODE_LINE = re.compile(r"node (ia-\S+-node):")


class Terminal:
    """A private tmux server (its own socket) running one command in a 220x80 window."""

    def __init__(self, directory: Path) -> None:
        self.socket = directory / "tmux.sock"
        self.name = f"meshview-{os.getpid()}"

    def tmux(self, *args: str) -> str:
        # The server's sessions inherit its environment: COLUMNS/LINES from the test run (pytest's 80x24)
        # would override the window's real size in every program that honours them, rich included.
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        done = subprocess.run(["tmux", "-S", str(self.socket), *args], capture_output=True, text=True, timeout=20,
                              env=env)
        assert done.returncode == 0, f"tmux {' '.join(args)}: {done.stderr}"
        return done.stdout

    def start(self, command: str) -> None:
        self.tmux("new-session", "-d", "-s", self.name, "-x", "220", "-y", "80", command)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.name)

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", self.name, *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-S", str(self.socket), "kill-server"], capture_output=True, timeout=20)


def rows(screen: str) -> dict[str, list[str]]:
    """Table rows by their first cell (`default/sleep-1`, `frontend.default`)."""
    out = {}
    for line in screen.splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            out[cells[0]] = cells
    return out


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    need_root()
    need_tool("tmux")
    need_file(ISTIOD_LOCAL)
    term = Terminal(tmp_path)
    yield term
    term.close()


def test_the_live_view_of_the_default_mesh(terminal: Terminal, tmp_path: Path) -> None:
    mesh = tmp_path / "mesh.yaml"
    mesh.write_text(MESH.read_text())
    shutil.copytree(MESH.parent / "wasm", tmp_path / "wasm")  # the files the mesh names, beside it
    exit_file, err = tmp_path / "exit", tmp_path / "up.err"
    terminal.start(f"cd {ROOT} && {ISTIOD_LOCAL} up {mesh} --dir {tmp_path / 'run'} 2>{err}; "
                   f"echo $? > {exit_file}; sleep 600")

    def context() -> str:
        errors = err.read_text()[-3000:] if err.exists() else ""
        return f"screen:\n{terminal.screen()}\nstderr:\n{errors}"

    def all_ready() -> dict[str, list[str]] | None:
        if exit_file.exists():
            raise AssertionError(f"istiod-local up exited early\n{context()}")
        table = rows(terminal.screen())
        pods_ready = all(f"{ns}/{pod}" in table and "ready" in table[f"{ns}/{pod}"] for ns, pod, _ in MESHED)
        traffic = all(s in table and float(table[s][1]) > 0 for s in HTTP_SERVICES)
        return table if pods_ready and traffic else None

    table = poll(all_ready, "every pod ready and traffic on every HTTP service in the view", 240, context,
                 interval=1.0)
    screen = terminal.screen()
    print(screen)
    for ns, pod, account in MESHED:
        assert f"spiffe://cluster.local/ns/{ns}/sa/{account}" in table[f"{ns}/{pod}"], table[f"{ns}/{pod}"]
    assert table["default/legacy-1"][2] == "none" and table["default/legacy-1"][3] == "-"
    sidecar = table["default/sleep-1"]
    assert sidecar[3] == "istio-agent", sidecar  # whose agent: ours (the mesh's default)
    assert re.search(r"CDS \d+/0", sidecar[8]) and sidecar[5].endswith("h"), sidecar
    tcp = table["tcp-echo.secure"]
    assert float(tcp[5]) > 0, tcp  # connections per second
    assert re.search(r"istiod-local: [89] proxies connected, mesh version \d+", screen), screen
    match = next((m for m in map(NODE_LINE.search, screen.splitlines()) if m), None)
    assert match is not None, screen
    node_netns = match.group(1)

    document = yaml.safe_load(mesh.read_text())
    (reviews_v2,) = [d for d in document["deployments"] if d["name"] == "reviews-v2"]
    reviews_v2["replicas"] = 2
    partial = mesh.with_name(".mesh.yaml.partial")
    partial.write_text(yaml.safe_dump(document, sort_keys=False))
    edited = time.monotonic()
    partial.replace(mesh)
    poll(lambda: "default/reviews-v2-2" in rows(terminal.screen()), "the new replica in the view", 60, context,
         interval=0.2)
    print(f"replica change shown after {time.monotonic() - edited:.1f} s")
    # istiod-local pushed the new endpoints: its line now names a newer mesh version and a last push.
    poll(lambda: re.search(r"mesh version \d+, \d+ pushes \(0 rejected\), last push \d+s ago", terminal.screen()),
         "istiod-local's push in the view", 30, context, interval=0.5)
    poll(lambda: "ready" in rows(terminal.screen()).get("default/reviews-v2-2", []), "the new replica ready", 120,
         context, interval=1.0)

    terminal.keys("C-c")
    poll(exit_file.exists, "istiod-local up to exit after Ctrl-C", 180, context, interval=0.5)
    assert exit_file.read_text().strip() == "0", context()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert node_netns not in namespaces
