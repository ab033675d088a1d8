"""One `istio-iptables` run: validate, resolve host facts, build, then record or apply.

This is the thin I/O shell around the pure parts (`validation`, `rules`,
`iptables_text`, `nft`). Exit codes follow upstream: 0 on success, 1 for any
configuration or apply error (nothing is applied when the configuration is
invalid), 126 when `--run-validation` finds that redirection does not work.
"""

from __future__ import annotations

import sys

from istio_agent.capture.config import CaptureConfig
from istio_agent.capture.hostfacts import HostFactError, default_proxy_uid, detect_ipv6, read_dns_servers
from istio_agent.capture.iptables_text import dry_run_record
from istio_agent.capture.rules import RuleSet, build_rules
from istio_agent.capture.validation import validate

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import TextIO

    Log = Callable[[str], None]

VALIDATION_ERROR_CODE = 126
RESOLV_CONF = "/etc/resolv.conf"


def stderr_log(message: str) -> None:
    sys.stderr.write(f"istio-iptables: {message}\n")


def resolve_host_facts(cfg: CaptureConfig, env: Mapping[str, str], resolv_conf: str = RESOLV_CONF) -> CaptureConfig:
    """Fill what upstream reads from the host: proxy uid/gid, IPv6 mode, DNS servers."""
    changes: dict[str, object] = {}
    uid = cfg.proxy_uid or default_proxy_uid(env)
    if uid != cfg.proxy_uid:
        changes["proxy_uid"] = uid
    if not cfg.proxy_gid:
        changes["proxy_gid"] = uid
    if cfg.enable_ipv6 is None:
        try:
            changes["enable_ipv6"] = detect_ipv6(cfg.dual_stack)
        except HostFactError:
            if not cfg.cleanup_only:  # cleanup removes both families whatever the host looks like
                raise
            changes["enable_ipv6"] = False
    if cfg.redirect_dns and not cfg.capture_all_dns and cfg.dns_servers_v4 is None and cfg.dns_servers_v6 is None:
        changes["dns_servers_v4"], changes["dns_servers_v6"] = read_dns_servers(resolv_conf)
    return cfg.replace(**changes) if changes else cfg


def dry_run_output(cfg: CaptureConfig, ruleset: RuleSet) -> str:
    """What a dry run records: upstream's stub lines, or the nftables script."""
    if cfg.native_nftables:
        from istio_agent.capture.nft import cleanup_script, nft_script

        return cleanup_script() if cfg.cleanup_only else nft_script(ruleset)
    lines = dry_run_record(ruleset, cfg.ipv6, cleanup_only=cfg.cleanup_only)
    return "".join(f"{line}\n" for line in lines)


def write_dry_run(text: str, env: Mapping[str, str], stdout: TextIO) -> None:
    """Upstream's hook: DRY_RUN_FILE_PATH names the recording file; else stdout."""
    path = env.get("DRY_RUN_FILE_PATH", "")
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        stdout.write(text)
        stdout.flush()


def apply_nftables(ruleset: RuleSet, cleanup_only: bool, log: Log) -> None:
    from istio_agent.capture.nft import cleanup_script, nft_script
    from istio_agent.capture.procs import run

    script = cleanup_script() if cleanup_only else nft_script(ruleset)
    run(["nft", "-f", "-"], stdin=script.encode(), check=True)
    log("removed nftables rules" if cleanup_only else "applied nftables rules atomically")


def _inbound_ipv6_added() -> bool:
    """`::6/128` on lo over rtnetlink (True also when it was there); False: let `ip` try, and report its error."""
    from istio_agent.capture.loopback import add_address

    try:
        add_address("lo", b"\x00" * 15 + b"\x06", 128)
    except OSError:
        return False
    return True


def configure_routes(cfg: CaptureConfig, log: Log) -> None:
    """`::6` on lo for IPv6 pods; for TPROXY, the fwmark rule and local default route."""
    from istio_agent.capture.procs import run

    if cfg.ipv6 and not _inbound_ipv6_added():
        result = run(["ip", "-6", "addr", "add", "::6/128", "dev", "lo"])
        if not result.ok and b"inet6 ::6/128" not in run(["ip", "-6", "addr", "show", "dev", "lo"]).stdout:
            raise RuntimeError(f"failed to add IPv6 inbound address: {result.describe()}")
    if not (cfg.tproxy and cfg.inbound_ports_include):
        return
    mark, table = cfg.inbound_tproxy_mark, cfg.inbound_tproxy_route_table
    for family, default in [("inet", "0.0.0.0/0"), *([("inet6", "::/0")] if cfg.ipv6 else [])]:
        shown = run(["ip", "-f", family, "rule", "show", "fwmark", mark, "lookup", table], check=True)
        if not shown.stdout.strip():
            run(["ip", "-f", family, "rule", "add", "fwmark", mark, "lookup", table], check=True)
        result = run(["ip", "-f", family, "route", "add", "local", default, "dev", "lo", "table", table])
        if not result.ok and b"exists" not in result.stderr:
            raise RuntimeError(f"failed to add route: {result.describe()}")
    log(f"TPROXY routing: fwmark {mark} -> table {table}")


def execute(
    cfg: CaptureConfig,
    env: Mapping[str, str],
    stdout: TextIO | None = None,
    log: Log = stderr_log,
    resolv_conf: str = RESOLV_CONF,
) -> int:
    """Run `istio-iptables` for `cfg`; ConfigError/HostFactError propagate before anything is applied."""
    validate(cfg)
    if cfg.network_namespace and not cfg.dry_run:
        from istio_agent.capture.netns import enter_netns

        enter_netns(cfg.network_namespace)
    cfg = resolve_host_facts(cfg, env, resolv_conf)
    validate(cfg)  # host facts are inputs too (resolv.conf, passwd)
    ruleset = build_rules(cfg)
    if cfg.skip_rule_apply:
        pass  # nothing recorded or applied (upstream's dry run records nothing either); validation may still run
    elif cfg.dry_run:
        write_dry_run(dry_run_output(cfg, ruleset), env, stdout or sys.stdout)
    else:
        if cfg.native_nftables:
            apply_nftables(ruleset, cfg.cleanup_only, log)
        else:
            from istio_agent.capture.apply import apply_iptables

            apply_iptables(
                ruleset,
                log,
                force_binary=cfg.force_iptables_binary,
                reconcile=cfg.reconcile,
                cleanup_only=cfg.cleanup_only,
                force_apply=cfg.force_apply,
            )
        if not cfg.cleanup_only:
            configure_routes(cfg, log)
    if cfg.run_validation:
        from istio_agent.capture.probe import run_validation

        if not run_validation(cfg, log):
            log(
                "iptables validation failed; workload is not ready for Istio. With Istio CNI this can happen "
                "when a pod is scheduled before the node is ready; the pod must be recreated."
            )
            return VALIDATION_ERROR_CODE
    return 0
