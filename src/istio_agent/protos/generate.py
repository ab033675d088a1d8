"""Regenerate the Python modules for the Istio protos this project defines.

The `.proto` files here are written from upstream's package names and field
numbers; their generated modules are committed so that installing the project
needs no protoc. `tests/unit/test_protos_in_sync.py` runs `generate()` into a
scratch folder and compares, so a `.proto` edit without regeneration fails CI.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC_ROOT = HERE.parent.parent
PROTOS = ("istioca.proto", "nds.proto", "health.proto", "networking.proto", "networking_v1beta1.proto",
          "proxyconfig.proto")
WITH_GRPC = ("istioca.proto",)


def generate(out_dir: Path) -> list[Path]:
    """Compile every proto into `out_dir` (which mirrors `src/`); returns the files written."""
    import grpc_tools
    from grpc_tools import protoc

    include = str(Path(grpc_tools.__file__).resolve().parent / "_proto")
    written: list[Path] = []
    for name in PROTOS:
        rel = f"istio_agent/protos/{name}"
        args = ["protoc", f"-I{SRC_ROOT}", f"-I{include}", f"--python_out={out_dir}", f"--pyi_out={out_dir}"]
        if name in WITH_GRPC:
            args.append(f"--grpc_python_out={out_dir}")
        if protoc.main([*args, rel]) != 0:
            raise RuntimeError(f"protoc failed on {rel}")
        stem = name.removesuffix(".proto")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            path = out_dir / "istio_agent" / "protos" / f"{stem}{suffix}"
            if path.exists():
                written.append(path)
    return written


if __name__ == "__main__":
    files = generate(SRC_ROOT)
    sys.stdout.write("".join(f"wrote {p.relative_to(SRC_ROOT)}\n" for p in files))
