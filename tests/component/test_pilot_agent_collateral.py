"""`pilot-agent completion` and `pilot-agent collateral`, run as the console script, read by their real readers.

The bash script is sourced by bash and its completion function asked what completes `pilot-agent pro` and
`pilot-agent proxy --prof` (click answers from the table through the script's call back into pilot-agent);
the man pages are rendered by man, the YAML read by PyYAML, and every page names every flag of its command.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from launchers import pilot_agent_cli
from needs import need_tool
from support import VENV_BIN

from istio_agent.cli.pilot_agent_flags import PILOT_AGENT as TABLE

COMMANDS = [command for command in TABLE.commands if command.name]


def bash_completes(words: str, script: str) -> list[str]:
    """What the sourced script's completion function offers for the command line `words` (the last is partial)."""
    parts = words.split(" ")
    program = (f"source {script}\n"
               f"COMP_WORDS=({words})\nCOMP_CWORD={len(parts) - 1}\n"
               "_pilot_agent_completion pilot-agent\n"
               'printf "%s\\n" "${COMPREPLY[@]}"\n')
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    done = subprocess.run([need_tool("bash"), "-c", program], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completion_completes_commands_and_flags(tmp_path: Path) -> None:
    done = pilot_agent_cli("completion", "bash")
    assert done.returncode == 0, done.stderr
    script = tmp_path / "pilot-agent.bash"
    script.write_text(done.stdout)
    assert subprocess.run([need_tool("bash"), "-n", str(script)], timeout=30).returncode == 0
    assert bash_completes("pilot-agent pro", str(script)) == ["proxy"]
    assert bash_completes("pilot-agent co", str(script)) == ["collateral", "completion"]
    assert "--profiling" in bash_completes("pilot-agent proxy --prof", str(script))


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_the_other_click_shells_get_their_script(shell: str) -> None:
    done = pilot_agent_cli("completion", shell)
    assert done.returncode == 0 and "_PILOT_AGENT_COMPLETE" in done.stdout, done.stderr


def test_powershell_is_refused_with_the_reason() -> None:
    done = pilot_agent_cli("completion", "powershell")
    assert done.returncode == 1 and "no PowerShell completion" in done.stderr


def test_collateral_writes_each_kind_for_each_command(tmp_path: Path) -> None:
    done = pilot_agent_cli("collateral", "--all", "-o", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pilot-agent.bash").read_text() == pilot_agent_cli("completion", "bash").stdout
    assert "#compdef pilot-agent" in (tmp_path / "_pilot-agent").read_text()
    page = (tmp_path / "pilot-agent.html").read_text()
    assert page.startswith("---\ntitle: pilot-agent\n") and "<code>CREDENTIAL_FETCHER_TYPE</code>" in page
    man = need_tool("man")
    for command in COMMANDS:
        stem = f"pilot-agent_{command.name}"
        markdown = (tmp_path / f"{stem}.md").read_text()
        document = yaml.safe_load((tmp_path / f"{stem}.yaml").read_text())
        assert document["name"] == f"pilot-agent {command.name}"
        rendered = subprocess.run([man, "-l", str(tmp_path / f"pilot-agent-{command.name}.1")], capture_output=True,
                                  text=True, timeout=60, env={**os.environ, "MANWIDTH": "200"})
        assert rendered.returncode == 0 and "SYNOPSIS" in rendered.stdout, rendered.stderr
        for flag in command.flags if command.name != "istio-iptables" else ():
            if flag.name.startswith("log_"):
                continue  # the root's, documented on pilot-agent's own page
            assert f"--{flag.name}" in markdown, (command.name, flag.name)
            assert flag.name in {option["name"] for option in document["options"]}, (command.name, flag.name)
            assert f"--{flag.name}" in rendered.stdout.replace("\u2010", "-"), (command.name, flag.name)
    assert {"pilot-agent.md", "pilot-agent.yaml", "pilot-agent.1"} <= {p.name for p in tmp_path.iterdir()}


def test_collateral_without_a_kind_writes_nothing(tmp_path: Path) -> None:
    done = pilot_agent_cli("collateral", "-o", str(tmp_path / "out"))
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert not (tmp_path / "out").exists()
