"""The secret cache: the workload certificate, its trust bundle, and certificates on disk.

Policy (upstream's SecretManagerClient, made proactive); the decisions about the
CA-issued certificate are made by the sans-IO `CertificateLifecycle`, which this
class drives with a `Clock` and whose actions it performs:
- One CSR at a time: concurrent requests for `default`/`ROOTCA` share the
  generation in flight instead of each asking the CA.
- A valid certificate is kept: pre-warmed at start, rotated at
  `expiry - (ratio ± jitter) * lifetime`, retried with a backoff that never
  gives up. While the CA is unreachable the cached certificate stays in service
  until it expires; an expired certificate is never served.
- A new certificate is pushed (`default`) to listeners, and `ROOTCA` too when its
  root differs; OUTPUT_CERTS is rewritten.
- Mounted files (`./etc/certs`, `./var/run/secrets/workload-spiffe-credentials`)
  and `file-cert:` / `file-root:` names are read from disk on demand, off the
  event loop, by `FileSecretStore` (`file_store.py`), which watches them (the
  names SDS callers chose only while a stream subscribes); a change is pushed to
  the names that depend on the file. A `file-cert:`/`file-root:` file is served
  to an SDS caller only if that caller could read it itself (`peercred.py`).
- Keys are generated on a daemon thread (`offloop.py`): a stop abandons a key
  generation in progress instead of waiting for it. The first CSR's key may
  have been made ahead, while the agent loaded (`key_ahead.py`); it is used
  once, and only if it is the kind the options ask for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from istio_agent.clock import Cancellable, Clock, SystemClock
from istio_agent.pki import certs, keys
from istio_agent.security.ca_client import CertificateSigner
from istio_agent.security.core.cert_lifecycle import (
    Action,
    CertificateLifecycle,
    Expire,
    Push,
    RenewalPolicy,
    Request,
    Retry,
    Write,
)
from istio_agent.security.core.secrets import (
    FILE_ROOT_SYSTEM,
    ROOT_RESOURCE,
    WORKLOAD_RESOURCE,
    SecretError,
    SecretItem,
    merge_roots,
    parse_file_resource,
    system_bundle_path,
)
from istio_agent.security.file_store import FileSecretStore, FileSpec
from istio_agent.security.key_ahead import KeyAhead, KeySpec
from istio_agent.security.offloop import in_daemon_thread
from istio_agent.security.options import (
    CERT_CHAIN_FILE,
    CREDENTIAL_FILES,
    KEY_FILE,
    MOUNTED_CERTS_DIR,
    ROOT_CERT_FILE,
    WORKLOAD_CREDENTIALS_DIR,
    SecurityOptions,
)
from istio_agent.security.output import write_output_certs
from istio_agent.security.peercred import PeerCredentials

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
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
        first_key: KeyAhead | None = None,
    ) -> None:
        self.options = options
        self._signer = signer
        self._first_key = first_key  # made ahead while the agent loaded (key_ahead.py): the first CSR's, once
        self._clock: Clock = clock or SystemClock()
        self._lifecycle = CertificateLifecycle(RenewalPolicy(
            options.grace_period_ratio, options.grace_period_ratio_jitter, options.retry_initial, options.retry_max,
        ), rand)
        self._listeners: list[SecretListener] = []
        self._extra_roots: dict[str, list[bytes]] = {}
        self._inflight: asyncio.Future[SecretItem] | None = None
        self._request_task: asyncio.Task[None] | None = None
        self._timer: Cancellable | None = None
        self._maintained = False
        self._issued_event = asyncio.Event()  # set whenever a CA-issued certificate arrives
        self._files = FileSecretStore(self._clock, options.file_poll_interval, options.file_debounce,
                                      self._on_file_reloaded)
        self._mounted = self._find_mounted_dir()

    @property
    def issued(self) -> int:
        """Certificates obtained from the CA, for diagnostics and tests."""
        return self._lifecycle.issued_count

    @property
    def file_failures(self) -> int:
        """Secrets that could not be made from their files (upstream's num_file_secret_failures_total)."""
        return self._files.failures

    @property
    def file_watch_failures(self) -> int:
        """Failures of the certificate file watcher (upstream's num_file_watcher_failures_total)."""
        return self._files.watch_failures

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
        """Start file watching and, with a CA, keep a valid certificate from now on (pre-warm + rotation)."""
        await self._files.start()
        if prewarm and self.uses_ca and not self._maintained:
            self._maintained = True
            self._apply(self._lifecycle.start(self._clock.now()))

    async def stop(self) -> None:
        self._maintained = False
        self._lifecycle.stop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._files.stop()
        task, self._request_task = self._request_task, None
        if task is not None and not task.done():
            log.info("stopping while a workload certificate is being requested: abandoning it")
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._inflight is not None and not self._inflight.done():
            self._inflight.cancel()
        self._inflight = None

    # --- serving ----------------------------------------------------------------------------------------
    async def get(self, name: str, caller: PeerCredentials | None = None) -> SecretItem:
        """The secret for `name`, generating the workload certificate if needed; SecretError when impossible.

        `caller` is the SDS peer asking: a `file-cert:`/`file-root:` file it could not read itself is refused
        (SecretRefused). None is the agent itself.
        """
        item = await self._from_files(name, caller)
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
        return self._lifecycle.valid(self._clock.now())

    async def wait_for_workload(self) -> SecretItem:
        """Wait (without asking the CA) until a valid CA-issued certificate is held."""
        while True:
            item = self.current_workload()
            if item is not None:
                return item
            self._issued_event.clear()
            await self._issued_event.wait()

    def snapshot(self) -> list[SecretItem]:
        """The secrets currently held (valid workload cert, its bundle, file secrets served), for diagnostics."""
        items: list[SecretItem] = []
        workload = self.current_workload()
        if workload is not None:
            items += [workload, self._root_item(workload)]
        for item in self._files.served():
            if item.resource_name == ROOT_RESOURCE:
                item = replace(item, root_cert=self._merged_roots(item.root_cert))
            items.append(item)
        return items

    def retain(self, name: str) -> None:
        """The SDS server's first stream subscribing to `name`: its files are watched once they load."""
        self._files.retain(name)

    def release(self, name: str) -> None:
        """The SDS server's last stream subscribing to `name` went: its files are no longer watched."""
        self._files.release(name)

    def watched_files(self) -> dict[Path, set[str]]:
        """Every watched file and the names depending on it, for diagnostics and tests."""
        return self._files.watched_files()

    def set_extra_roots(self, source: str, pems: Iterable[bytes | str]) -> None:
        """Trust extra roots (e.g. PCDS trust bundles) from `source` in `ROOTCA`, replacing that source's set.

        A change pushes `ROOTCA` and rewrites OUTPUT_CERTS' root; an empty set removes the source.
        """
        bundle = [p.encode() if isinstance(p, str) else bytes(p) for p in pems]
        bundle = [p for p in bundle if p.strip()]
        if self._extra_roots.get(source, []) == bundle:
            return
        primary = self._primary_root()
        before = self._merged_roots(primary)
        if bundle:
            self._extra_roots[source] = bundle
        else:
            self._extra_roots.pop(source, None)
        if self._merged_roots(primary) == before and primary:
            return
        workload = self.current_workload()
        if workload is not None:
            self._write_output(workload)
        self._notify(ROOT_RESOURCE)

    def _primary_root(self) -> bytes:
        return self._lifecycle.last_root

    def _merged_roots(self, primary: bytes) -> bytes:
        extra = [pem for source in sorted(self._extra_roots) for pem in self._extra_roots[source]]
        return merge_roots(primary, extra) if extra else primary

    def _root_item(self, workload: SecretItem) -> SecretItem:
        return SecretItem(
            ROOT_RESOURCE, root_cert=self._merged_roots(workload.root_cert), created=workload.created,
            expires=workload.expires, source=workload.source,
        )

    # --- the CA-issued workload certificate: performing the lifecycle's actions -------------------------------
    async def _valid_workload(self) -> SecretItem:
        cached = self.current_workload()
        if cached is not None:
            return cached
        if self._signer is None:
            raise SecretError(
                "no workload certificate: no CA client is configured and no mounted certificate files were found"
            )
        self._apply(self._lifecycle.demand(self._clock.now()))
        inflight = self._inflight
        if inflight is None:  # demand() found a valid certificate after all
            cached = self.current_workload()
            if cached is None:
                raise SecretError("no workload certificate")
            return cached
        return await asyncio.shield(inflight)

    def _apply(self, actions: list[Action]) -> None:
        """Carry out what the lifecycle decided, then re-arm the timer at its next deadline."""
        for action in actions:
            if isinstance(action, Request):
                self._start_request()
            elif isinstance(action, Write):
                self._log_issued(action.item)
                self._write_output(action.item)
                self._issued_event.set()
            elif isinstance(action, Push):
                if action.name == ROOT_RESOURCE:
                    log.info("root certificate changed: pushing ROOTCA")
                self._notify(action.name)
            elif isinstance(action, Expire):
                log.error("workload certificate expired and could not be renewed; it is no longer served")
            elif isinstance(action, Retry):
                state = "keeping the current certificate" if action.serving else "no valid certificate"
                when = f"retrying in {action.delay:.1f}s" if self._maintained else "not retrying"
                log.warning("cannot get a workload certificate (%s; %s): %s", state, when, action.reason)
        self._arm_timer()

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self._lifecycle.deadline()
        if deadline is not None and (self._maintained or self._lifecycle.current is not None):
            self._timer = self._clock.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._apply(self._lifecycle.timer(self._clock.now()))

    def _start_request(self) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SecretItem] = loop.create_future()
        future.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody may be waiting on it
        self._inflight = future
        self._request_task = loop.create_task(self._request(future), name="workload-csr")

    async def _request(self, future: asyncio.Future[SecretItem]) -> None:
        try:
            item = await self._issue()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except SecretError as exc:
            future.set_exception(exc)
            self._apply(self._lifecycle.failed(str(exc), self._clock.now()))
        except Exception as exc:
            log.exception("unexpected failure getting a workload certificate")
            future.set_exception(SecretError(f"unexpected failure getting a workload certificate: {exc}"))
            self._apply(self._lifecycle.failed(repr(exc), self._clock.now()))
        else:
            future.set_result(item)
            self._apply(self._lifecycle.issued(item, self._clock.now()))

    def _new_key_and_csr(self) -> tuple[keys.PrivateKey, bytes, bytes]:
        opts = self.options
        first, self._first_key = self._first_key, None  # once: whether used or not, the key made ahead goes
        spec = KeySpec.of(opts)
        key = first.take(spec) if first is not None else None
        if key is None:
            key = spec.generate()
        return key, keys.key_to_pem(key, pkcs8=opts.pkcs8_keys), certs.build_csr(key, [opts.spiffe_id])

    async def _issue(self) -> SecretItem:
        assert self._signer is not None
        key, key_pem, csr_pem = await in_daemon_thread("workload-keygen", self._new_key_and_csr)
        chain = await self._signer.sign(csr_pem, int(self.options.secret_ttl))
        try:
            leaf = certs.load_pem_chain(chain[0])[0]
        except (ValueError, IndexError) as exc:
            raise SecretError(f"CA returned an unreadable leaf certificate: {exc}") from None
        # Checked against the key object itself: parsing its PEM back would re-validate an RSA key (~45 ms of
        # CPU on the event loop, between the CA's answer and the files, for a key this process just made).
        if not certs.public_key_matches(leaf, key):
            raise SecretError("CA returned a certificate for a different key")
        return SecretItem(
            WORKLOAD_RESOURCE, cert_chain=concat_chain(chain), private_key=key_pem, root_cert=chain[-1].encode(),
            created=self._clock.now(), expires=certs.not_after(leaf), source="ca",
        )

    def _log_issued(self, item: SecretItem) -> None:
        now = self._clock.now()
        leaf = certs.load_pem_chain(item.cert_chain)[0]
        log.info(
            "issued workload certificate %s serial %s, expires in %.0fs, rotation in %.0fs",
            self.options.spiffe_id, certs.serial_hex(leaf), item.expires - now, self._lifecycle.rotate_at - now,
        )

    def _write_output(self, item: SecretItem) -> None:
        directory = self.options.output_dir
        if directory is None:
            return
        try:
            written = write_output_certs(
                directory, item.private_key, item.cert_chain, self._merged_roots(item.root_cert),
                self.options.output_file_mode,
            )
        except OSError as exc:
            log.error("cannot write certificates to OUTPUT_CERTS %s: %s", directory, exc)
            return
        if written:
            log.debug("wrote %s to %s", ", ".join(written), directory)

    # --- files ------------------------------------------------------------------------------------------------
    def _find_mounted_dir(self) -> Path:
        """workload-spiffe-credentials when it holds all three files, else ./etc/certs (upstream's order)."""
        creds = self.options.path(WORKLOAD_CREDENTIALS_DIR)
        if all(_non_empty(creds / name) for name in CREDENTIAL_FILES):
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

    def _file_spec(self, name: str) -> FileSpec | None:
        """Which files back `name`; None when `name` is not file-backed; SecretError when it cannot be."""
        if name == ROOT_RESOURCE:
            root = self._mounted / ROOT_CERT_FILE
            if not _non_empty(root) or self._mounted_is_output():
                return None
            return FileSpec(root=root, checked=False, always_watched=True)
        if name == WORKLOAD_RESOURCE:
            if not self._workload_files_present():
                return None
            return FileSpec(cert=self._mounted / CERT_CHAIN_FILE, key=self._mounted / KEY_FILE, checked=False,
                            always_watched=True)
        if name == FILE_ROOT_SYSTEM:
            bundle = system_bundle_path()
            if bundle is None:
                raise SecretError("file-root:system: no OS certificate bundle found")
            return FileSpec(root=bundle, checked=False)
        parsed = parse_file_resource(name)
        if parsed is None:
            return None
        if parsed.is_root:
            return FileSpec(root=self.options.path(parsed.ca))
        return FileSpec(cert=self.options.path(parsed.cert), key=self.options.path(parsed.key))

    async def _from_files(self, name: str, caller: PeerCredentials | None) -> SecretItem | None:
        """The secret for `name` read from disk, None when `name` is not file-backed; SecretError when unreadable."""
        spec = self._file_spec(name)
        if spec is None:
            return None
        item = await self._files.load(name, spec, caller)
        if name == ROOT_RESOURCE:
            item = replace(item, root_cert=self._merged_roots(item.root_cert))
        return item

    def _on_file_reloaded(self, name: str, item: SecretItem) -> None:
        """A watched file changed and loads: mirror the pod's own into OUTPUT_CERTS, then push."""
        if name == ROOT_RESOURCE:
            item = replace(item, root_cert=self._merged_roots(item.root_cert))
        if name in (WORKLOAD_RESOURCE, ROOT_RESOURCE):
            self._write_file_output(item)
        self._notify(name)

    def _write_file_output(self, item: SecretItem) -> None:
        """Mirror mounted `default`/`ROOTCA` into OUTPUT_CERTS, as upstream does for every served secret."""
        directory = self.options.output_dir
        if directory is None or self._mounted_is_output():
            return
        try:
            write_output_certs(directory, item.private_key, item.cert_chain, item.root_cert,
                               self.options.output_file_mode)
        except OSError as exc:
            log.error("cannot write certificates to OUTPUT_CERTS %s: %s", directory, exc)
