"""`packaging/vm/build-deb.sh` (what `make vm-package` runs): the Debian package's files, control data and scripts."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from needs import need_tool
from support import ROOT

BUILD = ROOT / "packaging" / "vm" / "build-deb.sh"


def test_package_installs_upstreams_paths_and_a_wheel_of_the_agent(tmp_path: Path) -> None:
    need_tool("dpkg-deb")
    done = subprocess.run([str(BUILD), sys.executable, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    deb = Path(done.stdout.strip())
    assert deb.parent == tmp_path and deb.name.startswith("istio-agent-sidecar_") and deb.name.endswith("_all.deb")
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    files = {line.split()[-1].lstrip(".") for line in listing.splitlines()}
    assert {"/usr/local/bin/istio-start.sh", "/lib/systemd/system/istio.service",
            "/var/lib/istio/envoy/sidecar.env"} <= files
    wheels = [f for f in files if f.startswith("/usr/local/lib/istio-agent/wheels/") and f.endswith(".whl")]
    assert len(wheels) == 1, files
    modes = {line.split()[-1].lstrip("."): line.split()[0] for line in listing.splitlines()}
    assert modes["/usr/local/bin/istio-start.sh"] == "-rwxr-xr-x"
    fields = subprocess.run(["dpkg-deb", "-f", str(deb), "Package", "Depends"], capture_output=True, text=True,
                            check=True).stdout
    assert "Package: istio-agent-sidecar" in fields and "python3 (>= 3.11)" in fields
    control = tmp_path / "control"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(control)], check=True)
    assert (control / "conffiles").read_text().split() == ["/var/lib/istio/envoy/sidecar.env"]
    for script in ("postinst", "prerm"):
        assert subprocess.run(["sh", "-n", str(control / script)]).returncode == 0
    postinst = (control / "postinst").read_text()
    assert "useradd --system --gid istio-proxy" in postinst and "python3 -m venv" in postinst
    # The wheel is this project with its console scripts, pilot-agent among them.
    unpacked = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    with zipfile.ZipFile(unpacked / wheels[0].lstrip("/")) as wheel:
        entry_points = next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))
        assert "pilot-agent = istio_agent.cli.pilot_agent_entry:main" in wheel.read(entry_points).decode()
    assert (unpacked / "usr/local/bin/istio-start.sh").read_bytes() == \
        (ROOT / "packaging/vm/istio-start.sh").read_bytes()
