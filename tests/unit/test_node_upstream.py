"""Upstream's Go commands on the local node: where they are looked for, what is missing, a pod's choice of agent,
and upstream's install-cni's command line and image paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from istiod_local.node.cni_plan import (
    CniPaths,
    install_cni_argv,
    upstream_install_cni_argv,
    upstream_install_cni_mounts,
    upstream_mount_targets,
)
from istiod_local.node.plan import PlanError, PodSpec, plan_node, plan_pod
from istiod_local.node.upstream import (
    BOOTSTRAP_TEMPLATE,
    DEFAULT_UPSTREAM_BIN,
    TEMPLATE_NAME,
    UPSTREAM_BIN_ENV,
    UpstreamCommands,
    lay_bootstrap_template,
    upstream_bin,
)


def test_the_commands_are_looked_for_in_the_env_var_else_the_checkouts_upstream_dir() -> None:
    assert upstream_bin({UPSTREAM_BIN_ENV: "/opt/istio/bin"}) == Path("/opt/istio/bin")
    assert upstream_bin({}) == DEFAULT_UPSTREAM_BIN
    assert DEFAULT_UPSTREAM_BIN.parts[-2:] == (".upstream", "bin")
    assert (DEFAULT_UPSTREAM_BIN.parent.parent / "pyproject.toml").is_file()  # the checkout's root


def _executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    path.chmod(0o755)


def test_missing_names_each_absent_command_and_the_agents_template(tmp_path: Path) -> None:
    found = UpstreamCommands(tmp_path / "bin")
    assert "pilot-agent" in found.missing("pilot-agent") and TEMPLATE_NAME in found.missing("pilot-agent")
    _executable(found.pilot_agent)
    assert found.missing("pilot-agent") == f"upstream's Go {found.bootstrap_template} not installed in " \
                                           f"{tmp_path / 'bin'} (run `make upstream`, which needs `go` and the Go " \
                                           f"module proxy, or point {UPSTREAM_BIN_ENV} at a directory holding them)"
    found.bootstrap_template.parent.mkdir()
    found.bootstrap_template.write_text("{}")
    assert found.missing("pilot-agent") == ""
    assert "install-cni, istio-cni" in found.missing("install-cni", "istio-cni")
    (tmp_path / "bin" / "install-cni").write_text("")  # present but not executable: still missing
    assert "install-cni" in found.missing("install-cni")


def test_the_template_lands_where_upstreams_image_has_it(tmp_path: Path) -> None:
    found = UpstreamCommands(tmp_path / "bin")
    found.bootstrap_template.parent.mkdir(parents=True)
    found.bootstrap_template.write_text('{"node": {}}')
    lay_bootstrap_template(found, tmp_path / "pod")
    assert (tmp_path / "pod" / BOOTSTRAP_TEMPLATE).read_text() == '{"node": {}}'
    assert BOOTSTRAP_TEMPLATE == "var/lib/istio/envoy/envoy_bootstrap_tmpl.json"


def test_a_pod_names_one_of_the_two_agent_implementations() -> None:
    node = plan_node(4242)
    assert plan_pod(node, PodSpec("go-1", agent_implementation="upstream"), []).spec.agent_implementation == "upstream"
    with pytest.raises(PlanError, match="agent implementation 'go': one of istio-agent, upstream"):
        plan_pod(node, PodSpec("go-1", agent_implementation="go"), [])


def test_upstreams_install_cni_gets_the_same_choices_in_its_own_flags_and_paths() -> None:
    paths = CniPaths(Path("/run/node/cni"))
    ours = install_cni_argv("install-cni", paths, "label")
    theirs = upstream_install_cni_argv("/u/install-cni", paths, "label")
    assert theirs[0] == "/u/install-cni"
    # every flag upstream has is given as ours gets it; ours alone has the plugin, account and socket paths
    assert set(theirs[1:]) <= set(ours[1:])
    assert {"--cni-bin-dir", "--service-account-dir", "--log-uds-socket", "--exclude-namespaces"} & set(theirs) == set()
    assert upstream_install_cni_argv("i", paths, "off")[-1] == "--repair-enabled=false"
    with pytest.raises(ValueError, match="repair"):
        upstream_install_cni_argv("i", paths, "fix")
    assert upstream_install_cni_mounts(paths, "/u/istio-cni") == [
        ("/run/node/cni/upstream-image-bin", "/opt/cni/bin"), ("/u/istio-cni", "/opt/cni/bin/istio-cni"),
        ("/run/node/cni/bin", "/host/opt/cni/bin"),
        ("/run/node/cni/istio-cni-sa", "/var/run/secrets/kubernetes.io/serviceaccount")]
    # In-place repair: the chart's host procfs volume, at upstream's fixed /host/proc (a mount point made on the
    # host when missing, as the others).
    assert upstream_install_cni_mounts(paths, "/u/istio-cni", "repair")[-1] == ("/proc", "/host/proc")
    assert upstream_mount_targets("repair")[-1] == "/host/proc" and "/host/proc" not in upstream_mount_targets("off")
