"""The local node's VM as data (`node/vm.py`): the machine's files and the commands that build and enter it."""

from __future__ import annotations

import pytest

from istiod_local.node.plan import PodSpec, plan_node, plan_pod
from istiod_local.node.vm import (
    VmSpec,
    configure_argv,
    enter_argv,
    holder_argv,
    hosts_with,
    resolv_conf,
    sidecar_env_text,
    unit_environment,
    with_proxy_user,
)


def test_proxy_user_added_once_as_postinst_would() -> None:
    passwd, group = with_proxy_user("root:x:0:0::/root:/bin/bash", "root:x:0:\n")
    assert passwd.splitlines()[-1] == "istio-proxy:x:1337:1337::/var/lib/istio:/usr/sbin/nologin"
    assert group.splitlines()[-1] == "istio-proxy:x:1337:"
    assert with_proxy_user(passwd, group) == (passwd, group)


def test_hosts_appended_and_resolver_is_the_gateway() -> None:
    assert hosts_with("127.0.0.1 localhost", "10.244.0.1 istiod.istio-system.svc") == \
        "127.0.0.1 localhost\n10.244.0.1 istiod.istio-system.svc\n"
    assert resolv_conf() == "nameserver 127.0.0.1\n"


def test_sidecar_env_is_quoted_for_the_shell_and_refuses_bad_names() -> None:
    assert sidecar_env_text({"B": "x y", "A": "it's"}) == "A='it'\"'\"'s'\nB='x y'\n"
    with pytest.raises(ValueError, match="'1X'"):
        sidecar_env_text({"1X": "v"})


def test_configure_and_enter_commands() -> None:
    node = plan_node(1, 0)
    vm = plan_pod(node, PodSpec("vm-1", sidecar=False), [])
    argv = configure_argv("istiod-local", "/s", "/r.yaml", VmSpec("vm-1", "grp", "ns"), node, vm, "/out")
    assert argv[argv.index("--name") + 1] == "grp" and argv[argv.index("--internalIP") + 1] == vm.ip
    assert argv[argv.index("--discovery-address") + 1] == "10.244.0.1:15012" and "--autoregister" in argv
    entered = enter_argv(42, ["hostname"])
    assert entered[:5] == ["nsenter", "--target=42", "--net", "--mount", "--uts"]
    assert entered[-3:] == ['cd "$0" && exec "$@"', "/", "hostname"]
    holder = holder_argv(vm.netns, "vm-1", "/root-of-vm", "", "/ready")
    assert "mount --bind /root-of-vm/etc/certs /etc/certs" in holder[-1]
    assert holder[-1].endswith("touch /ready; exec sleep infinity")


def test_unit_environment_has_no_user_or_home() -> None:
    env = unit_environment({"USER": "me", "HOME": "/home/me", "LANG": "C.UTF-8", "PATH": "/x"})
    assert env == {"LANG": "C.UTF-8", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
