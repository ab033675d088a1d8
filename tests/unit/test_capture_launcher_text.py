"""The lean `istio-iptables` launcher's text (`cli/iptables_launcher.render`): pure, deterministic, valid Python."""

from __future__ import annotations

import pytest

from istio_agent.cli.iptables_launcher import LauncherError, render


def test_the_launcher_starts_the_entry_point_without_site() -> None:
    text = render("/opt/py/bin/python3", ["/opt/app/src", "/opt/py/lib/site-packages"]).decode()
    assert text.startswith("#!/opt/py/bin/python3 -IS\n")
    assert "sys.path += ['/opt/app/src', '/opt/py/lib/site-packages']" in text  # after the standard library
    assert text.rstrip().endswith("from istio_agent.cli.iptables import main\nmain()")
    compile(text, "istio-iptables", "exec")


def test_the_same_installation_gives_the_same_bytes() -> None:
    assert render("/usr/bin/python3", ["/a"]) == render("/usr/bin/python3", ["/a"])
    assert render("/usr/bin/python3", ["/a"]) != render("/usr/bin/python3", ["/b"])


@pytest.mark.parametrize("interpreter, paths, why", [
    ("python3", ["/a"], "absolute path"),
    ("/opt/my python/bin/python3", ["/a"], "without spaces"),
    ("/usr/bin/python3", [], "no import path"),
])
def test_what_a_launcher_cannot_be_written_for(interpreter: str, paths: list[str], why: str) -> None:
    with pytest.raises(LauncherError, match=why):
        render(interpreter, paths)


def test_a_launcher_with_a_bundle_loads_it_before_the_entry_point() -> None:
    bundle = "/opt/py/bin/__pycache__/istio-iptables.bundle"
    text = render("/opt/py/bin/python3", ["/opt/app/src"], bundle).decode()
    prelude = text.index(f"posix.open({bundle!r}, posix.O_RDONLY | posix.O_CLOEXEC)")
    assert text.index("sys.path += ['/opt/app/src']") < prelude < text.index("from istio_agent.cli.iptables import")
    assert "except Exception:\n    pass\n" in text  # any trouble with the bundle: the ordinary imports
    assert text.rstrip().endswith("from istio_agent.cli.iptables import main\nmain()")
    compile(text, "istio-iptables", "exec")


def test_a_bundle_must_be_named_absolutely() -> None:
    with pytest.raises(LauncherError, match="absolute path"):
        render("/usr/bin/python3", ["/a"], "bundle")
