"""The Wasm modules a mesh file names, built as `istiod-local up` builds them (wat2wasm as a child process).

The default mesh's own module assembles into a Proxy-Wasm module exporting what Envoy's host needs; a `.wasm`
file is served as it is; a module is rewritten only when its bytes change, a file no entry names any more
goes; a missing file, a WAT file that does not assemble and a `.wasm` that is not Wasm are refused naming
the file. The run logs each module built, and a rebuild when an edit changed it.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from needs import need_tool

from istiod_local.mesh.runner import EventLog, MeshFileError, MeshRun, UpOptions
from istiod_local.mesh.wasmfiles import WasmModuleError, build, files_signature

EXAMPLE_WAT = Path(__file__).resolve().parents[2] / "examples" / "wasm" / "add-header.wat"
EXPORTS = (b"proxy_abi_version_0_2_1", b"proxy_on_memory_allocate", b"proxy_on_response_headers",
           b"proxy_add_header_map_value")


@pytest.fixture
def files(tmp_path: Path) -> Path:
    need_tool("wat2wasm")
    shutil.copy(EXAMPLE_WAT, tmp_path / "add-header.wat")
    (tmp_path / "mesh.yaml").write_text("{}\n")
    return tmp_path


def test_modules_are_built_served_as_stem_wasm_and_rewritten_only_when_changed(files: Path) -> None:
    out = files / "served"
    (files / "plain.wasm").write_bytes(b"\0asm\x01\0\0\0")
    digests = build(files / "mesh.yaml", ["add-header.wat", "plain.wasm"], out)
    assert sorted(p.name for p in out.iterdir()) == ["add-header.wasm", "plain.wasm"]
    module = (out / "add-header.wasm").read_bytes()
    assert module.startswith(b"\0asm") and all(name in module for name in EXPORTS)
    assert (out / "plain.wasm").read_bytes() == b"\0asm\x01\0\0\0" and len(digests["plain.wasm"]) == 64
    assert (out / "add-header.wasm").stat().st_mode & 0o777 == 0o644
    inode = (out / "add-header.wasm").stat().st_ino
    assert build(files / "mesh.yaml", ["add-header.wat"], out) == {"add-header.wasm": digests["add-header.wasm"]}
    assert (out / "add-header.wasm").stat().st_ino == inode, "the same bytes are not written again"
    assert not (out / "plain.wasm").exists(), "a module no entry names is no longer served"
    wat = files / "add-header.wat"
    before = files_signature(files / "mesh.yaml", ["add-header.wat"])
    wat.write_text(wat.read_text().replace('"add-header")', '"changed!!!")'))
    assert files_signature(files / "mesh.yaml", ["add-header.wat"]) != before
    changed = build(files / "mesh.yaml", ["add-header.wat"], out)
    assert changed["add-header.wasm"] != digests["add-header.wasm"] and b"changed!!!" in (out / "add-header.wasm"
                                                                                          ).read_bytes()


@pytest.mark.parametrize(("name", "content", "words"), [
    ("missing.wat", None, "no such file"),
    ("broken.wat", "(module (func $f (result i32) (i32.add)))", "wat2wasm refused it"),
    ("fake.wasm", "not wasm", "not a Wasm module"),
])
def test_a_module_that_cannot_be_built_is_refused_naming_its_file(files: Path, name: str, content: str | None,
                                                                 words: str) -> None:
    if content is not None:
        (files / name).write_text(content)
    with pytest.raises(WasmModuleError, match=words) as caught:
        build(files / "mesh.yaml", [name], files / "served")
    assert name in str(caught.value)


def test_the_run_logs_each_module_built_and_refuses_a_broken_one(files: Path) -> None:
    events = io.StringIO()
    mesh_file = files / "mesh.yaml"
    mesh_file.write_text("wasmModules: [add-header.wat]\n")
    run = MeshRun(UpOptions(mesh_file, files / "run"), EventLog(events))
    mesh = run._load()
    run._build_modules(mesh)
    run._build_modules(mesh)
    (files / "add-header.wat").write_text("(module (bad))")
    with pytest.raises(MeshFileError, match=r"add-header\.wat: wat2wasm refused it"):
        run._build_modules(mesh)
    lines = events.getvalue().splitlines()
    assert len(lines) == 1 and "Wasm module add-header.wasm built: sha256 " in lines[0], lines
    assert (files / "run" / "wasm" / "add-header.wasm").read_bytes().startswith(b"\0asm"), "the last good one stays"
