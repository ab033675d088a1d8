"""`install-cni version`: upstream's version subcommand (istio's common one), its outputs and its flags."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from istio_agent.cni.install.main import command
from istio_agent.version import ISTIO_COMPAT_VERSION, VersionOutputError, build_info, long_form, version_output


def test_the_long_form_is_gos_struct_syntax() -> None:
    text = version_output()
    assert text == f"client version: {long_form(build_info())}\n"
    assert text.startswith(f'client version: version.BuildInfo{{Version:"{ISTIO_COMPAT_VERSION}", GitRevision:"')
    assert text.endswith(f'BuildStatus:"Clean", GitTag:"{ISTIO_COMPAT_VERSION}"}}\n')


def test_json_and_yaml_carry_upstreams_field_names() -> None:
    expected = {"version": ISTIO_COMPAT_VERSION, "revision": build_info()["GitRevision"],
                "golang_version": "none (Python)", "status": "Clean", "tag": ISTIO_COMPAT_VERSION}
    assert json.loads(version_output(output="json")) == {"clientVersion": expected}
    as_yaml = version_output(output="yaml")
    assert yaml.safe_load(as_yaml) == {"clientVersion": expected}
    keys = [line.split(":")[0].strip() for line in as_yaml.splitlines()[1:] if line.strip()]
    assert keys == sorted(expected) and as_yaml.endswith("\n\n")  # sorted keys, then Println's blank line
    with pytest.raises(VersionOutputError, match="--output must be 'yaml' or 'json'"):
        version_output(output="text")


def test_the_subcommand_prints_it_and_does_not_start_the_node_agent() -> None:
    runner = CliRunner()
    for args, expected in ((["version"], version_output()), (["version", "-s"], version_output(short=True)),
                           (["version", "--short=false"], version_output()),
                           (["version", "-o", "json"], version_output(output="json"))):
        result = runner.invoke(command, args, env={"KUBERNETES_SERVICE_HOST": ""})
        assert result.exit_code == 0 and result.output == expected, (args, result.output)
    assert version_output(short=True) == f"client version: {ISTIO_COMPAT_VERSION}\n"
    failed = runner.invoke(command, ["version", "-o", "xml"])
    assert failed.exit_code == 1 and "--output must be 'yaml' or 'json'" in failed.output
