"""The light `pilot-agent proxy` parser against click's parse of the same lines (click is the reference)."""

from __future__ import annotations

from typing import Any

import pytest

from istio_agent.cli import pilot_agent, proxy_argv

TAKEN = [
    [],
    ["proxy"],
    ["proxy", "sidecar", "--domain", "default.svc.cluster.local", "--proxyLogLevel=warning",
     "--proxyComponentLogLevel=misc:error", "--log_output_level=default:info"],  # Istio's sidecar template
    ["proxy", "router", "--domain", "istio-system.svc.cluster.local", "--proxyLogLevel=warning",
     "--proxyComponentLogLevel=misc:error", "--log_output_level=default:info"],  # gateways
    ["proxy", "--concurrency", "2", "sidecar", "--concurrency=3"],  # the last occurrence wins
    ["proxy", "--log_as_json", "--log_target", "stderr", "--log_target=/tmp/a.log", "--log_caller", "ads,sds"],
    ["--log_output_level=default:debug", "--log_as_json", "proxy", "--log_stacktrace_level=default:error"],
    ["--log_output_level=default:debug", "--log_target", "stderr", "proxy", "--log_output_level", "ads:debug"],
    ["proxy", "--domain=", "--meshConfig", "/etc/mesh", "--serviceCluster", "c", "--templateFile", "/t.json",
     "--outlierLogPath=/o", "--stsPort", "15463", "--tokenManagerPlugin", "x", "--profiling=false"],
    ["proxy", "--concurrency= 4 "],  # int() strips, as click's does
]

DECLINED = [
    ["proxy", "--help"],
    ["proxy", "-h"],
    ["--help"],
    ["version"],
    ["proxy", "--unknownFlag=1"],
    ["proxy", "--unknownFlag", "sidecar"],
    ["proxy", "-domain", "x"],
    ["proxy", "--", "sidecar"],
    ["proxy", "--domain"],
    ["proxy", "--domain", "--proxyLogLevel=debug"],
    ["proxy", "--concurrency", "two"],
    ["proxy", "--log_as_json=true"],
    ["proxy", "sidecar", "extra"],
    ["--domain=x", "proxy"],  # a proxy flag on the root
    ["wait", "proxy"],
]


def clicks(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """What click's group hands to run_proxy for `argv`."""
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(pilot_agent, "configure_logging", lambda *_a, **_k: None)
    monkeypatch.setattr(pilot_agent, "run_proxy", lambda *args: seen.append(args))
    pilot_agent.main.main(args=argv or ["proxy"], prog_name="pilot-agent", standalone_mode=False)
    assert len(seen) == 1
    proxy_type, flags, log_options, unknown = seen[0]
    return proxy_type, dict(flags), log_options, list(unknown)


@pytest.mark.parametrize("argv", TAKEN, ids=lambda a: " ".join(a) or "(none)")
def test_taken_lines_parse_as_click_parses_them(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    call = proxy_argv.parse(argv or ["proxy"])
    assert call is not None
    proxy_type, flags, log_options, unknown = clicks(argv, monkeypatch)
    assert (call.proxy_type, call.flags, call.log_options) == (proxy_type, flags, log_options)
    assert unknown == []


@pytest.mark.parametrize("argv", DECLINED, ids=" ".join)
def test_other_lines_are_left_to_click(argv: list[str]) -> None:
    assert proxy_argv.parse(argv) is None


def test_unknown_arguments_still_reach_the_agent_through_click(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy_type, _, _, unknown = clicks(["proxy", "sidecar", "extra", "--unknownFlag=1"], monkeypatch)
    assert proxy_type == "sidecar" and unknown == ["extra", "--unknownFlag=1"]
