"""install-cni against hostile network configs and a writer that races it (issue 23, items 6 and 9).

In-process, on scratch directories (the installer's file edge, its cleanup, its readiness as /readyz answers
it): another writer's newer file written between our read and our write is never overwritten, a file that
keeps changing is left to its writer, cleanup removes the kubeconfig and the binary whatever the config file
became, and /readyz looks at the files as they are.

The real process: a conflist of 100 KB of nested `[`, one over the size limit, and a large one written in
place then replaced by a small newer one: install-cni keeps serving /healthz, never exits, never loses the
other writer's newer file, and cleans up completely on SIGTERM. Nothing here asserts timing; the benchmark
(`benchmarks/bench_cni_attack.py`) measures it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cni_install_peers import CALICO, InstallCni, write_atomically
from support import VENV_BIN, poll

from istio_agent.cni.install import cniconfig, netdir
from istio_agent.cni.install.components import Installation, InstallerLoop
from istio_agent.cni.install.installer import Installer, InstallError
from istio_agent.cni.install.metrics import InstallMetrics
from istio_agent.cni.install.options import InstallOptions
from istio_agent.cni.install.servers import Readiness, health_handler
from istio_agent.kube.access import KubeAccess

NEWER = {**CALICO, "plugins": [*CALICO["plugins"], {"type": "bandwidth", "capabilities": {"bandwidth": True}}]}
NESTED = "[" * 100_000


def types_in(path: Path) -> list[str]:
    return [p["type"] for p in json.loads(path.read_text())["plugins"]]


class Node:
    """Scratch directories and the options install-cni would run with on them (in-process)."""

    def __init__(self, root: Path) -> None:
        self.net_dir, self.bin_dir, self.run_dir, self.sa_dir = (root / n for n in ("net.d", "bin", "run", "sa"))
        for folder in (self.net_dir, self.bin_dir, self.run_dir, self.sa_dir):
            folder.mkdir()
        (self.sa_dir / "token").write_text("token-one")
        (self.sa_dir / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n")
        self.primary = self.net_dir / "10-calico.conflist"
        self.primary.write_text(json.dumps(CALICO, indent=4))
        self.options = InstallOptions(mounted_cni_net_dir=str(self.net_dir), cni_bin_dir=str(self.bin_dir),
                                      cni_agent_run_dir=str(self.run_dir), service_account_dir=str(self.sa_dir))
        self.access = KubeAccess("https://127.0.0.1:6443", str(self.sa_dir / "ca.crt"), str(self.sa_dir / "token"))

    def installer(self) -> Installer:
        return Installer(self.options, VENV_BIN / "istio-cni", self.access)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


@pytest.mark.parametrize("how", ["renamed", "in place"])
def test_a_newer_file_written_during_the_merge_is_never_overwritten(
        node: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, how: str) -> None:
    """The other writer replaces the file after install-cni read it and before it renamed its merge over it: the
    newer file is read and merged again, never replaced by the older content plus our entry."""
    installer = node.installer()
    real_insert = cniconfig.insert_plugin_entry
    raced: list[str] = []

    def insert_while_another_writes(entry: Any, existing_text: str) -> dict[str, Any]:
        if not raced:  # the first merge only: the other writer's newer file lands meanwhile
            raced.append(how)
            if how == "renamed":
                write_atomically(node.primary, json.dumps(NEWER))
            else:
                node.primary.write_text(json.dumps(NEWER))
        return real_insert(entry, existing_text)

    monkeypatch.setattr(cniconfig, "insert_plugin_entry", insert_while_another_writes)
    with caplog.at_level(logging.INFO, "istio_agent.cni.install"):
        assert installer.sync_config() == (True, None)
    assert raced == [how]
    assert types_in(node.primary) == ["calico", "portmap", "bandwidth", "istio-cni"]  # the newer file, merged
    assert "changed while install-cni was merging into it" in caplog.text
    assert not list(node.net_dir.glob("*.tmp.*"))  # the abandoned write left nothing behind


def test_a_file_that_keeps_changing_is_left_to_its_writer(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    installer = node.installer()
    real_insert = cniconfig.insert_plugin_entry
    versions = iter(range(100))

    def insert_while_another_writes(entry: Any, existing_text: str) -> dict[str, Any]:
        write_atomically(node.primary, json.dumps({**NEWER, "name": f"v{next(versions)}"}))
        return real_insert(entry, existing_text)

    monkeypatch.setattr(cniconfig, "insert_plugin_entry", insert_while_another_writes)
    with pytest.raises(InstallError, match="kept changing while install-cni merged into it"):
        installer.sync_config()
    assert json.loads(node.primary.read_text())["name"] == "v2"  # the writer's last word, without our entry
    assert types_in(node.primary) == ["calico", "portmap", "bandwidth"]


@pytest.mark.parametrize("content", ["nested", "oversized"])
def test_cleanup_completes_whatever_the_config_file_became(node: Node, content: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Our merged file replaced by 100 KB of `[` (or by a file past the size limit): cleanup logs why it cannot take
    our entry out of it and still removes the kubeconfig and the binary."""
    installer = node.installer()
    assert installer.install_all().ready
    junk = NESTED if content == "nested" else json.dumps({**CALICO, "pad": "x" * netdir.MAX_CONFIG_BYTES})
    write_atomically(node.primary, junk)
    with caplog.at_level(logging.INFO, "istio_agent.cni.install"):
        installer.cleanup()  # raises nothing
    assert not installer.kubeconfig_path.exists() and list(node.bin_dir.iterdir()) == []
    assert node.primary.read_text() == junk  # not ours to rewrite
    expected = "nested deeper than 128 levels" if content == "nested" else "over install-cni's limit"
    assert f"cleanup of {node.primary} failed" in caplog.text and expected in caplog.text, caplog.text
    assert "Traceback" not in caplog.text


async def test_readyz_reflects_the_entry_as_it_is_now(node: Node) -> None:
    """A writer takes our entry out: /readyz is 503 at once, before the installer loop has put it back (it cannot
    have: the event loop runs neither while the file changes nor while /readyz answers); 200 again once it has."""
    readiness, metrics = Readiness(), InstallMetrics()
    installation = Installation(node.options, VENV_BIN / "istio-cni", node.access)
    loop = InstallerLoop(installation, readiness, metrics)
    readyz = health_handler(readiness)
    await installation.start()
    await loop.start()
    try:
        for _ in range(500):
            if (await readyz("GET", "/readyz", b""))[0] == 200:
                break
            await asyncio.sleep(0.01)
        assert (await readyz("GET", "/readyz", b""))[0] == 200
        write_atomically(node.primary, json.dumps(CALICO))  # the other CNI rewrites its file without our entry
        assert (await readyz("GET", "/readyz", b""))[0] == 503
        for _ in range(500):
            if "istio-cni" in types_in(node.primary) and (await readyz("GET", "/readyz", b""))[0] == 200:
                break
            await asyncio.sleep(0.01)
        assert "istio-cni" in types_in(node.primary) and (await readyz("GET", "/readyz", b""))[0] == 200
        (node.bin_dir / "istio-cni").unlink()  # the executable gone: not ready either
        assert (await readyz("GET", "/readyz", b""))[0] == 503
    finally:
        await loop.stop()
        await installation.stop()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[InstallCni]:
    instance = InstallCni(tmp_path)
    yield instance
    instance.close()


def cleaned_up(agent: InstallCni) -> None:
    """After SIGTERM: install-cni exited 0 and left nothing of its own (kubeconfig, binary, both sockets)."""
    assert agent.terminate() == 0, agent.output()[-3000:]
    assert not agent.kubeconfig.exists() and list(agent.bin_dir.iterdir()) == []
    assert sorted(p.name for p in agent.run_dir.iterdir()) == [], agent.output()[-3000:]
    assert "Traceback" not in agent.output()


def test_a_nested_conflist_neither_crashes_install_cni_nor_stops_its_cleanup(agent: InstallCni) -> None:
    primary = agent.net_dir / "10-calico.conflist"
    primary.write_text(json.dumps(CALICO))
    (agent.net_dir / "05-nested.conflist").write_text(NESTED)  # sorts first: read, refused, skipped
    agent.start()
    poll(agent.ready, "installed into the valid file", 10, agent.output)
    assert agent.has_entry(primary.name)
    write_atomically(primary, NESTED)  # our merged file replaced by junk: nothing valid left to merge into
    poll(lambda: not agent.ready(), "not ready", 10, agent.output)
    poll(lambda: "nested deeper than 128 levels" in agent.output(), "the reason logged", 10, agent.output)
    assert agent.status("/healthz") == 200 and agent.proc is not None and agent.proc.poll() is None
    cleaned_up(agent)
    assert primary.read_text() == NESTED


def test_a_conflist_over_the_size_limit_is_not_read_and_install_cni_keeps_serving(agent: InstallCni) -> None:
    """A valid conflist past the limit sorting first may be what the runtime loads: install-cni waits, not ready,
    naming it, rather than read it whole or merge into a file the runtime would not use."""
    (agent.net_dir / "20-flannel.conflist").write_text(json.dumps({"cniVersion": "0.3.1", "name": "cbr0",
                                                                   "plugins": [{"type": "flannel"}]}))
    big = agent.net_dir / "10-calico.conflist"
    big.write_text(json.dumps({**CALICO, "pad": "x" * (4 * netdir.MAX_CONFIG_BYTES)}))
    agent.start()
    poll(lambda: "over install-cni's limit" in agent.output(), "the oversized file named", 10, agent.output)
    assert not agent.ready() and agent.status("/healthz") == 200
    assert not agent.has_entry("20-flannel.conflist")
    write_atomically(big, json.dumps(CALICO))  # back to a sane size: merged
    poll(agent.ready, "installed", 10, agent.output)
    assert agent.has_entry(big.name)
    cleaned_up(agent)
    assert json.loads(big.read_text()) == CALICO


def newer_with_entry(agent: InstallCni, primary: Path, round_: int) -> bool:
    """The file is this round's newer one (not the large one) and holds our entry."""
    try:
        config = json.loads(primary.read_text())
    except ValueError:
        return False
    return config.get("round") == round_ and "pad" not in config and agent.has_entry(primary.name)


def test_a_large_file_written_in_place_then_replaced_by_a_newer_one_is_never_lost(agent: InstallCni) -> None:
    """Another writer writes a large conflist in place, slowly, then a newer small one by rename 0.3 s later:
    install-cni ends with the newer file plus our entry, never the old content plus our entry (4 rounds)."""
    primary = agent.net_dir / "10-calico.conflist"
    primary.write_text(json.dumps(CALICO))
    agent.start()
    poll(agent.ready, "installed", 10, agent.output)
    for round_ in range(4):
        large = json.dumps({**CALICO, "round": round_, "pad": ["x" * 100] * 50_000})  # ~5 MB
        with primary.open("w") as out:  # in place, in pieces
            for start in range(0, len(large), 1 << 16):
                out.write(large[start:start + (1 << 16)])
                out.flush()
        time.sleep(0.3)  # the other writer's own pace, not a wait for install-cni
        newer = {**NEWER, "round": round_}
        write_atomically(primary, json.dumps(newer))
        poll(functools.partial(newer_with_entry, agent, primary, round_), f"round {round_}: the newer file with our "
             "entry", 20, agent.output)
        assert types_in(primary) == ["calico", "portmap", "bandwidth", "istio-cni"]
    assert agent.status("/healthz") == 200
    cleaned_up(agent)
    assert json.loads(primary.read_text()) == {**NEWER, "round": 3}


def test_healthz_answers_while_a_writer_keeps_taking_our_entry_out(agent: InstallCni) -> None:
    """A writer removing our entry in a loop: install-cni keeps serving, and once the writer stops the entry is
    back and /readyz is 200."""
    primary = agent.net_dir / "10-calico.conflist"
    primary.write_text(json.dumps(CALICO))
    agent.start()
    poll(agent.ready, "installed", 10, agent.output)
    stop = threading.Event()

    def remove_entry() -> None:
        while not stop.is_set():
            write_atomically(primary, json.dumps(CALICO))
            stop.wait(0.005)

    writer = threading.Thread(target=remove_entry)
    writer.start()
    try:
        for _ in range(50):
            assert agent.status("/healthz") == 200
    finally:
        stop.set()
        writer.join(10)
    poll(agent.ready, "ready again once the writer stopped", 10, agent.output)
    assert agent.has_entry(primary.name)
    cleaned_up(agent)
