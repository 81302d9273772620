"""Artifacts: save → load round trip, the manifest, and loading with numpy and ctypes alone."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

import kiln
from kiln import KilnError
from kiln.runtime import artifact as art
from tests.runtime.models import inputs, narrow_inputs, narrow_model, narrow_reference, reference

ROOT = __file__.rsplit("/tests/", 1)[0]


def rewrite_manifest(src, dst, edit=lambda m: None, **replace: bytes) -> None:
    """Copy artifact `src` to `dst` with `edit(manifest)` applied and files replaced."""
    with zipfile.ZipFile(src) as z:
        files = {n: z.read(n) for n in z.namelist() if n != art.MANIFEST}
        manifest = json.loads(z.read(art.MANIFEST))
    edit(manifest)
    files.update({name.replace("_", "."): data for name, data in replace.items()})
    art.write_artifact(dst, manifest, files)


def test_round_trip_matches_numpy(artifact):
    path, _ = artifact
    model = kiln.load(path)
    feeds = inputs(batch=2)
    got = model.run(feeds)
    for name, want in reference(**feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6)
    assert model.target == "cpu"
    assert [str(s) for s in model.inputs] == ["x: float32[2,4]", "s: float32[2,4]"]


def test_manifest_says_what_is_inside(artifact, onnx_path):
    path, manifest = artifact
    assert art.read_manifest(path) == manifest
    assert manifest["format"] == "kiln-artifact" and manifest["kiln_version"] == kiln.__version__
    assert manifest["source"] == {"file": "elementwise.onnx",
                                  "sha256": hashlib.sha256(onnx_path.read_bytes()).hexdigest()}
    assert manifest["inputs"] == [{"name": "x", "dtype": "float32", "shape": [2, 4]},
                                  {"name": "s", "dtype": "float32", "shape": [2, 4]}]
    assert [o["name"] for o in manifest["outputs"]] == ["y", "z"]
    assert manifest["dims"] == {"batch": 2}
    assert manifest["target"]["arch"] and isinstance(manifest["target"]["features"], list)
    assert manifest["kernels"] and manifest["workspace_bytes"] > 0
    with zipfile.ZipFile(path) as z:
        assert sorted(z.namelist()) == sorted([art.MANIFEST, "model.so", "model.h", "model.c", "weights.npy",
                                               "SHA256SUMS"])
        npy = z.read("weights.npy")
    weights = npy[manifest["weights_offset"]:]
    assert manifest["weights_offset"] % 64 == 0
    assert np.array_equal(np.load(io.BytesIO(npy), allow_pickle=False), np.frombuffer(weights, np.uint8))
    assert len(weights) == manifest["weights_bytes"]
    assert hashlib.sha256(weights).hexdigest() == manifest["weights_sha256"]


def test_loads_without_any_compiler_module(artifact, tmp_path):
    """The deployment promise: numpy + ctypes, with every compiler folder unimportable."""
    path, _ = artifact
    feeds = inputs(batch=2, seed=3)
    for k, v in feeds.items():
        np.save(tmp_path / f"{k}.npy", v)
    for k, v in reference(**feeds).items():
        np.save(tmp_path / f"want_{k}.npy", v)
    script = textwrap.dedent(f"""
        import sys
        BLOCKED = ("kiln.compiler", "kiln.frontends", "kiln.lower", "kiln.codegen", "kiln.loops",
                   "kiln.ops", "kiln.passes", "kiln.graph", "kiln.interpreter", "kiln.targets",
                   "kiln.tune", "kiln.export", "onnx")

        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                    raise ImportError("blocked for this test: " + name)

        sys.meta_path.insert(0, Blocker())
        import numpy as np
        import kiln
        m = kiln.load({str(path)!r})
        d = {str(tmp_path)!r}
        out = m.run(x=np.load(d + "/x.npy"), s=np.load(d + "/s.npy"))
        for k, v in out.items():
            np.testing.assert_allclose(v, np.load(d + "/want_" + k + ".npy"), rtol=1e-5, atol=1e-6)
        loaded = sorted(n for n in sys.modules if n.startswith("kiln"))
        print(" ".join(loaded))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert set(r.stdout.split()) <= {"kiln", "kiln.errors", "kiln.names", "kiln.limits", "kiln.dtypes", "kiln.runtime", "kiln.runtime.model",
                                     "kiln.runtime.native", "kiln.runtime.cpu", "kiln.runtime.artifact",
                                     "kiln.runtime.schema", "kiln.runtime.strings", "kiln.runtime.elf",
                                     "kiln.runtime.threads", "kiln.runtime.pages"}


def test_import_kiln_is_cheap():
    r = subprocess.run([sys.executable, "-c", "import sys, kiln; print(sorted(sys.modules))"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    mods = eval(r.stdout)
    assert "kiln.compiler" not in mods and "onnx" not in mods and "numpy" not in mods


def test_cpu_lacking_a_feature_is_a_clear_error(artifact, tmp_path):
    path, _ = artifact
    bad = tmp_path / "fancy.kiln"
    rewrite_manifest(path, bad, lambda m: m["target"]["features"].append("avx9000_quantum"))
    with pytest.raises(KilnError, match="avx9000_quantum, which this CPU lacks"):
        kiln.load(bad)


def test_other_architecture_is_a_clear_error(artifact, tmp_path):
    path, _ = artifact
    bad = tmp_path / "other.kiln"
    rewrite_manifest(path, bad, lambda m: m["target"].update(arch="pdp11"))
    with pytest.raises(KilnError, match="built for pdp11"):
        kiln.load(bad)


def test_newer_format_version_is_refused(artifact, tmp_path):
    path, _ = artifact
    bad = tmp_path / "future.kiln"
    rewrite_manifest(path, bad, lambda m: m.update(format_version=99))
    with pytest.raises(KilnError, match="format version 99"):
        kiln.load(bad)


def test_damaged_library_is_a_clear_error(artifact, tmp_path):
    bad = tmp_path / "damaged.kiln"
    rewrite_manifest(artifact[0], bad, model_so=b"not an ELF file")
    with pytest.raises(KilnError, match="not a loadable shared library"):
        kiln.load(bad)


def test_damaged_weights_are_a_clear_error(artifact, tmp_path):
    pickled = tmp_path / "pickled.kiln"
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    rewrite_manifest(artifact[0], pickled, weights_npy=buf.getvalue())
    with pytest.raises(KilnError, match="weights"):
        kiln.load(pickled)              # never unpickled
    wide = tmp_path / "wide.kiln"
    buf = io.BytesIO()
    np.save(buf, np.zeros(3, np.float32))
    rewrite_manifest(artifact[0], wide, weights_npy=buf.getvalue())
    with pytest.raises(KilnError, match="weights"):
        kiln.load(wide)


def test_not_an_artifact(tmp_path, onnx_path):
    with pytest.raises(KilnError, match="artifact not found"):
        kiln.load(tmp_path / "missing.kiln")
    with pytest.raises(KilnError, match="not a zip"):
        kiln.load(onnx_path)
    plain = tmp_path / "plain.zip"
    with zipfile.ZipFile(plain, "w") as z:
        z.writestr("hello.txt", "hi")
    with pytest.raises(KilnError, match="no manifest.json"):
        kiln.load(plain)


def test_input_validation_still_applies(artifact):
    model = kiln.load(artifact[0])
    with pytest.raises(KilnError, match=r"input 'x': expected shape \(2, 4\)"):
        model.run(x=np.zeros((3, 4), np.float32), s=np.zeros((2, 4), np.float32))


def test_saving_needs_bound_dims_and_the_cpu_target(onnx_path, tmp_path):
    with pytest.raises(KilnError, match=r"symbolic dim\(s\) \['batch'\].*--dim batch=N"):
        kiln.save(kiln.compile(onnx_path), tmp_path / "a.kiln")
    with pytest.raises(KilnError, match=r"unknown dim\(s\) \['seq'\]"):
        kiln.save(kiln.compile(onnx_path), tmp_path / "a.kiln", dims={"batch": 1, "seq": 2})
    with pytest.raises(KilnError, match="only target 'cpu'"):
        kiln.save(kiln.compile(onnx_path, target="interpreter"), tmp_path / "a.kiln", dims={"batch": 1})
    assert not (tmp_path / "a.kiln").exists()


def test_artifacts_are_reproducible(onnx_path, tmp_path):
    model = kiln.compile(onnx_path)
    a, b = tmp_path / "a.kiln", tmp_path / "b.kiln"
    kiln.save(model, a, dims={"batch": 1}, source=onnx_path)
    kiln.save(model, b, dims={"batch": 1}, source=onnx_path)
    assert a.read_bytes() == b.read_bytes()


def test_narrow_dtypes_round_trip(tmp_path):
    """bfloat16 and float16 inputs and outputs: saved, loaded and run; the header holds their bits."""
    path = tmp_path / "half-precision.kiln"
    manifest = kiln.save(kiln.compile(narrow_model()), path, source=None)
    assert [p["dtype"] for p in manifest["inputs"] + manifest["outputs"]] == \
        ["bfloat16", "float16", "bfloat16", "float16"]
    feeds = narrow_inputs(seed=4)
    got = kiln.load(path).run(feeds)
    for name, want in narrow_reference(**feeds).items():
        assert got[name].dtype == want.dtype
        np.testing.assert_array_equal(got[name], want)
    with zipfile.ZipFile(path) as z:
        header = z.read("model.h").decode()
    assert "static inline int32_t model_run(const uint16_t* in_0, const _Float16* in_1, uint16_t* out_0, " \
        "_Float16* out_1," in header


def test_symbol_prefix_from_name_or_source(onnx_path, tmp_path):
    model = kiln.compile(onnx_path)
    odd = tmp_path / "3d-net.v2.onnx"
    odd.write_bytes(onnx_path.read_bytes())
    m = kiln.save(model, tmp_path / "a.kiln", dims={"batch": 1}, source=odd)
    assert (m["name"], m["entry"]) == ("m_3d_net_v2", "m_3d_net_v2_main")
    with zipfile.ZipFile(tmp_path / "a.kiln") as z:
        source, header = z.read("model.c").decode(), z.read("model.h").decode()
    assert "int32_t m_3d_net_v2_main(" in source and "kiln_main" not in source
    assert source.count("#include <stdint.h>") == 1  # one translation unit: cc -c model.c builds it
    assert "#define M_3D_NET_V2_WEIGHTS_BYTES" in header
    with pytest.raises(KilnError, match="must be a C identifier"):
        kiln.save(model, tmp_path / "b.kiln", dims={"batch": 1}, name="my-net")
    m = kiln.save(model, tmp_path / "b.kiln", dims={"batch": 1}, name="net2")
    assert m["entry"] == "net2_main"
    np.testing.assert_allclose(kiln.load(tmp_path / "b.kiln").run(inputs(batch=1))["z"],
                               reference(**inputs(batch=1))["z"], rtol=1e-6)
