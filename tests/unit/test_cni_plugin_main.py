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


def test_deep_stdin_is_a_decoding_error_object_not_a_traceback() -> None:
    """100 KB of `[` (and a config whose prevResult nests past the limit) is code 6 naming the limit, with the
    error object on stdout, for every command that reads the config; VERSION still answers."""
    for stdin in (b"[" * 100_000, json.dumps({"cniVersion": "1.0.0", "name": "n", "prevResult": {"ips": []}})
                  .encode().replace(b'"ips": []', b'"ips": ' + b"[" * 200 + b"]" * 200)):
        for command in ("ADD", "DEL", "CHECK"):
            code, out, err = invoke({**ENV, "CNI_COMMAND": command}, stdin)
            body = json.loads(out)
            assert code == 1 and body["code"] == 6 and "nested deeper than 128 levels" in body["msg"], body
            assert "Traceback" not in err
    code, out, _ = invoke({"CNI_COMMAND": "VERSION"}, b"{" * 100_000)
    assert code == 0 and json.loads(out)["cniVersion"] == "1.1.0"


def test_a_prev_result_as_deep_as_the_limit_is_passed_through() -> None:
    deep: object = []
    for _ in range(125):  # 126 lists, in prevResult in the config: 128 levels
        deep = [deep]
    config = {"cniVersion": "1.0.0", "name": "n", "prevResult": {"ips": deep}}
    code, out, _ = invoke(ENV, json.dumps(config).encode())
    assert code == 0 and json.loads(out) == {"cniVersion": "1.0.0", "ips": deep}
