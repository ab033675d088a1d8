"""The host's neighbour-table limits for a node's pods (`node/neighbours.py`): raised to fit every pod
holding an entry for every other (twice over), never lowered; written to a directory shaped like
/proc/sys/net/ipv4/neigh/default."""

from __future__ import annotations

from pathlib import Path

from istiod_local.node.neighbours import HARD, SOFT, raise_limits, read_limits, wanted_limits


def test_a_slash_24_node_needs_more_than_the_kernel_default() -> None:
    wanted = wanted_limits(253, {SOFT: 512, HARD: 1024})
    assert wanted == {HARD: 131072, SOFT: 65536}  # 2 * 253 * 254 = 128524, rounded up to a power of two
    assert wanted[HARD] >= 2 * 253 * 254


def test_limits_already_high_enough_are_left_alone_and_never_lowered() -> None:
    assert wanted_limits(253, {SOFT: 100000, HARD: 1 << 20}) == {}
    assert wanted_limits(13, {SOFT: 512, HARD: 1024}) == {}  # a /28 node fits the defaults
    assert wanted_limits(253, {SOFT: 70000, HARD: 100}) == {HARD: 131072}


def _sysctls(tmp_path: Path, soft: int, hard: int) -> Path:
    (tmp_path / "gc_thresh2").write_text(f"{soft}\n")
    (tmp_path / "gc_thresh3").write_text(f"{hard}\n")
    return tmp_path


def test_raise_writes_what_it_raised_and_reads_back(tmp_path: Path) -> None:
    folder = _sysctls(tmp_path, 512, 1024)
    assert raise_limits(253, folder) == {HARD: 131072, SOFT: 65536}
    assert read_limits(folder) == {HARD: 131072, SOFT: 65536}
    assert raise_limits(253, folder) == {}  # a second node of the same size needs nothing more


def test_unwritable_limits_are_skipped(tmp_path: Path) -> None:
    folder = _sysctls(tmp_path, 512, 1024)
    (folder / "gc_thresh3").unlink()
    (folder / "gc_thresh3").mkdir()  # cannot be written (nor read): only the soft limit is raised
    assert raise_limits(253, folder) == {SOFT: 65536}
