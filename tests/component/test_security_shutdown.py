"""SIGTERM while the workload key is being generated: the agent exits at once, with the drain's exit code.

A key generation can take minutes (a large RSA key on a busy core). The agent
generates keys on a daemon thread, which a stop abandons and the interpreter
does not join at exit. To have a generation that is surely still running when
the signal arrives, a start-up hook (`sitecustomize` on PYTHONPATH) replaces the
key generator of the real `pilot-agent` with a CPU-bound job that releases the
GIL, as OpenSSL's prime search does, and would run for hours.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from fixtures import AgentStarter
from launchers import agent_environment
from support import free_port, poll

HOOK = '''
import hashlib
import sys

import istio_agent.pki.keys as keys


def generate_for_hours(*args, **kwargs):
    print("test hook: key generation started", file=sys.stderr, flush=True)
    hashlib.pbkdf2_hmac("sha256", b"key", b"salt", 2_000_000_000)  # in OpenSSL, GIL released: CPU-bound, ~20 min
    raise AssertionError("not reached")


keys.generate_key = generate_for_hours
'''


def test_sigterm_during_key_generation_exits_within_the_drain(tmp_path: Path, start_agent: AgentStarter) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    pod = tmp_path / "pod"
    pod.mkdir()
    status_port = free_port()
    environment = agent_environment(
        pod="sleep-1", service_account="sleep", discovery=f"127.0.0.1:{free_port()}", DISABLE_ENVOY="true",
        PYTHONPATH=os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])),
        WORKLOAD_RSA_KEY_SIZE="8192",
        PROXY_CONFIG=f'{{"statusPort": {status_port}, "discoveryAddress": "127.0.0.1:{free_port()}"}}')
    agent = start_agent(pod, environment)
    assert agent.log is not None
    log = agent.log
    poll(lambda: "test hook: key generation started" in log.text(), "the key generation to start", 30, agent.output)
    agent.wait_answering(status_port)  # fully started: the stop goes through the drain path
    agent.signal(signal.SIGTERM)
    code = agent.wait_exit(30)  # a deadline, not a measurement: without the fix it runs for hours
    log.join(10)  # every line it wrote
    assert code == 0, agent.output()
    assert "abandoning it" in log.text(), "the generation was still in progress when the agent stopped"
