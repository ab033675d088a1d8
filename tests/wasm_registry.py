"""Real peers for Wasm fetches: a plain HTTP module server, and the distribution registry in a network namespace.

`ModuleServer` serves modules from memory on loopback (and counts requests per path, to prove a cache hit is
not a fetch); a path can be made to fail or to redirect. `Registry` runs Debian's `docker-registry` (the
CNCF distribution registry) in a network namespace of its own, reached over a veth pair at `HOST` (a
private address only this namespace holds), with or without htpasswd Basic auth. Images are pushed with
ordinary clients: `skopeo` copies a Docker (v2s2) or OCI image from an OCI layout written here, and `oras`
(`make oras`, from the Go module proxy) pushes the Wasm OCI artifact. Everything made is removed on exit.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.server
import io
import json
import shutil
import subprocess
import tarfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from needs import need, need_root, need_tool

REPO_ROOT = Path(__file__).resolve().parent.parent
ORAS = REPO_ROOT / ".upstream" / "bin" / "oras"
WASM_CONFIG_MEDIA = "application/vnd.module.wasm.config.v1+json"
WASM_LAYER_MEDIA = "application/vnd.module.wasm.content.layer.v1+wasm"


class ModuleServer:
    """An HTTP server on 127.0.0.1 answering GET <path> from `files`; `fail[path]` is a status to answer instead."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.fail: dict[str, int] = {}
        self.redirect: dict[str, str] = {}
        self.hits: dict[str, int] = {}
        self.delay: dict[str, float] = {}  # seconds before answering a path (a slow server)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits[self.path] = server.hits.get(self.path, 0) + 1
                time.sleep(server.delay.get(self.path, 0))
                if self.path in server.redirect:
                    self.send_response(302)
                    self.send_header("Location", server.redirect[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = server.fail.get(self.path) or (200 if self.path in server.files else 404)
                body = server.files.get(self.path, b"") if status == 200 else b"no"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> ModuleServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def layer_tar_gz(module: bytes, name: str = "plugin.wasm") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(module)
        archive.addfile(info, io.BytesIO(module))
    return gzip.compress(out.getvalue(), mtime=0)


def oci_layout(directory: Path, module: bytes, tag: str) -> Path:
    """An OCI image layout with one image whose only layer is a tar.gz holding plugin.wasm (skopeo's input)."""
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    layer = layer_tar_gz(module)
    diff_id = hashlib.sha256(gzip.decompress(layer)).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **blob(layer)}]}).encode()
    (directory / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (directory / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", **blob(manifest),
        "annotations": {"org.opencontainers.image.ref.name": tag}}]}))
    return directory


class Registry:
    """`docker-registry` in its own network namespace at http://<ip>:5000, or on the loopback of the existing
    namespace `inside` (a pod's: then every client command runs in it too)."""

    def __init__(self, workdir: Path, user: str = "", password: str = "", inside: str | None = None) -> None:
        self.workdir = workdir
        self.user, self.password = user, password
        tag = uuid.uuid4().hex[:6]
        self.inside = inside
        self.netns, self.link = inside or f"wreg-{tag}", f"wr{tag}"
        octet = int(tag[:2], 16) % 200 + 20
        self.host_ip, self.ip = f"10.79.{octet}.1", "127.0.0.1" if inside else f"10.79.{octet}.2"
        self.prefix = ["ip", "netns", "exec", inside] if inside else []
        self.proc: subprocess.Popen[str] | None = None
        self.made = False

    @property
    def address(self) -> str:
        return f"{self.ip}:5000"

    @staticmethod
    def check_prerequisites() -> None:
        need_root()
        for tool in ("ip", "docker-registry", "skopeo"):
            need_tool(tool)

    def _sh(self, *argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True, timeout=30)

    def __enter__(self) -> Registry:
        self.check_prerequisites()
        if self.inside is None:
            self._sh("ip", "netns", "add", self.netns)
            self.made = True
            self._sh("ip", "-n", self.netns, "link", "set", "lo", "up")
            self._sh("ip", "link", "add", self.link, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
            self._sh("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.link)
            self._sh("ip", "link", "set", self.link, "up")
            self._sh("ip", "-n", self.netns, "addr", "add", f"{self.ip}/30", "dev", "eth0")
            self._sh("ip", "-n", self.netns, "link", "set", "eth0", "up")
        storage = self.workdir / "registry"
        storage.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {"version": 0.1, "log": {"level": "warn"},
                                  "storage": {"filesystem": {"rootdirectory": str(storage)}},
                                  "http": {"addr": f"{self.ip}:5000"}}
        if self.user:
            htpasswd = self.workdir / "htpasswd"
            done = subprocess.run([need_tool("htpasswd"), "-Bbn", self.user, self.password], capture_output=True,
                                  text=True, check=True, timeout=30)
            htpasswd.write_text(done.stdout)
            config["auth"] = {"htpasswd": {"realm": "Registry Realm", "path": str(htpasswd)}}
        path = self.workdir / "registry.json"
        path.write_text(json.dumps(config))  # YAML is a superset of JSON
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.netns, "docker-registry", "serve", str(path)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            probe = subprocess.run([*self.prefix, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"http://{self.address}/v2/"],
                                   capture_output=True, text=True, timeout=10)
            if probe.stdout in ("200", "401"):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.__exit__()
        raise AssertionError("the registry did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None
        if self.made:
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, timeout=30)
            subprocess.run(["ip", "link", "del", self.link], capture_output=True, timeout=30)
            self.made = False

    def _creds(self, flag: str) -> list[str]:
        return [flag, f"{self.user}:{self.password}"] if self.user else []

    def push_image(self, module: bytes, repository: str, tag: str, docker: bool) -> str:
        """Push `module` as a one-layer image (Docker v2s2, else OCI) with skopeo; its manifest digest (hex)."""
        layout = oci_layout(self.workdir / f"layout-{uuid.uuid4().hex[:6]}", module, tag)
        target = f"docker://{self.address}/{repository}:{tag}"
        argv = [*self.prefix, "skopeo", "copy", "--dest-tls-verify=false", *self._creds("--dest-creds"),
                *(["--format", "v2s2"] if docker else []), f"oci:{layout}:{tag}", target]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        shutil.rmtree(layout)
        return self.digest(repository, tag)

    def push_artifact(self, module: bytes, repository: str, tag: str) -> str:
        """Push `module` as the Wasm OCI artifact with oras; its manifest digest (hex).

        The layout upstream reads: two layers, the module and the Wasm config (both as layers, as its own
        tests build the artifact)."""
        need(ORAS.exists(), f"needs oras at {ORAS} (make oras)")
        work = self.workdir / f"artifact-{uuid.uuid4().hex[:6]}"
        work.mkdir()
        (work / "plugin.wasm").write_bytes(module)
        (work / "config.json").write_text("{}")
        argv = [*self.prefix, str(ORAS), "push", "--plain-http", "--disable-path-validation",
                *(["-u", self.user, "-p", self.password] if self.user else []),
                f"{self.address}/{repository}:{tag}", f"plugin.wasm:{WASM_LAYER_MEDIA}",
                f"config.json:{WASM_CONFIG_MEDIA}"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=work)
        assert done.returncode == 0, done.stderr + done.stdout
        return self.digest(repository, tag)

    def digest(self, repository: str, tag: str) -> str:
        argv = [*self.prefix, "skopeo", "inspect", "--tls-verify=false", *self._creds("--creds"), "--raw",
                f"docker://{self.address}/{repository}:{tag}"]
        done = subprocess.run(argv, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return hashlib.sha256(done.stdout).hexdigest()

    def pull_secret(self) -> str:
        """The dockerconfigjson a Kubernetes pull secret for this registry holds."""
        auth = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        return json.dumps({"auths": {self.address: {"auth": auth}}})
