"""Shared host mount points: created when missing, removed by the last live user, never when pre-existing."""

from __future__ import annotations

from pathlib import Path

from istiod_local.node.mountpoints import MountPoints, missing_ancestors


def _points(root: Path, owner: str, alive: set[int]) -> MountPoints:
    targets = [str(root / "etc/istio/proxy"), str(root / "etc/istio/pod"), str(root / "var/lib/istio/data")]
    return MountPoints(targets, owner, state_dir=root / "state", lock_path=root, is_alive=lambda pid: pid in alive)


def test_missing_ancestors_outermost_first(tmp_path: Path) -> None:
    assert missing_ancestors(tmp_path / "a/b/c") == [tmp_path / "a", tmp_path / "a/b", tmp_path / "a/b/c"]
    assert missing_ancestors(tmp_path) == []


def test_last_user_removes_what_was_created_and_keeps_what_existed(tmp_path: Path) -> None:
    (tmp_path / "var/lib").mkdir(parents=True)  # existed before: must stay
    alive = {1, 2}
    first, second = _points(tmp_path, "1-0", alive), _points(tmp_path, "2-0", alive)
    first.acquire()
    second.acquire()
    assert (tmp_path / "etc/istio/proxy").is_dir() and (tmp_path / "var/lib/istio/data").is_dir()
    assert first.release() == []  # the second user still needs them
    assert (tmp_path / "etc/istio/proxy").is_dir()
    removed = second.release()
    assert str(tmp_path / "etc") in removed
    assert not (tmp_path / "etc").exists() and not (tmp_path / "var/lib/istio").exists()
    assert (tmp_path / "var/lib").is_dir()
    assert not (tmp_path / "state").exists()


def test_dead_users_do_not_hold_the_mount_points(tmp_path: Path) -> None:
    alive = {1, 2}
    crashed = _points(tmp_path, "2-0", alive)
    crashed.acquire()  # then its process dies without release()
    alive.discard(2)
    survivor = _points(tmp_path, "1-0", alive)
    survivor.acquire()
    survivor.release()
    assert not (tmp_path / "etc").exists() and not (tmp_path / "state").exists()


def test_a_non_empty_directory_is_left_alone(tmp_path: Path) -> None:
    points = _points(tmp_path, "1-0", {1})
    points.acquire()
    (tmp_path / "etc/istio/pod/keep").write_text("someone else's file")
    points.release()
    assert (tmp_path / "etc/istio/pod/keep").exists()
    assert not (tmp_path / "etc/istio/proxy").exists()


def test_release_without_acquire_does_nothing(tmp_path: Path) -> None:
    assert _points(tmp_path, "1-0", {1}).release() == []
    assert not (tmp_path / "state").exists()
