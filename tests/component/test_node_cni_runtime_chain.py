"""The CNI runtime running chains of real executables (no root): order, prevResult, cache, DEL, CHECK, errors.

The plugins are one small Python program installed under several names in a
CNI_PATH directory: it records what it was given (its name, the CNI
environment, its stdin) and answers as a chained plugin does, or with the
error object its config asks for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from istiod_local.node.cni_runtime import (
    CniConfigError,
    CniExecError,
    CniRuntime,
    PluginError,
    RuntimeConf,
    load_network_file,
    parse_network,
)

RECORDER = f"""#!{sys.executable}
import json, os, sys
config = json.load(sys.stdin)
me = os.path.basename(sys.argv[0])
cni = {{k: v for k, v in os.environ.items() if k.startswith("CNI_")}}
if "log" in config:
    with open(config["log"], "a") as log:
        log.write(json.dumps({{"plugin": me, "env": cni, "config": config}}) + "\\n")
if cni["CNI_COMMAND"] == "VERSION":
    print(json.dumps({{"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0"]}}))
    sys.exit(0)
fail = config.get("fail", {{}}).get(cni["CNI_COMMAND"])
if fail:
    print(json.dumps({{"cniVersion": config["cniVersion"], **fail}}))
    sys.exit(1)
if cni["CNI_COMMAND"] == "ADD":
    result = config.get("prevResult") or {{"cniVersion": config["cniVersion"], "interfaces": [], "ips": []}}
    result["interfaces"].append({{"name": me}})
    print(json.dumps(result))
"""


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("rec-a", "rec-b", "rec-c"):
        (folder / name).write_text(RECORDER)
        (folder / name).chmod(0o755)
    return folder


def _calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _network(log: Path, version: str = "1.0.0", **extra: Any) -> Any:
    plugins = [{"type": "rec-a", "log": str(log), "capabilities": {"ips": True}},
               {"type": "rec-b", "log": str(log), **extra},
               {"type": "rec-c", "log": str(log)}]
    return parse_network(json.dumps({"cniVersion": version, "name": "testnet", "plugins": plugins}))


RT = RuntimeConf("ctr1", "/var/run/netns/nowhere", "eth0", (("IgnoreUnknown", "1"), ("K8S_POD_NAME", "p")),
                 {"ips": ["10.9.0.5/24"]})


def test_add_runs_the_chain_in_order_feeding_each_the_previous_result_and_caches_the_last(
        tmp_path: Path, bin_dir: Path) -> None:
    log = tmp_path / "calls.log"
    runtime = CniRuntime([tmp_path / "missing", bin_dir], tmp_path / "cache", base_env={"PATH": "/usr/bin"})
    result = runtime.add(_network(log), RT)
    assert [i["name"] for i in result["interfaces"]] == ["rec-a", "rec-b", "rec-c"]
    calls = _calls(log)
    assert [c["plugin"] for c in calls] == ["rec-a", "rec-b", "rec-c"]
    assert "prevResult" not in calls[0]["config"]
    assert [i["name"] for i in calls[2]["config"]["prevResult"]["interfaces"]] == ["rec-a", "rec-b"]
    assert calls[0]["config"]["runtimeConfig"] == {"ips": ["10.9.0.5/24"]}
    assert "runtimeConfig" not in calls[1]["config"]
    assert all(c["config"]["name"] == "testnet" and c["config"]["cniVersion"] == "1.0.0" for c in calls)
    assert calls[0]["env"] == {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr1", "CNI_NETNS": "/var/run/netns/nowhere",
                               "CNI_IFNAME": "eth0", "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=p",
                               "CNI_PATH": f"{tmp_path / 'missing'}:{bin_dir}"}
    cached = tmp_path / "cache" / "results" / "testnet-ctr1-eth0"
    assert (cached.stat().st_mode & 0o777) == 0o600
    assert json.loads(cached.read_text())["result"] == result
    assert runtime.cached_result(_network(log), RT) == result


def test_check_feeds_the_cached_result_and_del_runs_in_reverse_then_drops_the_cache(
        tmp_path: Path, bin_dir: Path) -> None:
    log = tmp_path / "calls.log"
    runtime = CniRuntime([bin_dir], tmp_path / "cache")
    network = _network(log)
    result = runtime.add(network, RT)
    log.unlink()
    runtime.check(network, RT)
    checks = _calls(log)
    assert [c["plugin"] for c in checks] == ["rec-a", "rec-b", "rec-c"]
    assert all(c["config"]["prevResult"] == result and c["env"]["CNI_COMMAND"] == "CHECK" for c in checks)
    log.unlink()
    runtime.delete(network, RT)
    deletes = _calls(log)
    assert [c["plugin"] for c in deletes] == ["rec-c", "rec-b", "rec-a"]
    assert all(c["config"]["prevResult"] == result for c in deletes)
    assert not runtime.cache_path(network, RT).exists()
    log.unlink()
    runtime.delete(network, RT)  # nothing cached any more: DEL still runs every plugin, without prevResult
    assert [("prevResult" in c["config"]) for c in _calls(log)] == [False, False, False]


def test_an_error_object_stops_the_chain_and_names_the_plugin_code_and_msg(tmp_path: Path, bin_dir: Path) -> None:
    log = tmp_path / "calls.log"
    runtime = CniRuntime([bin_dir], tmp_path / "cache")
    network = _network(log, fail={"ADD": {"code": 7, "msg": "bad annotation", "details": "excludeInterfaces"}})
    with pytest.raises(PluginError) as caught:
        runtime.add(network, RT)
    assert (caught.value.plugin, caught.value.code, caught.value.msg, caught.value.details) == (
        "rec-b", 7, "bad annotation", "excludeInterfaces")
    assert [c["plugin"] for c in _calls(log)] == ["rec-a", "rec-b"]  # rec-c never ran
    assert not runtime.cache_path(network, RT).exists()  # a failed ADD caches nothing


def test_check_is_refused_below_0_4_0_and_old_lists_get_no_cached_prev_result_on_del(
        tmp_path: Path, bin_dir: Path) -> None:
    log = tmp_path / "calls.log"
    runtime = CniRuntime([bin_dir], tmp_path / "cache")
    network = _network(log, version="0.3.1")
    runtime.add(network, RT)
    with pytest.raises(CniConfigError, match=r"0\.3\.1 does not support CHECK"):
        runtime.check(network, RT)
    log.unlink()
    runtime.delete(network, RT)
    assert [("prevResult" in c["config"]) for c in _calls(log)] == [False, False, False]
    assert not runtime.cache_path(network, RT).exists()


def test_a_corrupt_cache_is_dropped_on_del_and_a_missing_plugin_is_named(tmp_path: Path, bin_dir: Path) -> None:
    log = tmp_path / "calls.log"
    runtime = CniRuntime([bin_dir], tmp_path / "cache")
    network = _network(log)
    runtime.add(network, RT)
    runtime.cache_path(network, RT).write_text("{not json")
    runtime.delete(network, RT)
    assert not runtime.cache_path(network, RT).exists()
    missing = parse_network(json.dumps({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "nope"}]}))
    with pytest.raises(CniExecError, match="failed to find plugin 'nope'"):
        runtime.add(missing, RT)
    assert runtime.versions("rec-a") == ["0.4.0", "1.0.0"]


def test_files_load_by_extension(tmp_path: Path) -> None:
    conf = tmp_path / "10-a.conf"
    conf.write_text(json.dumps({"cniVersion": "1.0.0", "name": "a", "type": "bridge", "plugins": "ignored"}))
    assert [p.type for p in load_network_file(conf).plugins] == ["bridge"]  # .conf: a single plugin
    with pytest.raises(CniConfigError, match=r"10-b\.conflist"):
        load_network_file(tmp_path / "10-b.conflist")
