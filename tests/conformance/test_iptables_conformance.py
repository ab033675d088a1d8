"""istio-iptables against upstream's golden dry-run recordings (conformance/iptables).

Every case is run three ways and must match its golden byte for byte (after
the kit's whitespace rule): through the installed `istio-iptables` script
with the case's env, `DRY_RUN_FILE_PATH` and the host facts pinned by
`--enable-ipv6` / `--dns-servers`; through the library from the kit's
`config` object; and, where the kit supplies a resolv.conf body, through the
resolv.conf reader instead of `--dns-servers`. The goldens are read from the
kit at test time, never copied.
"""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from needs import need, need_conformance
from support import CONFORMANCE, VENV_BIN, conformance_cases

KIT = CONFORMANCE / "iptables"


CASES = conformance_cases("iptables")
IDS = [c["name"] for c in CASES]


def golden(case: dict[str, Any]) -> str:
    return (KIT / case["golden"]).read_text().strip()


def pinned_args(case: dict[str, Any], with_servers: bool = True) -> list[str]:
    facts = case["host_facts"]
    args = [*case["args"], f"--enable-ipv6={'true' if facts['enable_ipv6'] else 'false'}"]
    if with_servers and facts["resolv_conf"] is not None:
        args.append("--dns-servers=" + ",".join(facts["dns_servers_v4"] + facts["dns_servers_v6"]))
    return args


@pytest.fixture(autouse=True)
def _kit() -> None:
    need_conformance("iptables")
    need(bool(CASES), "conformance/iptables/cases.json holds no cases")


def test_kit_is_complete() -> None:
    assert all((KIT / c["golden"]).exists() for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cli_dry_run_matches_golden(case: dict[str, Any], tmp_path: Path) -> None:
    script = VENV_BIN / "istio-iptables"
    need(script.exists(), "istio-iptables console script not installed")
    out = tmp_path / "dry-run.txt"
    out.write_text("")
    env = {"PATH": os.environ.get("PATH", ""), **case["env"], "DRY_RUN_FILE_PATH": str(out)}
    result = subprocess.run([str(script), *pinned_args(case)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # the recording goes to the file only
    assert out.read_text().strip() == golden(case)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_function_style_matches_golden(case: dict[str, Any]) -> None:
    from istio_agent.capture.config import from_upstream_json
    from istio_agent.capture.iptables_text import dry_run_record
    from istio_agent.capture.rules import build_rules
    from istio_agent.capture.validation import validate

    cfg = from_upstream_json(case["config"])
    validate(cfg)
    lines = dry_run_record(build_rules(cfg), cfg.ipv6)
    assert "\n".join(lines).strip() == golden(case)


@pytest.mark.parametrize("case", [c for c in CASES if c["host_facts"]["resolv_conf"] is not None],
                         ids=[c["name"] for c in CASES if c["host_facts"]["resolv_conf"] is not None])  # fmt: skip
def test_resolv_conf_route(case: dict[str, Any], tmp_path: Path) -> None:
    """DNS servers read from a resolv.conf body; only dns-uid-gid differs, as the kit documents."""
    from istio_agent.capture.program import execute
    from istio_agent.cli.iptables import build_config

    resolv = tmp_path / "resolv.conf"
    resolv.write_text(case["host_facts"]["resolv_conf"])
    env = {**case["env"]}
    cfg, _ = build_config(pinned_args(case, with_servers=False), env)
    out = io.StringIO()
    assert execute(cfg, env, out, log=lambda _: None, resolv_conf=str(resolv)) == 0
    want = golden(case)
    if not case["cli_reproducible_exactly"]:
        # Read back from resolv.conf the server is printed canonically, as upstream's CLI would.
        want = want.replace("::127.0.0.53/", "::7f00:35/")
        assert want != golden(case)
    assert out.getvalue().strip() == want


def test_click_command_gives_the_same_recording(tmp_path: Path) -> None:
    """`pilot-agent istio-iptables` uses the lazily built click command; it must behave like main()."""
    from click.testing import CliRunner

    from istio_agent.cli import iptables

    case = next(c for c in CASES if c["name"] == "tproxy")
    out = tmp_path / "dry-run.txt"
    env = {**case["env"], "DRY_RUN_FILE_PATH": str(out)}
    result = CliRunner().invoke(iptables.command, pinned_args(case), env=env)
    assert result.exit_code == 0, result.output
    assert out.read_text().strip() == golden(case)


def test_dry_run_without_file_path_prints_to_stdout() -> None:
    case = next(c for c in CASES if c["name"] == "empty")
    script = VENV_BIN / "istio-iptables"
    need(script.exists(), "istio-iptables console script not installed")
    env = {"PATH": os.environ.get("PATH", ""), **case["env"]}
    result = subprocess.run([str(script), *pinned_args(case)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == golden(case)
