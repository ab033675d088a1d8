"""istio-cni's edge with its I/O handed in: stdin errors, exit codes and the one JSON document on stdout."""

from __future__ import annotations

import io
import json

from istio_agent.cni.plugin.main import run

ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c", "CNI_NETNS": "/x", "CNI_IFNAME": "eth0", "CNI_PATH": "/p"}


def invoke(env: dict[str, str], stdin: bytes | OSError) -> tuple[int, bytes, str]:
    out, err = io.BytesIO(), io.StringIO()
    code = run(env, stdin, out, err)
    return code, out.getvalue(), err.getvalue()


def test_unreadable_stdin_is_an_io_failure() -> None:
    code, out, err = invoke(ENV, OSError(5, "Input/output error"))
    assert code == 1 and json.loads(out)["code"] == 5 and "stdin" in json.loads(out)["msg"]
    assert "stdin" in err


def test_version_does_not_need_stdin() -> None:
    code, out, _ = invoke({"CNI_COMMAND": "VERSION"}, OSError(5, "Input/output error"))
    assert code == 0 and json.loads(out)["cniVersion"] == "1.1.0"


def test_non_kubernetes_add_passes_the_previous_result_and_logs_nothing_to_stdout() -> None:
    config = {"cniVersion": "0.4.0", "name": "n", "prevResult": {"ips": []}}
    code, out, err = invoke(ENV, json.dumps(config).encode())
    assert code == 0 and json.loads(out) == {"cniVersion": "0.4.0", "ips": []}
    assert all(json.loads(line)["level"] in ("debug", "info") for line in err.splitlines())


def test_errors_carry_the_config_version() -> None:
    code, out, _ = invoke({**ENV, "CNI_NETNS": ""}, json.dumps({"cniVersion": "0.4.0", "name": "n"}).encode())
    assert code == 1 and json.loads(out) == {"cniVersion": "0.4.0", "code": 4,
                                             "msg": "required env variables [CNI_NETNS] missing"}
