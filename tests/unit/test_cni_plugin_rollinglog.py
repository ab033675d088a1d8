"""The plugin's `istio-cni.log` (upstream's rolling local log): ADD's entries at info and above, JSON lines, in
`<cni_agent_run_dir>`, rolled over past 10 MB into one dated backup, none kept beyond 2 days, files 0600."""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path

import pytest

from istio_agent.cni.plugin import rollinglog
from istio_agent.cni.plugin.main import run
from istio_agent.cni.plugin.rollinglog import LOG_NAME, append, backup_name, backup_time, stale_backups

ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c", "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "eth0",
       "CNI_PATH": "/p", "CNI_ARGS": "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=sys-1"}
DAY = 24 * 3600.0


def _invoke(run_dir: Path, command: str = "ADD", level: str = "debug") -> int:
    config = {"cniVersion": "1.0.0", "name": "n", "type": "istio-cni", "plugin_log_level": level,
              "cni_agent_run_dir": str(run_dir), "exclude_namespaces": ["kube-system"], "prevResult": {"ips": []}}
    return run({**ENV, "CNI_COMMAND": command}, json.dumps(config).encode(), io.BytesIO(), io.StringIO())


def test_add_writes_its_entries_at_info_and_above_to_the_run_dir(tmp_path: Path) -> None:
    assert _invoke(tmp_path) == 0
    lines = (tmp_path / LOG_NAME).read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    assert [e["msg"] for e in entries] == ["pod namespace kube-system excluded"]  # the debug lines are not kept
    assert entries[0]["level"] == "info" and entries[0]["pod"] == "kube-system/sys-1" and entries[0]["time"]
    assert stat.S_IMODE((tmp_path / LOG_NAME).stat().st_mode) == 0o600
    assert _invoke(tmp_path) == 0
    assert len((tmp_path / LOG_NAME).read_text().splitlines()) == 2  # appended


def test_other_commands_and_a_quieter_plugin_level_write_nothing(tmp_path: Path) -> None:
    assert _invoke(tmp_path, "DEL") == 0 and _invoke(tmp_path, "CHECK") == 0
    assert _invoke(tmp_path, level="warn") == 0
    assert not (tmp_path / LOG_NAME).exists()


def test_backups_are_named_by_their_utc_time_in_milliseconds() -> None:
    now = 1767225600.25  # 2026-01-01T00:00:00.250Z
    name = backup_name("/run/istio-cni/istio-cni.log", now)
    assert name == "/run/istio-cni/istio-cni-2026-01-01T00-00-00.250.log"
    assert backup_time(Path(name).name, "istio-cni-", ".log") == now
    assert backup_time("istio-cni-kubeconfig", "istio-cni-", ".log") is None
    assert backup_time("istio-cni-2026-01-01T00-00-00.log", "istio-cni-", ".log") is None


def test_one_backup_is_kept_and_none_older_than_two_days() -> None:
    now = 1767225600.0
    names = [Path(backup_name("istio-cni.log", now - age)).name for age in (10, 20, 3 * DAY)]
    names.append("istio-cni.log")
    assert stale_backups(names, "istio-cni-", ".log", now) == names[1:3]
    assert stale_backups(names[2:3], "istio-cni-", ".log", now) == names[2:3]  # the only one, but too old


def test_the_file_rolls_over_before_a_write_that_would_pass_the_limit(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rollinglog, "MAX_BYTES", 100)
    path = str(tmp_path / LOG_NAME)
    assert append(path, ["a" * 40], now=1000.0) and append(path, ["b" * 40], now=1001.0)
    assert append(path, ["c" * 40], now=1002.0)  # 123 bytes would not fit: the first two go to a backup
    backups = sorted(p.name for p in tmp_path.iterdir() if p.name != LOG_NAME)
    assert backups == [Path(backup_name(path, 1002.0)).name]
    assert (tmp_path / backups[0]).read_text() == "a" * 40 + "\n" + "b" * 40 + "\n"
    assert (tmp_path / LOG_NAME).read_text() == "c" * 40 + "\n"
    assert append(path, ["d" * 70], now=1003.0)  # rolls again: the older backup goes
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != LOG_NAME) == [Path(backup_name(path, 1003.0)).name]


def test_a_log_that_cannot_be_written_is_not_an_error(tmp_path: Path) -> None:
    assert append(str(tmp_path / "absent" / LOG_NAME), ["x"]) is False
    assert append(str(tmp_path / LOG_NAME), []) is True and not (tmp_path / LOG_NAME).exists()
