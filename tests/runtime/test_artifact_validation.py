"""An artifact is untrusted until checked: format by name (never by content), a strict
manifest, every member against SHA256SUMS, the entry against the artifact's own name,
and the library's own interface against the manifest, all before the first call."""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import kiln
from kiln import KilnError
from kiln.runtime import artifact as art
from tests.cli.test_cli_inprocess import kiln as cli
from tests.runtime.models import inputs, reference
from tests.runtime.test_artifact import ROOT, rewrite_manifest


def members(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def write_raw(path, entries: dict[str, bytes], extra: list[tuple[str, bytes]] = ()) -> None:
    """A zip holding exactly `entries` (+ `extra`, repeated names allowed): no sums recomputed."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # zipfile warns about a repeated name
        with zipfile.ZipFile(path, "w") as z:
            for name, data in [*entries.items(), *extra]:
                z.writestr(name, data)


def edited(artifact, tmp_path, edit, name="edited.kiln"):
    """The artifact with `edit(manifest)` applied and a SHA256SUMS that matches it (so the
    deeper checks, not the hashes, must catch it)."""
    out = tmp_path / name
    rewrite_manifest(artifact[0], out, edit)
    return out


def test_the_artifact_lists_a_hash_for_every_member(artifact):
    files = members(artifact[0])
    assert sorted(files) == sorted(art.MEMBERS)
    lines = files[art.SUMS].decode().splitlines()
    assert sorted(line.split("  ")[1] for line in lines) == sorted(n for n in art.MEMBERS if n != art.SUMS)
    for line in lines:
        digest, name = line.split("  ")
        assert hashlib.sha256(files[name]).hexdigest() == digest


@pytest.mark.parametrize("member", [art.MANIFEST, art.LIBRARY, art.HEADER, art.SOURCE, art.WEIGHTS])
def test_a_member_that_does_not_match_its_hash_is_refused(artifact, tmp_path, member):
    files = members(artifact[0])
    data = files[member]
    if member == art.MANIFEST:
        m = json.loads(data)
        m["kernels"] = m["kernels"][:-1] + ["x"]
        files[member] = json.dumps(m).encode()
    else:
        files[member] = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 1]) + data[len(data) // 2 + 1:]
    bad = tmp_path / "bad.kiln"
    write_raw(bad, files)
    with pytest.raises(KilnError, match=f"{member} does not match its SHA256SUMS line"):
        kiln.load(bad)
    with pytest.raises(KilnError, match="SHA256SUMS"):
        art.read_manifest(bad)                      # what `kiln inspect` shows is checked too


def test_a_library_failing_its_hash_is_never_loaded(artifact, tmp_path):
    """A library whose constructor would leave a mark: refused before dlopen runs it."""
    marker = tmp_path / "ran"
    src = tmp_path / "evil.c"
    src.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void run(void) '
                   f'{{ FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    so = tmp_path / "evil.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    files = members(artifact[0])
    files[art.LIBRARY] = so.read_bytes()
    bad = tmp_path / "bad.kiln"
    write_raw(bad, files)
    with pytest.raises(KilnError, match="model.so does not match its SHA256SUMS line"):
        kiln.load(bad)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["no sums", "extra member", "repeated member", "bad sums line",
                                    "sums without the library", "truncated file"])
def test_a_damaged_container_is_refused(artifact, tmp_path, damage):
    files = members(artifact[0])
    bad = tmp_path / "bad.kiln"
    extra = []
    if damage == "no sums":
        del files[art.SUMS]
    elif damage == "extra member":
        files["run.sh"] = b"rm -rf ~"
    elif damage == "repeated member":
        extra = [(art.LIBRARY, b"second copy")]
    elif damage == "bad sums line":
        files[art.SUMS] += b"not a line\n"
    elif damage == "sums without the library":
        files[art.SUMS] = b"".join(line + b"\n" for line in files[art.SUMS].splitlines()
                                   if not line.endswith(b"model.so"))
    if damage == "truncated file":
        data = artifact[0].read_bytes()
        bad.write_bytes(data[:len(data) // 2])
    else:
        write_raw(bad, files, extra)
    with pytest.raises(KilnError):
        kiln.load(bad)


def _smaller(shape):
    return [max(d - 1, 1) if k == 0 else d for k, d in enumerate(shape)]


# the reproductions: each segfaulted, ran a shell command or returned garbage before
MANIFEST_EDITS = {
    "missing target": (lambda m: m.pop("target"), "field target is missing"),
    "entry system": (lambda m: m.update(entry="system"), "entry 'system' is not this artifact's own entry"),
    "entry of another name": (lambda m: m.update(entry="other_main"), "not this artifact's own entry"),
    "workspace 0": (lambda m: m.update(workspace_bytes=0), "workspace_bytes: the library was built for"),
    "smaller output": (lambda m: m["outputs"][0].update(shape=_smaller(m["outputs"][0]["shape"])),
                       r"output 0: the library's is float32\[2, 4\], the manifest says float32\[1, 4\]"),
    "smaller input": (lambda m: m["inputs"][1].update(shape=_smaller(m["inputs"][1]["shape"])),
                      r"input 1: the library's is float32\[2, 4\]"),
    "wrong input dtype": (lambda m: m["inputs"][0].update(dtype="int32"), r"input 0: .* manifest says int32"),
    "wrong output dtype": (lambda m: m["outputs"][1].update(dtype="float64"), "output 1"),
    "one input fewer": (lambda m: m["inputs"].pop(), "the library takes 2 inputs, the manifest says 1"),
    "wrong weights_sha256": (lambda m: m.update(weights_sha256="0" * 64), "weights_sha256"),
    "wrong weights_bytes": (lambda m: m.update(weights_bytes=m["weights_bytes"] - 1), "weights"),
    "weights_offset": (lambda m: m.update(weights_offset=0), "weights"),
    "name and entry of another artifact": (lambda m: m.update(name="other", entry="other_main"),
                                          "does not report its interface"),
    "negative workspace": (lambda m: m.update(workspace_bytes=-1), r"field workspace_bytes: expected an integer"),
    "string size": (lambda m: m.update(workspace_bytes="4096"), r"field workspace_bytes: expected an integer"),
    "float dim": (lambda m: m["inputs"][0].update(shape=[2.0, 4]), r"field inputs\[0\].shape\[0\]"),
    "bool dim": (lambda m: m["inputs"][0].update(shape=[True, 4]), r"field inputs\[0\].shape\[0\]"),
    "unknown dtype": (lambda m: m["inputs"][0].update(dtype="float33"), r"field inputs\[0\].dtype"),
    "unknown field": (lambda m: m.update(run="sh -c id"), "unknown field 'run'"),
    "target not an object": (lambda m: m.update(target="cpu"), "field target: expected an object"),
    "library member renamed": (lambda m: m["files"].update(library="../../evil.so"), "field files.library"),
    "no outputs": (lambda m: m.update(outputs=[]), "field outputs"),
    "repeated input name": (lambda m: m["inputs"][1].update(name="x"), "names two inputs alike"),
    "old format version": (lambda m: m.update(format_version=2), "format version 2"),
    "not a manifest": (lambda m: (m.clear(), m.update(format="zip")), "not a kiln artifact"),
}


@pytest.mark.parametrize("case", list(MANIFEST_EDITS))
def test_a_manifest_that_disagrees_is_refused_before_any_call(artifact, tmp_path, case):
    edit, message = MANIFEST_EDITS[case]
    bad = edited(artifact, tmp_path, edit)
    with pytest.raises(KilnError, match=message):
        kiln.load(bad)


def test_the_library_reports_its_interface(artifact):
    model = kiln.load(artifact[0])
    name = artifact[1]["name"]
    fn = getattr(model.native.lib, f"{name}_interface")
    fn.argtypes = [ctypes.POINTER(ctypes.c_char_p)]
    out = ctypes.c_char_p()
    assert fn(ctypes.byref(out)) == 0
    m = artifact[1]
    assert json.loads(out.value) == {
        "inputs": [[p["dtype"], p["shape"]] for p in m["inputs"]],
        "outputs": [[p["dtype"], p["shape"]] for p in m["outputs"]],
        "workspace_bytes": m["workspace_bytes"], "weights_bytes": m["weights_bytes"],
        "weights_sha256": m["weights_sha256"]}
    header = members(artifact[0])[art.HEADER].decode()
    assert f"int32_t {name}_interface(const char** out);" in header


def _polyglot(artifact_path, path) -> None:
    """A valid ONNX model (y = x * 2) whose last bytes are also a valid kiln artifact: an
    unused initializer's raw data holds the zip (zip readers find it from the end)."""
    blob = artifact_path.read_bytes()
    io_ = lambda n: helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2, 4])  # noqa: E731
    pad = onnx.TensorProto(name="pad", data_type=onnx.TensorProto.UINT8, dims=[len(blob)], raw_data=blob)
    g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "double", [io_("x")], [io_("y")],
                          [numpy_helper.from_array(np.array(2, np.float32), "two"), pad])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    path.write_bytes(m.SerializeToString())


def test_kiln_run_picks_the_format_by_name_never_by_content(artifact, tmp_path, capsys):
    poly = tmp_path / "innocent.onnx"
    _polyglot(artifact[0], poly)
    assert zipfile.is_zipfile(poly)          # content sniffing would have called it an artifact
    x = inputs(batch=2)["x"]
    np.save(tmp_path / "x.npy", x)
    d = tmp_path / "outs"
    rc, out, err = cli(capsys, "run", poly, "-i", f"x={tmp_path / 'x.npy'}", "-d", d)
    assert rc == 0, err
    np.testing.assert_array_equal(np.load(d / "y.npy"), x * 2)    # the ONNX model ran, not the zip
    # asked for explicitly, the same bytes load as an artifact (and are checked as one)
    rc, out, err = cli(capsys, "inspect", poly, "--format", "kiln")
    assert rc == 0, err
    assert art.file_sha256(poly) in out and "native code" in out


def test_an_unknown_extension_needs_format(artifact, tmp_path, capsys):
    odd = tmp_path / "model.bin"
    odd.write_bytes(artifact[0].read_bytes())
    rc, out, err = cli(capsys, "run", odd, "--random")
    assert rc == 1 and "name it .onnx or .kiln, or pass --format onnx|kiln" in err, err
    rc, out, err = cli(capsys, "run", odd, "--random", "--format", "kiln")
    assert rc == 0, err
    kiln_as_onnx = tmp_path / "artifact.onnx"
    kiln_as_onnx.write_bytes(artifact[0].read_bytes())
    rc, out, err = cli(capsys, "run", kiln_as_onnx, "--random")
    assert rc == 1 and "error:" in err and "Traceback" not in err


def test_inspect_shows_the_file_hash(artifact, capsys):
    rc, out, err = cli(capsys, "inspect", artifact[0])
    assert rc == 0, err
    assert hashlib.sha256(artifact[0].read_bytes()).hexdigest() in out


def test_a_good_artifact_still_runs(artifact):
    feeds = inputs(batch=2, seed=9)
    got = kiln.load(artifact[0]).run(feeds)
    for name, want in reference(**feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6)


def test_other_weights_under_a_rewritten_manifest_are_refused(artifact, tmp_path):
    """Same-size weights of another model, with weights_sha256 and SHA256SUMS rewritten to
    match: the library itself reports the hash of the weights it was built with."""
    files = members(artifact[0])
    m = artifact[1]
    raw = bytearray(files[art.WEIGHTS][m["weights_offset"]:])
    raw[0] ^= 0xFF
    new_npy, _ = art.weights_npy(bytes(raw))
    bad = tmp_path / "swapped.kiln"
    rewrite_manifest(artifact[0], bad, lambda man: man.update(weights_sha256=hashlib.sha256(raw).hexdigest()),
                     weights_npy=new_npy)
    with pytest.raises(KilnError, match="weights_sha256: the library was built for"):
        kiln.load(bad)


def test_weights_are_read_without_pickle(artifact, tmp_path):
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    bad = tmp_path / "pickled.kiln"
    rewrite_manifest(artifact[0], bad, weights_npy=buf.getvalue())
    with pytest.raises(KilnError, match="weights"):
        kiln.load(bad)


def test_every_truncation_of_a_library_is_caught_before_dlopen(artifact):
    """A hash proves the bytes are the recorded ones, not that they are a whole library:
    the ELF check refuses each cut (mapped, it would SIGBUS at the first missing page)."""
    from kiln.runtime.elf import check_elf
    lib = members(artifact[0])[art.LIBRARY]
    check_elf(lib, "whole")
    for cut in range(0, len(lib), max(1, len(lib) // 997)):
        with pytest.raises(KilnError, match="not a loadable shared library"):
            check_elf(lib[:cut], "cut")


def test_a_cut_library_with_matching_sums_is_refused_not_a_crash(artifact, tmp_path):
    """The fuzzer's case: model.so cut in half and SHA256SUMS rewritten to match."""
    files = members(artifact[0])
    files[art.LIBRARY] = files[art.LIBRARY][:len(files[art.LIBRARY]) // 2]
    bad = tmp_path / "cut.kiln"
    rewrite_manifest(artifact[0], bad, model_so=files[art.LIBRARY])
    script = (f"import kiln, sys\ntry:\n    kiln.load({str(bad)!r})\nexcept kiln.KilnError as e:\n"
              f"    print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and "not a loadable shared library" in r.stdout, (r.returncode, r.stderr)
