"""The artifact's C header: C programs link artifacts' libraries, run them, match Python.

Each artifact's symbols and macros carry its name (`first_run`, `FIRST_WEIGHTS_BYTES`),
so one program can link several; the app below is generated for any list of artifacts.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile

import numpy as np
import onnx
import pytest

import kiln
from kiln.codegen.header import Port, _c_string, emit_header
from kiln.dtypes import DType
from tests.runtime.models import (elementwise_model, inputs, narrow_inputs, narrow_model, narrow_reference,
                                  reference)

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler")

HELPERS = r"""
#include <stdio.h>
#include <stdlib.h>

static void* buffer(size_t n) {  /* aligned, size rounded up as aligned_alloc requires */
    void* p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}

static void* slurp_at(const char* path, long offset, size_t n) {
    void* p = buffer(n);
    FILE* f = fopen(path, "rb");
    if (!f || fseek(f, offset, SEEK_SET) != 0 || fread(p, 1, n, f) != n) {
        fprintf(stderr, "cannot read %s\n", path); exit(2);
    }
    fclose(f);
    return p;
}

static void* slurp(const char* path, size_t n) { return slurp_at(path, 0, n); }

static void dump(const char* path, const void* p, size_t n) {
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) { fprintf(stderr, "cannot write %s\n", path); exit(2); }
    fclose(f);
}
"""


def app_source(models: list[tuple[str, int, int]]) -> str:
    """A C program running each (name, inputs, outputs) artifact once: it reads NAME/weights.npy
    and NAME.in<k>.bin, writes NAME.out<k>.bin, and prints each output's name and shape."""
    lines = [f'#include "{name}/model.h"' for name, _, _ in models] + [HELPERS, "int main(void) {"]
    for name, n_in, n_out in models:
        up = name.upper()
        lines.append("  {")
        lines.append(f'    const uint8_t* w = slurp_at("{name}/weights.npy", {up}_WEIGHTS_OFFSET, '
                     f'{up}_WEIGHTS_BYTES);')
        lines.append(f"    uint8_t* ws = buffer({up}_WORKSPACE_BYTES);")
        args = []
        for k in range(n_in):
            lines.append(f'    const void* in{k} = slurp("{name}.in{k}.bin", {up}_INPUT_{k}_BYTES);')
            args.append(f"in{k}")
        for k in range(n_out):
            lines.append(f"    void* out{k} = buffer({up}_OUTPUT_{k}_BYTES);")
            args.append(f"out{k}")
        lines.append(f"    int32_t rc = {name}_run({', '.join(args)}, w, ws);")
        lines.append(f'    if (rc != 0) {{ fprintf(stderr, "{name}_run: %d\\n", rc); return 3; }}')
        for k in range(n_out):
            lines.append(f'    dump("{name}.out{k}.bin", out{k}, {up}_OUTPUT_{k}_BYTES);')
            lines.append(f"    int64_t shape{k}[] = {up}_OUTPUT_{k}_SHAPE;")
            lines.append(f'    printf("%s %s %d %lld\\n", {up}_OUTPUT_{k}_NAME, {up}_OUTPUT_{k}_DTYPE, '
                         f"{up}_OUTPUT_{k}_RANK, (long long)shape{k}[0]);")
        lines.append("  }")
    return "\n".join(lines + ["  return 0;", "}", ""])


def build_and_run(folder, artifacts: dict[str, tuple], feeds: dict[str, dict]) -> str:
    """Unpack each artifact into folder/NAME, link all their libraries into one app, run it."""
    for name, (path, _) in artifacts.items():
        with zipfile.ZipFile(path) as z:
            z.extractall(folder / name)
        shutil.copy(folder / name / "model.so", folder / f"lib{name}.so")
        for k, x in enumerate(feeds[name].values()):
            x.tofile(folder / f"{name}.in{k}.bin")
    models = [(name, len(m["inputs"]), len(m["outputs"])) for name, (_, m) in artifacts.items()]
    (folder / "app.c").write_text(app_source(models))
    build = subprocess.run([CC, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "app.c", "-L.",
                            *[f"-l{name}" for name in artifacts], "-Wl,-rpath,$ORIGIN", "-o", "app"],
                           cwd=folder, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run(["./app"], cwd=folder, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout


def outputs_of(folder, name: str, manifest: dict) -> dict[str, np.ndarray]:
    return {o["name"]: np.fromfile(folder / f"{name}.out{k}.bin", DType.from_name(o["dtype"]).np)
            .reshape(o["shape"]) for k, o in enumerate(manifest["outputs"])}


def test_c_program_matches_python(artifact, tmp_path):
    path, manifest = artifact
    assert manifest["name"] == "elementwise" and manifest["entry"] == "elementwise_main"
    feeds = inputs(batch=2, seed=7)
    stdout = build_and_run(tmp_path, {"elementwise": artifact}, {"elementwise": feeds})
    assert stdout.split() == ["y", "float32", "2", "2", "z", "float32", "2", "2"]
    want = kiln.load(path).run(feeds)
    got = outputs_of(tmp_path, "elementwise", manifest)
    for name in ("y", "z"):
        np.testing.assert_array_equal(got[name], want[name])


def test_two_artifacts_link_into_one_program(tmp_path):
    """Same kernels (the same model at two batch sizes) and a model with bfloat16/float16
    inputs and outputs, three libraries in one process: no symbol may clash or interpose."""
    onnx.save(elementwise_model(), tmp_path / "ew.onnx")
    model = kiln.compile(tmp_path / "ew.onnx")
    arts = {name: (tmp_path / f"{name}.kiln", kiln.save(model, tmp_path / f"{name}.kiln", dims={"batch": b},
                                                      source=tmp_path / "ew.onnx", name=name))
            for name, b in (("first", 2), ("second", 3))}
    arts["narrow"] = (tmp_path / "n.kiln", kiln.save(kiln.compile(narrow_model()), tmp_path / "n.kiln",
                                                     name="narrow"))
    feeds = {"first": inputs(batch=2, seed=1), "second": inputs(batch=3, seed=2), "narrow": narrow_inputs(3)}
    stdout = build_and_run(tmp_path / "app", arts, feeds)
    assert stdout.split() == ["y", "float32", "2", "2", "z", "float32", "2", "2",
                              "y", "float32", "2", "3", "z", "float32", "2", "3",
                              "y", "bfloat16", "2", "2", "z", "float16", "2", "2"]
    for name, (path, manifest) in arts.items():
        got = outputs_of(tmp_path / "app", name, manifest)
        want = (narrow_reference if name == "narrow" else reference)(**feeds[name])
        for k, w in want.items():
            assert got[k].dtype == w.dtype
            np.testing.assert_allclose(got[k].astype(np.float32), w.astype(np.float32), rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(got[k], kiln.load(path).run(feeds[name])[k])
    nm = subprocess.run(["nm", "-D", "--defined-only", str(tmp_path / "app" / "libfirst.so")],
                        capture_output=True, text=True)
    if nm.returncode == 0:  # every exported function carries the artifact's name
        funcs = [line.split()[-1] for line in nm.stdout.splitlines() if line.split()[1] == "T"]
        assert "first_main" in funcs and all(f.startswith("first_") for f in funcs), funcs


def test_header_escapes_names_and_compiles(tmp_path):
    """Tensor names reach the header only as escaped string literals."""
    source = "int32_t net_main(const int64_t* b0_in_0, bool* b1_out_0, uint8_t* b2_weights, uint8_t* b3_ws) {"
    odd = 'a"b*/\\\n??='
    header = emit_header(source, "net_main", [Port(odd, DType.int64, ())], [Port("ok", DType.bool, (3,))],
                         64, 128, "net")
    assert _c_string(odd) in header and odd not in header
    (tmp_path / "model.h").write_text(header)
    (tmp_path / "t.c").write_text('#include <stdio.h>\n#include "model.h"\n'
                                  'int main(void) { fputs(NET_INPUT_0_NAME, stdout); '
                                  'return NET_INPUT_0_RANK + NET_OUTPUT_0_ELEMENTS; }\n')
    r = subprocess.run([CC, "-std=c11", "-Wall", "-Werror", "t.c", "-o", "t"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["./t"], cwd=tmp_path, capture_output=True)
    assert r.stdout == odd.encode() and r.returncode == 3
    assert "NET_INPUT_0_SHAPE" not in header  # a scalar has no dims
    assert "#define NET_OUTPUT_0_SHAPE {3}" in header
    assert "static inline int32_t net_run(const int64_t* in_0, bool* out_0," in header


def test_narrow_dtypes_in_the_header(tmp_path):
    """bfloat16 and float8 travel as their bits; float16 as _Float16."""
    source = "int32_t m_main(const uint16_t* a, const uint8_t* b, _Float16* c, uint8_t* w, uint8_t* ws) {"
    header = emit_header(source, "m_main", [Port("a", DType.bfloat16, (2,)), Port("b", DType.float8e4m3fn, (2,))],
                         [Port("c", DType.float16, (2,))], 0, 64, "m")
    assert "const uint16_t* in_0, const uint8_t* in_1, _Float16* out_0" in header
    assert "#define M_INPUT_0_BYTES 4" in header and "#define M_INPUT_1_BYTES 2" in header
    (tmp_path / "model.h").write_text(header)
    (tmp_path / "t.c").write_text('#include "model.h"\nint main(void) { return M_OUTPUT_0_BYTES; }\n')
    r = subprocess.run([CC, "-std=gnu11", "-Wall", "-Werror", "-fsyntax-only", "t.c"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_c_program_runs_a_string_model(tmp_path):
    """String tensors through the header: kiln_str inputs, made strings read back, then
    <name>_strings_release() frees the library's arena."""
    from onnx import TensorProto as TP, helper as oh, numpy_helper
    nodes = [oh.make_node("StringNormalizer", ["x"], ["u"], case_change_action="UPPER"),
             oh.make_node("StringConcat", ["u", "k"], ["y"])]
    g = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TP.STRING, [3])],
                      [oh.make_tensor_value_info("y", TP.STRING, [3])],
                      [numpy_helper.from_array(np.array(["!"], dtype=object), "k")])
    path = tmp_path / "s.kiln"
    kiln.save(kiln.compile(oh.make_model(g, opset_imports=[oh.make_opsetid("", 20)])), path, name="words")
    with zipfile.ZipFile(path) as z:
        z.extractall(tmp_path / "words")
    shutil.copy(tmp_path / "words" / "model.so", tmp_path / "libwords.so")
    (tmp_path / "app.c").write_text('#include "words/model.h"\n' + HELPERS + r"""
#include <string.h>
int main(void) {
    const uint8_t* w = slurp_at("words/weights.npy", WORDS_WEIGHTS_OFFSET, WORDS_WEIGHTS_BYTES);
    uint8_t* ws = buffer(WORDS_WORKSPACE_BYTES);
    kiln_str in[3] = {{"ab", 2}, {"\xc3\x9f", 2}, {"", 0}};
    kiln_str out[3];
    int32_t rc = words_run(in, out, w, ws);
    if (rc != 0) { fprintf(stderr, "words_run: %d\n", rc); return 3; }
    for (int i = 0; i < 3; ++i) printf("[%.*s]\n", (int)out[i].len, out[i].ptr);
    (void)slurp; (void)dump;
    return words_strings_release();
}
""")
    build = subprocess.run([CC, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "app.c", "-L.", "-lwords",
                            "-Wl,-rpath,$ORIGIN", "-o", "app"], cwd=tmp_path, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run(["./app"], cwd=tmp_path, capture_output=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.decode().split() == ["[AB!]", "[SS!]", "[!]"]
