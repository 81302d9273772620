"""The artifact's C header: a C program links the library, runs the model, matches Python."""

from __future__ import annotations

import shutil
import subprocess
import zipfile

import numpy as np
import pytest

import kiln
from kiln.codegen.header import Port, _c_string, emit_header
from kiln.dtypes import DType
from tests.runtime.models import inputs

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler")

APP = r"""
#include <stdio.h>
#include <stdlib.h>
#include "model.h"

static void* buffer(size_t n) {  /* aligned, size rounded up as aligned_alloc requires */
    return aligned_alloc(KILN_ALIGN, (n + KILN_ALIGN - 1) / KILN_ALIGN * KILN_ALIGN);
}

static void* slurp(const char* path, size_t n) {
    void* p = buffer(n);
    FILE* f = fopen(path, "rb");
    if (!f || fread(p, 1, n, f) != n) { fprintf(stderr, "cannot read %s\n", path); exit(2); }
    fclose(f);
    return p;
}

static void dump(const char* path, const void* p, size_t n) {
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) { fprintf(stderr, "cannot write %s\n", path); exit(2); }
    fclose(f);
}

int main(void) {
    const uint8_t* weights = slurp("weights.bin", KILN_WEIGHTS_BYTES);
    uint8_t* workspace = buffer(KILN_WORKSPACE_BYTES);
    const float* x = slurp("x.bin", KILN_INPUT_0_BYTES);
    const float* s = slurp("s.bin", KILN_INPUT_1_BYTES);
    float* y = buffer(KILN_OUTPUT_0_BYTES);
    float* z = buffer(KILN_OUTPUT_1_BYTES);
    int64_t shape[] = KILN_OUTPUT_0_SHAPE;
    int32_t rc = kiln_model_run(x, s, y, z, weights, workspace);
    if (rc != 0) { fprintf(stderr, "kiln_model_run: %d\n", rc); return 3; }
    dump("y.bin", y, KILN_OUTPUT_0_BYTES);
    dump("z.bin", z, KILN_OUTPUT_1_BYTES);
    printf("%s %s %d %lld %lld\n", KILN_OUTPUT_0_NAME, KILN_OUTPUT_1_NAME, KILN_OUTPUT_0_RANK,
           (long long)shape[0], (long long)shape[1]);
    return 0;
}
"""


def test_c_program_matches_python(artifact, tmp_path):
    path, _ = artifact
    with zipfile.ZipFile(path) as z:
        z.extractall(tmp_path)
    feeds = inputs(batch=2, seed=7)
    for k, v in feeds.items():
        v.tofile(tmp_path / f"{k}.bin")
    (tmp_path / "app.c").write_text(APP)
    build = subprocess.run([CC, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "app.c", "./model.so",
                            "-Wl,-rpath,$ORIGIN", "-o", "app"], cwd=tmp_path, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run(["./app"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["y", "z", "2", "2", "4"]
    want = kiln.load(path).run(feeds)
    for name in ("y", "z"):
        got = np.fromfile(tmp_path / f"{name}.bin", dtype=np.float32).reshape(2, 4)
        np.testing.assert_array_equal(got, want[name])


def test_header_escapes_names_and_compiles(tmp_path):
    """Tensor names reach the header only as escaped string literals."""
    source = "int32_t kiln_main(const int64_t* b0_in_0, bool* b1_out_0, uint8_t* b2_weights, uint8_t* b3_ws) {"
    odd = 'a"b*/\\\n??='
    header = emit_header(source, "kiln_main", [Port(odd, DType.int64, ())], [Port("ok", DType.bool, (3,))],
                         64, 128)
    assert _c_string(odd) in header and odd not in header
    (tmp_path / "model.h").write_text(header)
    (tmp_path / "t.c").write_text('#include <stdio.h>\n#include "model.h"\n'
                                  'int main(void) { fputs(KILN_INPUT_0_NAME, stdout); '
                                  'return KILN_INPUT_0_RANK + KILN_OUTPUT_0_ELEMENTS; }\n')
    r = subprocess.run([CC, "-std=c11", "-Wall", "-Werror", "t.c", "-o", "t"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["./t"], cwd=tmp_path, capture_output=True)
    assert r.stdout == odd.encode() and r.returncode == 3
    assert "KILN_INPUT_0_SHAPE" not in header  # a scalar has no dims
    assert "#define KILN_OUTPUT_0_SHAPE {3}" in header
