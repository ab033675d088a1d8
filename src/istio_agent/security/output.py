"""OUTPUT_CERTS: the workload key, chain and root written for readers other than Envoy.

Proxyless gRPC and VMs read these files with a file watcher, so each file is
replaced atomically (a reader never sees half a key), keeps mode 0600 (0644
under Kubernetes, where upstream shares them with the pod's other containers), and is
rewritten only when its content changed (an unchanged rewrite would wake every
watcher for nothing).

The files are not fsynced, as upstream's atomic write does not sync them
either: the rename alone is what keeps a reader from seeing half a file, and
what a crash could lose is rewritten at the next start, which always fetches a
new certificate. The writes run on the event loop, between the CA's answer and
the first certificate on disk; three fsyncs cost ~1.5 ms on an idle disk and
were seen to take ~290 ms on a busy one (bench_identity), holding up the loop.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from istio_agent.security.options import CERT_CHAIN_FILE, KEY_FILE, ROOT_CERT_FILE

FILE_MODE = 0o600


def write_if_changed(path: Path, content: bytes, mode: int = FILE_MODE) -> bool:
    """Atomically replace `path` with `content` unless it already holds exactly that; True when written."""
    try:
        if path.read_bytes() == content:
            if (path.stat().st_mode & 0o777) != mode:
                os.chmod(path, mode)
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    return True


def write_output_certs(directory: Path, key: bytes, cert_chain: bytes, root_cert: bytes,
                       mode: int = FILE_MODE) -> list[str]:
    """Write whichever of key.pem, cert-chain.pem, root-cert.pem have content; names of files written.

    The key is written before the chain so a reader that reloads on the chain's
    change finds the matching key already in place.
    """
    written: list[str] = []
    for name, content in ((KEY_FILE, key), (CERT_CHAIN_FILE, cert_chain), (ROOT_CERT_FILE, root_cert)):
        if content and write_if_changed(directory / name, content, mode):
            written.append(name)
    return written
