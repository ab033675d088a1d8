"""The run lock of `istiod-local up` and the pod-CIDR check made before anything is built."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from istiod_local.mesh.lock import LOCK_NAME, LockedError, RunLock
from istiod_local.mesh.runner import cidr_problem


def test_a_second_holder_is_refused_with_the_owners_pid_and_the_lock_is_free_after_release(tmp_path: Path) -> None:
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    first.acquire()
    assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    with pytest.raises(LockedError, match=rf"already running for this directory \(pid {os.getpid()},"):
        second.acquire()
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    second.acquire()
    second.release()


def test_a_lock_file_nobody_holds_is_taken_over(tmp_path: Path) -> None:
    (tmp_path / LOCK_NAME).write_text("999999\n")  # a killed run's: the kernel dropped its flock
    lock = RunLock(tmp_path)
    lock.acquire()
    assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    lock.release()


def test_the_pod_cidr_must_hold_every_pod() -> None:
    assert cidr_problem(253, "10.244.0.0/24") == ""
    problem = cidr_problem(450, "10.244.0.0/24")
    assert "450 pods" in problem and "holds 253" in problem and "--pod-cidr 10.244.0.0/23" in problem
    assert "--pod-cidr" in cidr_problem(1, "10.244.0.1/24")
