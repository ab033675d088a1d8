"""The install, verify and cleanup steps on the node's directories (the file edge of `cniconfig`).

`Installer.install_all` runs upstream's steps in upstream's order, stopping at the
first failure: the plugin executable into the bin dir (the launcher generated
from this installation's console script, `launcher.py`), the plugin's kubeconfig
into the run dir, our entry into the CNI config (what `cniconfig.plan_config_write`
says). Each writes only when what is there differs, so a re-check after our own
write is read-only and another agent watching the net dir is not woken for
nothing. Files are replaced atomically (temp file in the same directory, then
rename) keeping a merged file's permissions and owner, and never over a file
that changed since it was read: just before the rename the file must still
hold the bytes the merge was made from, else it is read and merged again
(`netdir.unchanged_since`). Files are read with `netdir`'s limits.

`Installer.cleanup` undoes it (upstream's Cleanup): our entry out of the primary
file, or our own file deleted; the kubeconfig and the executable removed, each
step whatever the one before it met. When
the primary still holds exactly what we wrote, its original bytes (and `.conf`
name) are put back, so the node's file is byte-identical to before install-cni;
otherwise (someone changed it since) our entry is removed as upstream does.

`keep_installed` is the loop: install, wait for a change or the periodic
re-check, install again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from istio_agent.cni.install import binaries, cniconfig, netdir
from istio_agent.cni.install.kubeconfig import KubeconfigInputs, render_kubeconfig
from istio_agent.cni.install.options import InstallOptions
from istio_agent.cni.install.watcher import DirectoryWatcher, ReinstallThrottle
from istio_agent.cni.plugin.add import KUBECONFIG_NAME  # the file the plugin reads
from istio_agent.kube.access import KubeAccess

log = logging.getLogger("istio_agent.cni.install")

# upstream's istio_cni_installs_total result labels
RESULT_SUCCESS = "SUCCESS"
RESULT_COPY_BINARIES_FAILURE = "COPY_BINARIES_FAILURE"
RESULT_CREATE_KUBECONFIG_FAILURE = "CREATE_KUBECONFIG_FAILURE"
RESULT_CREATE_CNI_CONFIG_FAILURE = "CREATE_CNI_CONFIG_FAILURE"

RECHECK_INTERVAL = 5.0  # seconds: the safety net under inotify
WRITE_ATTEMPTS = 3  # reads and merges of a file another writer keeps changing under us, per install round


class InstallError(Exception):
    """One install step failed; `result` is upstream's metric label for it."""

    def __init__(self, result: str, message: str) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class _Merged:
    """What we know of the file we merged into, for cleanup: its bytes before and after our write."""

    name: str  # the file we wrote (after any rename)
    written: bytes
    original_name: str | None = None  # None: no restorable original (it already held an istio-cni entry)
    original: bytes = b""
    original_mode: int = 0o600
    original_owner: tuple[int, int] | None = None


@dataclass
class StepOutcome:
    """What one `install_all` did."""

    ready: bool
    changed: list[str] = field(default_factory=list)
    waiting: str | None = None


class Installer:
    """The install steps of one node agent on its directories; holds what it wrote, for verify and cleanup."""

    def __init__(self, options: InstallOptions, plugin_source: Path, access: KubeAccess | None) -> None:
        self.options = options
        self.plugin_source = plugin_source
        self.access = access
        self.kubeconfig_path = Path(options.cni_agent_run_dir) / KUBECONFIG_NAME
        self.entry = cniconfig.plugin_entry(cniconfig.PluginSettings(
            plugin_log_level=options.plugin_log_level, cni_agent_run_dir=options.cni_agent_run_dir,
            ambient_enabled=options.ambient_enabled,
            enablement_selectors=cniconfig.parse_enablement_selectors(options.ambient_enablement_selector),
            exclude_namespaces=options.exclude_namespaces, pod_namespace=options.pod_namespace,
            native_nftables=options.native_nftables,
            enable_ambient_detection_retry=options.enable_ambient_detection_retry))
        self.settings = cniconfig.ConfigSettings(
            cni_conf_name=options.cni_conf_name, chained_cni_plugin=options.chained_cni_plugin,
            ambient_enabled=options.ambient_enabled, istio_owned_cni_config=options.istio_owned_cni_config,
            istio_owned_cni_config_filename=options.istio_owned_cni_config_filename)
        self.written: str | None = None  # the config file our last write produced
        self._merged: _Merged | None = None
        self._launcher: bytes | None = None

    # ---- the plugin executable
    def launcher(self) -> bytes:
        """What goes into the bin dir: the launcher for this installation (made once; BinaryError if it cannot)."""
        if self._launcher is None:
            from istio_agent.cni.install.launcher import LauncherError, launcher_for

            try:
                self._launcher = launcher_for(self.plugin_source, self.options.cni_agent_run_dir)
            except LauncherError as exc:
                raise binaries.BinaryError(str(exc)) from None
        return self._launcher

    def sync_binary(self) -> bool:
        try:
            copied = binaries.install_plugin(self.launcher(), self.options.cni_bin_dir)
        except binaries.BinaryError as exc:
            raise InstallError(RESULT_COPY_BINARIES_FAILURE, f"copy binaries: {exc}") from None
        if copied:
            log.info("copied %s to %s", binaries.PLUGIN_NAME, self.options.cni_bin_dir)
        return copied

    # ---- the plugin's kubeconfig
    def render_kubeconfig(self) -> str:
        if self.access is None:
            raise InstallError(RESULT_CREATE_KUBECONFIG_FAILURE,
                               "write kubeconfig: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
        try:
            token = Path(self.access.token_file).read_bytes()
            ca = None if self.access.skip_tls_verify else Path(self.access.ca_file).read_bytes()
        except OSError as exc:
            raise InstallError(RESULT_CREATE_KUBECONFIG_FAILURE,
                               f"write kubeconfig: {exc.filename}: {exc.strerror or exc}") from None
        return render_kubeconfig(KubeconfigInputs(self.access.server, token, ca, self.access.skip_tls_verify))

    def sync_kubeconfig(self) -> bool:
        text = self.render_kubeconfig()
        mode = self.options.kubeconfig_mode
        try:
            current = self.kubeconfig_path.read_text()
            current_mode = stat.S_IMODE(self.kubeconfig_path.stat().st_mode)
        except OSError:
            current, current_mode = None, -1
        if current == text and current_mode == mode:
            return False
        try:
            self.kubeconfig_path.parent.mkdir(parents=True, exist_ok=True)
            binaries.atomic_write(self.kubeconfig_path, text.encode(), mode)
        except OSError as exc:
            raise InstallError(RESULT_CREATE_KUBECONFIG_FAILURE,
                               f"write kubeconfig {self.kubeconfig_path}: {exc.strerror or exc}") from None
        log.info("wrote kubeconfig file %s (server %s)", self.kubeconfig_path,
                 self.access.server if self.access else "")
        return True

    # ---- the CNI config
    def listing(self) -> cniconfig.Listing:
        extra = tuple(n for n in self._names_of_interest() if n)
        return netdir.read_listing(self.options.mounted_cni_net_dir, extra)

    def _names_of_interest(self) -> list[str]:
        name = self.settings.cni_conf_name
        names = [name, self.written or "", self.settings.istio_owned_cni_config_filename]
        if name.endswith(".conf"):
            names.append(name + "list")
        elif name.endswith(".conflist"):
            names.append(name[: -len("list")])
        return names

    def check_config(self, listing: cniconfig.Listing | None = None) -> str | None:
        """Why our CNI config is not in effect now; None when it is."""
        return cniconfig.check_installed(self.settings, listing or self.listing(), self.written)

    def sync_config(self) -> tuple[bool, str | None]:
        """Write our entry if it is not in effect: (whether a file was written, why we wait, if we do).

        A file that changed between our read and our write is read and merged again (`WRITE_ATTEMPTS` in all):
        the other writer's newer file is never replaced by its older content plus our entry.
        """
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            listing = self.listing()
            reason = self.check_config(listing)
            if reason is None:
                return False, None
            try:
                plan = cniconfig.plan_config_write(self.settings, listing, self.entry)
            except cniconfig.CniConfigError as exc:
                raise InstallError(RESULT_CREATE_CNI_CONFIG_FAILURE, f"create CNI config file: {exc}") from None
            if isinstance(plan, cniconfig.Waiting):
                return False, plan.reason
            if self.written is not None:
                log.info("configuration requires updates, (re)writing CNI config file: %s", reason)
            try:
                if (self.written and self.written != plan.final_name and not self.settings.istio_owned
                        and self.settings.chained_cni_plugin):
                    self._leave(self.written)  # the primary moved: leave no entry behind in the old one
                self._write_config(plan, listing)
            except netdir.Changed as exc:
                log.info("%s; reading it again (attempt %d of %d)", exc, attempt, WRITE_ATTEMPTS)
                continue
            except (OSError, ValueError) as exc:
                raise InstallError(RESULT_CREATE_CNI_CONFIG_FAILURE,
                                   f"create CNI config file {plan.target}: {getattr(exc, 'strerror', None) or exc}"
                                   ) from None
            return True, None
        raise InstallError(RESULT_CREATE_CNI_CONFIG_FAILURE,
                           f"create CNI config file: the file kept changing while install-cni merged into it "
                           f"({WRITE_ATTEMPTS} attempts); trying again at its next change")

    def _write_config(self, plan: cniconfig.ConfigWrite, listing: cniconfig.Listing) -> None:
        net_dir = Path(self.options.mounted_cni_net_dir)
        target = net_dir / plan.target
        final = net_dir / plan.final_name
        data = plan.text.encode("utf-8", "surrogateescape")
        mode, owner = self.options.cni_conf_mode, None
        source_bytes = b""
        check = None
        if plan.source is not None:
            source_bytes = (listing.text(plan.source) or "").encode("utf-8", "surrogateescape")
            check = functools.partial(netdir.unchanged_since, net_dir / plan.source, source_bytes)
        if plan.keep_source_mode and plan.source is not None:
            info = (net_dir / plan.source).stat()
            mode, owner = stat.S_IMODE(info.st_mode), (info.st_uid, info.st_gid)
        if plan.rename_to is None and listing.text(plan.target) == plan.text and _mode_of(target) == mode:
            log.info("valid Istio config already present in %s, not modifying", target)
        else:
            binaries.atomic_write(target, data, mode, owner, before_rename=check)
            if plan.rename_to is not None:
                log.info("renaming %s extension to .conflist", target)
                os.rename(target, final)
            log.info("wrote CNI config to %s", final)
        self.written = plan.final_name
        if plan.keep_source_mode and plan.source is not None:
            restorable = not plan.source_had_entry
            self._merged = _Merged(plan.final_name, data, plan.source if restorable else None, source_bytes,
                                   mode, owner)
        else:
            self._merged = None

    def _leave(self, name: str) -> None:
        """Our entry out of the file we merged into before, best effort: what it became is its writer's."""
        try:
            self._take_entry_out(name)
        except (OSError, ValueError) as exc:
            log.warning("could not take the istio-cni entry out of %s: %s", name, _described(exc))

    def _take_entry_out(self, name: str) -> None:
        """Our entry out of a file we merged into (restoring its original bytes when it is as we left it).

        Re-read and done again when the file changes between our read and our write (`WRITE_ATTEMPTS`).
        """
        path = Path(self.options.mounted_cni_net_dir) / name
        for _ in range(WRITE_ATTEMPTS - 1):
            try:
                self._take_entry_out_once(path)
                return
            except netdir.Changed as exc:
                log.info("%s; reading it again", exc)
        self._take_entry_out_once(path)

    def _take_entry_out_once(self, path: Path) -> None:
        try:
            current = netdir.read_bounded(path)
        except FileNotFoundError:
            return
        merged = self._merged
        check = functools.partial(netdir.unchanged_since, path, current)  # just before the rename
        if merged is not None and merged.name == path.name and merged.original_name is not None \
                and current == merged.written:
            original = path.with_name(merged.original_name)
            binaries.atomic_write(original, merged.original, merged.original_mode, merged.original_owner,
                                  before_rename=check)
            if original != path:
                os.unlink(path)
            log.info("restored %s as it was before install", original)
            return
        text = current.decode("utf-8", "surrogateescape")
        config = cniconfig.remove_plugin_entry(text, path.name)  # CniConfigError naming why, if it is no list now
        if not cniconfig.has_plugin_entry(text):
            return
        info = path.stat()
        binaries.atomic_write(path, cniconfig.marshal_config(config).encode("utf-8", "surrogateescape"),
                              stat.S_IMODE(info.st_mode), (info.st_uid, info.st_gid), before_rename=check)
        log.info("removed the istio-cni entry from %s", path)

    def in_effect(self) -> bool:
        """Whether the installation holds as the files are now (for /readyz): our CNI config in effect, the
        executable and the kubeconfig in place. Read-only and bounded (`netdir`'s limits)."""
        plugin = Path(self.options.cni_bin_dir) / binaries.PLUGIN_NAME
        return self.check_config() is None and self.kubeconfig_path.is_file() and plugin.is_file()

    # ---- all of it
    def install_all(self) -> StepOutcome:
        """Upstream's installAll: binaries, kubeconfig, CNI config; InstallError at the first failure."""
        changed = []
        if self.sync_binary():
            changed.append("binary")
        if self.sync_kubeconfig():
            changed.append("kubeconfig")
        wrote, waiting = self.sync_config()
        if wrote:
            changed.append("config")
        if waiting is not None:
            return StepOutcome(False, changed, waiting)
        ready = (binaries.plugin_installed(self.launcher(), self.options.cni_bin_dir)
                 and self.kubeconfig_path.is_file() and self.check_config() is None)
        return StepOutcome(ready, changed)

    def cleanup(self) -> None:
        """Remove our CNI config (entry or file), the kubeconfig and the executable.

        Each step runs whatever the steps before it met (a file that no longer parses, one too large to
        read, a directory gone): its error is logged and the rest is still removed.
        """
        log.info("cleaning up CNI installation")
        if self.written is not None:
            path = Path(self.options.mounted_cni_net_dir) / self.written
            try:
                if cniconfig.cleanup_deletes_file(self.settings, self.written):
                    if path.exists():
                        log.info("removing Istio CNI config file: %s", path)
                        path.unlink()
                else:
                    log.info("removing Istio CNI config from CNI config file: %s", path)
                    self._take_entry_out(self.written)
            except Exception as exc:  # whatever it was, the kubeconfig and binary still go
                log.error("cleanup of %s failed: %s", path, _described(exc))
        try:
            self.kubeconfig_path.unlink()
            log.info("removed Istio CNI kubeconfig file: %s", self.kubeconfig_path)
        except FileNotFoundError:
            pass
        except Exception as exc:
            log.error("removing the kubeconfig %s failed: %s", self.kubeconfig_path, _described(exc))
        try:
            if binaries.remove_plugin(self.options.cni_bin_dir):
                log.info("removed binary: %s", Path(self.options.cni_bin_dir) / binaries.PLUGIN_NAME)
        except Exception as exc:
            log.error("removing the binary failed: %s", _described(exc))


def _described(exc: BaseException) -> str:
    """An error for the log, in one line: the OS's words for an OSError, else its type and message."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, cniconfig.CniConfigError) else str(exc)


def _mode_of(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return -1


def watched_directories(options: InstallOptions, access: KubeAccess | None) -> dict[str, frozenset[str] | None]:
    """The net dir (everything), the bin dir (our executable only), the token dir and the CA's directory."""
    directories: dict[str, frozenset[str] | None] = {
        options.mounted_cni_net_dir: None,
        options.cni_bin_dir: frozenset({binaries.PLUGIN_NAME}),
        options.service_account_dir: None,
    }
    if access is not None:
        for path in (access.token_file, access.ca_file):
            folder = os.path.dirname(path) or "."
            if folder not in directories:
                directories[folder] = frozenset({os.path.basename(path)})
    return directories


async def wait_for_config(installer: Installer, watcher: DirectoryWatcher, recheck: float = RECHECK_INTERVAL) -> str:
    """Write our CNI config, waiting (chained mode) for a primary file to appear; the file written."""
    while True:
        _, waiting = installer.sync_config()
        if waiting is None:
            assert installer.written is not None
            return installer.written
        log.info("waiting for a CNI network config in %s: %s", installer.options.mounted_cni_net_dir, waiting)
        watcher.ensure_watches()
        await watcher.wait(recheck)


async def keep_installed(installer: Installer, watcher: DirectoryWatcher, on_state: Callable[[StepOutcome], None],
                         on_failure: Callable[[InstallError], None], recheck: float = RECHECK_INTERVAL,
                         clock: Callable[[], float] = time.monotonic) -> None:
    """Install, then reinstall on every relevant change (or each `recheck` seconds) until cancelled; a failed
    installation (InstallError) is reported through `on_failure` and ends the loop with it, as upstream's
    installer returns its error and install-cni exits."""
    throttle = ReinstallThrottle()
    waiting_logged = ""
    while True:
        watcher.ensure_watches()
        try:
            outcome = installer.install_all()
        except InstallError as exc:
            on_failure(exc)
            raise  # as upstream's installer: the node agent cleans up and exits 1 (the kubelet restarts it)
        if outcome.waiting and outcome.waiting != waiting_logged:
            log.warning("Istio CNI is configured as chained plugin, but cannot find existing CNI network config: %s;"
                        " waiting for one in %s", outcome.waiting, installer.options.mounted_cni_net_dir)
        waiting_logged = outcome.waiting or ""
        if outcome.changed:
            now = clock()
            if throttle.record(now):
                log.warning("configuration has been reconciled multiple times in a short period of time; "
                            "a conflicting component may be reverting our work")
        on_state(outcome)
        await watcher.wait(recheck)
        delay = throttle.delay(clock())
        if delay > 0:
            await asyncio.sleep(delay)
