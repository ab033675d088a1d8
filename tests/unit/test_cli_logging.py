"""pilot-agent's root logging flags: accepted before or after any subcommand, the subcommand's value winning."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from istio_agent.cli.logging_setup import LogOptions, configure_logging, scope_levels
from istio_agent.cli.pilot_agent import main


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    agent_level = logging.getLogger("istio_agent").level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("istio_agent").setLevel(agent_level)
    logging.getLogger("istio_agent.xds").setLevel(logging.NOTSET)


def test_scope_levels_use_istios_scope_names() -> None:
    assert scope_levels("default:debug,ads:error,unknown:warn") == {
        "istio_agent": logging.DEBUG, "istio_agent.xds": logging.ERROR, "istio_agent.unknown": logging.WARNING}
    assert scope_levels("warn") == {"istio_agent": logging.WARNING}


@pytest.mark.parametrize("args", [
    ["--log_output_level=default:debug", "version", "-s"],
    ["version", "--log_output_level=default:debug", "-s"],
    ["--log_output_level=default:error", "version", "--log_output_level=default:debug", "-s"],
])
def test_the_root_flags_work_before_and_after_the_subcommand(args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert logging.getLogger("istio_agent").level == logging.DEBUG


def test_targets_callers_and_stack_traces(tmp_path: Path) -> None:
    target = tmp_path / "agent.log"
    result = CliRunner().invoke(main, ["--log_target", str(target), "--log_caller=ads",
                                       "--log_stacktrace_level=ads:error", "--log_as_json", "version", "-s"])
    assert result.exit_code == 0, result.output
    logging.getLogger("istio_agent.xds").error("upstream gone")
    logging.getLogger("istio_agent.dns").warning("no caller here")
    entries = [json.loads(line) for line in target.read_text().splitlines()]
    assert entries[0]["msg"] == "upstream gone" and entries[0]["caller"].startswith("test_cli_logging.py:")
    assert "test_targets_callers_and_stack_traces" in entries[0]["stack"]
    assert "caller" not in entries[1] and "stack" not in entries[1]


def test_plain_text_lines_carry_the_caller_only_for_listed_scopes(tmp_path: Path) -> None:
    target = tmp_path / "plain.log"
    configure_logging(LogOptions(targets=(str(target),), callers=("dns",)))
    logging.getLogger("istio_agent.dns").info("answered")
    logging.getLogger("istio_agent.xds").info("pushed")
    first, second = target.read_text().splitlines()
    assert "\tistio_agent.dns\ttest_cli_logging.py:" in first and first.endswith("answered")
    assert second.endswith("\tistio_agent.xds\tpushed")
