"""What `istio-cni` loads on its per-pod paths, in a fresh interpreter: the plugin is exec'd once per pod.

A full dry-run ADD (kubeconfig, HTTPS GET of the pod, rules recorded) and a
skipped one (excluded namespace) must not pull in click, asyncio, protobuf,
grpc, aiohttp, requests, PyYAML (install-cni's kubeconfig reads without
it), http.client (and its email parser), subprocess or dataclasses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cni_peers import PodApi, write_kubeconfig

HEAVY = {"click", "asyncio", "google.protobuf", "grpc", "aiohttp", "requests", "yaml", "http.client", "email",
         "subprocess", "dataclasses", "typing"}
POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "p", "namespace": "shop", "annotations": {"sidecar.istio.io/status": "{}"}},
       "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy"}]}}  # fmt: skip


def loaded_by_add(env: dict[str, str], config: dict[str, object]) -> set[str]:
    probe = (
        "import io, json, sys\n"
        "before = set(sys.modules)\n"
        "from istio_agent.cni.plugin.main import run\n"
        "out = io.BytesIO()\n"
        f"code = run({env!r}, {json.dumps(config).encode()!r}, out, io.StringIO())\n"
        "assert code == 0, out.getvalue()\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


@pytest.mark.parametrize("namespace", ["shop", "kube-system"])
def test_add_paths_stay_lean(namespace: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="iacni-fp-"))
    api = PodApi(folder)
    try:
        api.add_pod(POD)
        write_kubeconfig(folder, api.url, api.ca_pem)
        record = folder / "rec"
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c", "CNI_NETNS": "/tmp", "CNI_IFNAME": "eth0",
               "CNI_PATH": "/x", "CNI_ARGS": f"K8S_POD_NAMESPACE={namespace};K8S_POD_NAME=p",
               "DRY_RUN_FILE_PATH": str(record), "PATH": os.environ.get("PATH", "")}
        config: dict[str, object] = {"cniVersion": "1.0.0", "name": "n", "cni_agent_run_dir": str(folder),
                  "exclude_namespaces": ["kube-system"]}
        loaded = loaded_by_add(env, config)
        assert "istio_agent.cni.plugin.add" in loaded
        assert not loaded & HEAVY, loaded & HEAVY
        if namespace == "shop":
            assert "ISTIO_REDIRECT" in record.read_text()  # the lean path did do the whole job
            assert "ssl" in loaded
        else:
            assert "ssl" not in loaded and "istio_agent.capture.rules" not in loaded
    finally:
        api.close()
        shutil.rmtree(folder, ignore_errors=True)
