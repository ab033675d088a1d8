"""The secret cache: the workload certificate, its trust bundle, and certificates on disk.

Policy (upstream's SecretManagerClient, made proactive):
- One CSR at a time: concurrent requests for `default`/`ROOTCA` share the
  generation in flight instead of each asking the CA.
- A background task keeps a valid certificate: it pre-warms at start, rotates
  at `expiry - (ratio ± jitter) * lifetime`, and retries with a backoff that never
  gives up. While the CA is unreachable the cached certificate stays in service
  until it expires; an expired certificate is never served.
- A new certificate is pushed (`default`) to listeners, and `ROOTCA` too when its
  root differs; OUTPUT_CERTS is rewritten.
- Mounted files (`./etc/certs`, `./var/run/secrets/workload-spiffe-credentials`)
  and `file-cert:` / `file-root:` names are read from disk on demand and watched;
  a change is pushed to the names that depend on the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from istio_agent.pki import certs, keys
from istio_agent.security.ca_client import CertificateSigner
from istio_agent.security.filewatch import FileWatcher
from istio_agent.security.options import (
    CERT_CHAIN_FILE,
    KEY_FILE,
    MOUNTED_CERTS_DIR,
    ROOT_CERT_FILE,
    WORKLOAD_CREDENTIALS_DIR,
    SecurityOptions,
)
from istio_agent.security.output import write_output_certs
from istio_agent.security.rotation import Backoff, rotation_time
from istio_agent.security.secrets import (
    FILE_ROOT_SYSTEM,
    ROOT_RESOURCE,
    WORKLOAD_RESOURCE,
    SecretError,
    SecretItem,
    merge_roots,
    parse_file_resource,
    pem_certificates,
    system_bundle_path,
)

log = logging.getLogger(__name__)

SecretListener = Callable[[str], None]


def concat_chain(chain: Iterable[str]) -> bytes:
    """Join PEM entries as upstream does: a newline between entries that lack one."""
    parts = list(chain)
    out = ""
    for index, entry in enumerate(parts):
        out += entry
        if index < len(parts) - 1 and not entry.endswith("\n"):
            out += "\n"
    return out.encode()


def _non_empty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


class SecretCache:
    """Serves secrets by resource name and tells listeners when one changes."""

    def __init__(
        self,
        options: SecurityOptions,
        signer: CertificateSigner | None,
        *,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.options = options
        self._signer = signer
        self._clock = clock
        self._rand = rand
        self._listeners: list[SecretListener] = []
        self._workload: SecretItem | None = None
        self._rotate_at = 0.0
        self._last_root = b""
        self._extra_roots: dict[str, list[bytes]] = {}
        self._inflight: asyncio.Task[SecretItem] | None = None
        self._changed = asyncio.Event()
        self._maintainer: asyncio.Task[None] | None = None
        self._served_files: dict[str, SecretItem] = {}
        self._watcher = FileWatcher(options.file_poll_interval, self._on_files_changed)
        self._retry_handles: dict[str, asyncio.TimerHandle] = {}
        self.issued = 0  # certificates obtained from the CA, for diagnostics and tests
        self._mounted = self._find_mounted_dir()

    # --- wiring -----------------------------------------------------------------------------------------
    def on_update(self, listener: SecretListener) -> None:
        """Call `listener(resource_name)` whenever that secret changes (rotation, root change, file change)."""
        self._listeners.append(listener)

    def _notify(self, name: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(name)
            except Exception:
                log.exception("secret listener failed for %s", name)

    def set_signer(self, signer: CertificateSigner | None) -> None:
        """Choose the CA (or none) before `start()`; the identity component decides this at start."""
        self._signer = signer

    @property
    def uses_ca(self) -> bool:
        """True when the workload certificate comes from the CA (not from mounted files)."""
        return self._signer is not None and not self._workload_files_present()

    async def start(self, prewarm: bool = True) -> None:
        """Start file watching and, with a CA, the task that keeps a valid certificate (pre-warm + rotation)."""
        await self._watcher.start()
        if prewarm and self.uses_ca and self._maintainer is None:
            self._maintainer = asyncio.get_running_loop().create_task(self._maintain(), name="workload-cert")

    async def stop(self) -> None:
        for handle in self._retry_handles.values():
            handle.cancel()
        self._retry_handles.clear()
        await self._watcher.stop()
        for task in (self._maintainer, self._inflight):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._maintainer = None
        self._inflight = None

    # --- serving ----------------------------------------------------------------------------------------
    async def get(self, name: str) -> SecretItem:
        """The secret for `name`, generating the workload certificate if needed; SecretError when impossible."""
        item = self._from_files(name)
        if item is not None:
            if name in (WORKLOAD_RESOURCE, ROOT_RESOURCE):
                self._write_file_output(item)
            return item
        workload = await self._valid_workload()
        if name == ROOT_RESOURCE:
            return self._root_item(workload)
        return workload if name == WORKLOAD_RESOURCE else replace(workload, resource_name=name)

    def current_workload(self) -> SecretItem | None:
        """The cached CA-issued certificate if it is still valid, without generating one."""
        item = self._workload
        if item is None or item.expires <= self._clock():
            return None
        return item

    def snapshot(self) -> list[SecretItem]:
        """The secrets currently held (valid workload cert, its bundle, file secrets served), for diagnostics."""
        items: list[SecretItem] = []
        workload = self.current_workload()
        if workload is not None:
            items += [workload, self._root_item(workload)]
        items += [self._served_files[name] for name in sorted(self._served_files)]
        return items

    def set_extra_roots(self, source: str, pems: Iterable[bytes | str]) -> None:
        """Trust extra roots (e.g. PCDS trust bundles) from `source` in `ROOTCA`, replacing that source's set.

        A change pushes `ROOTCA` and rewrites OUTPUT_CERTS' root; an empty set removes the source.
        """
        bundle = [p.encode() if isinstance(p, str) else bytes(p) for p in pems]
        bundle = [p for p in bundle if p.strip()]
        if self._extra_roots.get(source, []) == bundle:
            return
        before = self._merged_roots(self._last_root)
        if bundle:
            self._extra_roots[source] = bundle
        else:
            self._extra_roots.pop(source, None)
        if self._merged_roots(self._last_root) == before and self._last_root:
            return
        workload = self.current_workload()
        if workload is not None:
            self._write_output(workload)
        self._notify(ROOT_RESOURCE)

    def _merged_roots(self, primary: bytes) -> bytes:
        extra = [pem for source in sorted(self._extra_roots) for pem in self._extra_roots[source]]
        return merge_roots(primary, extra) if extra else primary

    def _root_item(self, workload: SecretItem) -> SecretItem:
        return SecretItem(
            ROOT_RESOURCE, root_cert=self._merged_roots(workload.root_cert), created=workload.created,
            expires=workload.expires, source=workload.source,
        )

    # --- the CA-issued workload certificate -----------------------------------------------------------------
    async def _valid_workload(self) -> SecretItem:
        cached = self.current_workload()
        if cached is not None:
            return cached
        if self._signer is None:
            raise SecretError(
                "no workload certificate: no CA client is configured and no mounted certificate files were found"
            )
        return await self._generate()

    async def _generate(self) -> SecretItem:
        """Join the generation in flight, or start one; concurrent callers share a single CSR."""
        task = self._inflight
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._issue(), name="workload-csr")
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._inflight = task
        return await asyncio.shield(task)

    def _new_key_and_csr(self) -> tuple[bytes, bytes]:
        opts = self.options
        key = keys.generate_key(opts.key_algorithm, rsa_bits=opts.rsa_key_size, curve=opts.ecc_curve)
        return keys.key_to_pem(key), certs.build_csr(key, [opts.spiffe_id])

    async def _issue(self) -> SecretItem:
        assert self._signer is not None
        key_pem, csr_pem = await asyncio.to_thread(self._new_key_and_csr)
        chain = await self._signer.sign(csr_pem, int(self.options.secret_ttl))
        try:
            leaf = certs.load_pem_chain(chain[0])[0]
        except (ValueError, IndexError) as exc:
            raise SecretError(f"CA returned an unreadable leaf certificate: {exc}") from None
        if not certs.public_key_matches(leaf, keys.key_from_pem(key_pem)):
            raise SecretError("CA returned a certificate for a different key")
        now = self._clock()
        item = SecretItem(
            WORKLOAD_RESOURCE, cert_chain=concat_chain(chain), private_key=key_pem, root_cert=chain[-1].encode(),
            created=now, expires=certs.not_after(leaf), source="ca",
        )
        self._store(item, now)
        return item

    def _store(self, item: SecretItem, now: float) -> None:
        previous = self._workload
        opts = self.options
        self._workload = item
        self._rotate_at = rotation_time(
            item.created, item.expires, opts.grace_period_ratio, opts.grace_period_ratio_jitter, self._rand(), now
        )
        self.issued += 1
        self._changed.set()
        leaf = certs.load_pem_chain(item.cert_chain)[0]
        log.info(
            "issued workload certificate %s serial %s, expires in %.0fs, rotation in %.0fs",
            opts.spiffe_id, certs.serial_hex(leaf), item.expires - now, self._rotate_at - now,
        )
        self._write_output(item)
        root_changed = bool(self._last_root) and self._last_root != item.root_cert
        self._last_root = item.root_cert
        # The first certificate goes straight to whoever asked; later ones replace a served one.
        if self.issued > 1 or previous is not None:
            self._notify(WORKLOAD_RESOURCE)
        if root_changed:
            log.info("root certificate changed: pushing ROOTCA")
            self._notify(ROOT_RESOURCE)

    def _write_output(self, item: SecretItem) -> None:
        directory = self.options.output_dir
        if directory is None:
            return
        try:
            written = write_output_certs(
                directory, item.private_key, item.cert_chain, self._merged_roots(item.root_cert)
            )
        except OSError as exc:
            log.error("cannot write certificates to OUTPUT_CERTS %s: %s", directory, exc)
            return
        if written:
            log.debug("wrote %s to %s", ", ".join(written), directory)

    async def _maintain(self) -> None:
        """Keep a valid certificate forever: pre-warm, rotate on schedule, retry failures with backoff."""
        backoff = Backoff(self.options.retry_initial, self.options.retry_max, rand=self._rand)
        while True:
            item = self._workload
            now = self._clock()
            if item is not None and now < self._rotate_at:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self._rotate_at - now)
                continue
            try:
                await self._generate()
                backoff.reset()
            except SecretError as exc:
                delay = backoff.next()
                current = self.current_workload()
                if current is None and item is not None and self._workload is item:
                    log.error("workload certificate expired and could not be renewed; it is no longer served")
                    self._workload = None
                state = "keeping the current certificate" if current is not None else "no valid certificate"
                log.warning("cannot get a workload certificate (%s; retrying in %.1fs): %s", state, delay, exc)
                await asyncio.sleep(delay)
            except Exception:
                delay = backoff.next()
                log.exception("unexpected failure getting a workload certificate; retrying in %.1fs", delay)
                await asyncio.sleep(delay)

    # --- files ------------------------------------------------------------------------------------------------
    def _find_mounted_dir(self) -> Path:
        """workload-spiffe-credentials when it holds all three files, else ./etc/certs (upstream's order)."""
        creds = self.options.path(WORKLOAD_CREDENTIALS_DIR)
        if all(_non_empty(creds / name) for name in (CERT_CHAIN_FILE, KEY_FILE, ROOT_CERT_FILE)):
            return creds
        return self.options.path(MOUNTED_CERTS_DIR)

    def _mounted_is_output(self) -> bool:
        """Reading back our own OUTPUT_CERTS would stop rotation, so that directory never counts as mounted."""
        out = self.options.output_dir
        if out is None:
            return False
        try:
            return out.resolve() == self._mounted.resolve()
        except OSError:
            return False

    def _workload_files_present(self) -> bool:
        return (
            _non_empty(self._mounted / CERT_CHAIN_FILE)
            and _non_empty(self._mounted / KEY_FILE)
            and not self._mounted_is_output()
        )

    def _from_files(self, name: str) -> SecretItem | None:
        """The secret for `name` read from disk, None when `name` is not file-backed; SecretError when unreadable."""
        if name == ROOT_RESOURCE:
            root = self._mounted / ROOT_CERT_FILE
            if not _non_empty(root) or self._mounted_is_output():
                return None
            item = self._load_root(name, root, merge=True)
        elif name == WORKLOAD_RESOURCE:
            if not self._workload_files_present():
                return None
            item = self._load_key_cert(name, self._mounted / CERT_CHAIN_FILE, self._mounted / KEY_FILE)
        elif name == FILE_ROOT_SYSTEM:
            bundle = system_bundle_path()
            if bundle is None:
                raise SecretError("file-root:system: no OS certificate bundle found")
            item = self._load_root(name, bundle, merge=False)
        else:
            parsed = parse_file_resource(name)
            if parsed is None:
                return None
            if parsed.is_root:
                item = self._load_root(name, self.options.path(parsed.ca), merge=False)
            else:
                item = self._load_key_cert(name, self.options.path(parsed.cert), self.options.path(parsed.key))
        self._served_files[name] = item
        return item

    def _load_root(self, name: str, path: Path, merge: bool) -> SecretItem:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise SecretError(f"{name}: cannot read root certificate {path}: {exc.strerror}") from None
        roots = pem_certificates(data)
        if not roots:
            raise SecretError(f"{name}: no valid certificate in {path}")
        self._watcher.watch(path, name)
        bundle = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in roots)
        if merge:
            bundle = self._merged_roots(bundle)
        expires = min(certs.not_after(c) for c in roots)
        return SecretItem(name, root_cert=bundle, created=self._clock(), expires=expires, source=f"file:{path}")

    def _load_key_cert(self, name: str, cert_path: Path, key_path: Path) -> SecretItem:
        try:
            chain_pem, key_pem = cert_path.read_bytes(), key_path.read_bytes()
        except OSError as exc:
            raise SecretError(f"{name}: cannot read {exc.filename}: {exc.strerror}") from None
        self._watcher.watch(cert_path, name)
        self._watcher.watch(key_path, name)
        try:
            leaf = certs.load_pem_chain(chain_pem)[0]
            key = keys.key_from_pem(key_pem)
        except (ValueError, TypeError, IndexError) as exc:
            raise SecretError(f"{name}: invalid certificate or key in {cert_path}, {key_path}: {exc}") from None
        if not certs.public_key_matches(leaf, key):
            raise SecretError(f"{name}: the key in {key_path} does not match the certificate in {cert_path}")
        return SecretItem(
            name, cert_chain=chain_pem, private_key=key_pem, created=self._clock(), expires=certs.not_after(leaf),
            source=f"file:{cert_path}",
        )

    def _on_files_changed(self, names: set[str]) -> None:
        for name in sorted(names):
            handle = self._retry_handles.pop(name, None)
            if handle is not None:
                handle.cancel()
            try:
                item = self._from_files(name)
            except SecretError as exc:
                # Often a half-written update (key before chain): try again shortly.
                log.warning("certificate files for %s changed but cannot be loaded yet: %s", name, exc)
                loop = asyncio.get_running_loop()
                self._retry_handles[name] = loop.call_later(
                    self.options.file_poll_interval, self._on_files_changed, {name}
                )
                continue
            if item is None:
                continue
            log.info("certificate files for %s changed: pushing", name)
            if name in (WORKLOAD_RESOURCE, ROOT_RESOURCE):
                self._write_file_output(item)
            self._notify(name)

    def _write_file_output(self, item: SecretItem) -> None:
        """Mirror mounted `default`/`ROOTCA` into OUTPUT_CERTS, as upstream does for every served secret."""
        directory = self.options.output_dir
        if directory is None or self._mounted_is_output():
            return
        try:
            write_output_certs(directory, item.private_key, item.cert_chain, item.root_cert)
        except OSError as exc:
            log.error("cannot write certificates to OUTPUT_CERTS %s: %s", directory, exc)
