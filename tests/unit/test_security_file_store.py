"""File-backed secrets in virtual time: what is watched and for how long, hostile files, key generation off-loop.

A watch exists only for a file that loaded and only while the SDS server says
someone subscribes to its name; a file replaced by a FIFO is refused without
stalling anything; the workload key is generated on a daemon thread that a
stop abandons.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
from fakes import FakeSigner
from test_security_cache import in_virtual_time, options, write_pair

from istio_agent.clock import VirtualClock
from istio_agent.pki import keys
from istio_agent.security.cache import SecretCache
from istio_agent.security.core.secrets import SecretError
from istio_agent.security.file_secrets import SecretRefused
from istio_agent.security.peercred import PeerCredentials

ENVOY = PeerCredentials(pid=0, uid=1337, gid=1337)


def test_a_watch_starts_only_once_the_file_loaded(tmp_path: Path) -> None:
    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        write_pair(tmp_path / "a", signer.ca, clock.now())
        write_pair(tmp_path / "b", signer.ca, clock.now())
        cache = SecretCache(options(tmp_path), None, clock=clock)
        await cache.start()
        mismatched = "file-cert:a/cert-chain.pem~b/key.pem"
        cache.retain(mismatched)
        with pytest.raises(SecretError, match="does not match"):
            await cache.get(mismatched)
        cache.retain("file-root:missing.pem")
        with pytest.raises(SecretError, match="cannot read root certificate"):
            await cache.get("file-root:missing.pem")
        assert cache.watched_files() == {}
        good = "file-cert:a/cert-chain.pem~a/key.pem"
        cache.retain(good)
        await cache.get(good)
        assert cache.watched_files() == {tmp_path / "a/cert-chain.pem": {good}, tmp_path / "a/key.pem": {good}}
        await cache.stop()

    in_virtual_time(scenario)


def test_release_drops_the_watch_and_later_changes_are_not_pushed(tmp_path: Path) -> None:
    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        write_pair(tmp_path / "certs", signer.ca, clock.now())
        cache = SecretCache(options(tmp_path), None, clock=clock)
        pushed: list[str] = []
        cache.on_update(pushed.append)
        await cache.start()
        name = "file-root:certs/root-cert.pem"
        cache.retain(name)
        await cache.get(name)
        assert [item.resource_name for item in cache.snapshot()] == [name]
        cache.release(name)
        assert cache.watched_files() == {} and cache.snapshot() == []
        signer.new_root()
        (tmp_path / "certs/root-cert.pem").write_bytes(signer.ca.cert_pem)
        await clock.sleep(10)
        assert pushed == []
        # Served without a subscriber (a one-off read), nothing is watched either.
        await cache.get(name)
        assert cache.watched_files() == {}
        await cache.stop()

    in_virtual_time(scenario)


def test_a_caller_is_refused_a_file_it_could_not_read(tmp_path: Path) -> None:
    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        write_pair(tmp_path / "certs", signer.ca, clock.now())
        cache = SecretCache(options(tmp_path), None, clock=clock)
        name = "file-root:certs/root-cert.pem"
        cache.retain(name)
        # pytest's tmp_path sits under a 0700 directory of the user running the tests
        with pytest.raises(SecretRefused, match=r"refused root certificate .*root-cert.pem: caller pid 0 uid 1337 "
                                                r"gid 1337 may not (search directory|read it)"):
            await cache.get(name, ENVOY)
        assert cache.watched_files() == {}
        assert (await cache.get(name)).root_cert == signer.ca.cert_pem, "the agent itself may read it"
        await cache.stop()

    if os.geteuid() == 1337:
        pytest.skip("runs as uid 1337")
    in_virtual_time(scenario)


def test_a_watched_file_replaced_by_a_fifo_is_refused_and_the_next_good_one_pushed(tmp_path: Path) -> None:
    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        write_pair(tmp_path / "certs", signer.ca, clock.now())
        cache = SecretCache(options(tmp_path), None, clock=clock)
        pushed: list[str] = []
        cache.on_update(pushed.append)
        await cache.start()
        name = "file-root:certs/root-cert.pem"
        cache.retain(name)
        await cache.get(name)
        root = tmp_path / "certs/root-cert.pem"
        root.unlink()
        os.mkfifo(root)  # nobody will ever write to it: opening it for reading would block
        await clock.sleep(5)  # the watcher sees the change and the reload is refused, again and again
        with pytest.raises(SecretError, match="a FIFO, not a regular file"):
            await cache.get(name)
        assert pushed == []
        root.unlink()
        signer.new_root()
        root.write_bytes(signer.ca.cert_pem)
        await clock.sleep(5)
        assert pushed == [name]
        assert (await cache.get(name)).root_cert == signer.ca.cert_pem
        await cache.stop()

    in_virtual_time(scenario)


def test_key_generation_runs_on_a_daemon_thread_that_stop_abandons(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    started = threading.Event()
    release = threading.Event()
    seen: list[bool] = []
    real = keys.generate_key

    def slow_generate(*args: object, **kwargs: object) -> keys.PrivateKey:
        seen.append(threading.current_thread().daemon)
        started.set()
        release.wait(30)  # stands for minutes of RSA prime search
        return real(*args, **kwargs)  # type: ignore[arg-type]

    clock = VirtualClock()
    signer = FakeSigner(clock.now)  # its own root key, made before the slow stand-in is in place
    monkeypatch.setattr(keys, "generate_key", slow_generate)

    async def scenario() -> None:
        cache = SecretCache(options(tmp_path), signer, clock=clock)
        await cache.start()
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
        await cache.stop()  # returns with the key generation still running
        assert not release.is_set() and cache.current_workload() is None

    try:
        clock.run(scenario())
        assert seen == [True], "generated on a daemon thread, which the interpreter does not join at exit"
    finally:
        release.set()


def test_failures_are_counted_as_upstreams_file_secret_and_watcher_failures(tmp_path: Path) -> None:
    """Each secret that cannot be made from its files counts once (a reload retried with the same error is one
    failure), and a watched file that becomes unreadable is the watcher's failure, once until it reads again."""
    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        write_pair(tmp_path / "a", signer.ca, clock.now())
        cache = SecretCache(options(tmp_path), None, clock=clock)
        await cache.start()
        for name in ("file-root:missing.pem", "file-cert:a/cert-chain.pem~missing/key.pem"):
            with pytest.raises(SecretError):
                await cache.get(name)
        assert (cache.file_failures, cache.file_watch_failures) == (2, 0)
        good = "file-cert:a/cert-chain.pem~a/key.pem"
        cache.retain(good)
        await cache.get(good)
        key = (tmp_path / "a/key.pem").read_bytes()
        (tmp_path / "a/key.pem").unlink()
        await clock.sleep(10)  # many polls and reload attempts while it is gone
        assert (cache.file_failures, cache.file_watch_failures) == (3, 1)
        (tmp_path / "a/key.pem").write_bytes(key)
        await clock.sleep(10)
        assert (cache.file_failures, cache.file_watch_failures) == (3, 1)
        assert [item.resource_name for item in cache.snapshot()] == [good]
        await cache.stop()

    in_virtual_time(scenario)
