"""kiln.targets.Target: the CPU code is generated for, from the host or from a CPU name;
passed down to the passes, lowering, the build and the cache key; recorded in artifacts,
whose loader refuses a CPU lacking the target's features."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import kiln
from kiln import KilnError
from kiln.dtypes import DType
from kiln.lower.gemm import weight_panel_width
from kiln.runtime.cpu import cpu_features
from kiln.targets.target import NAMED, Target

ROOT = __file__.rsplit("/tests/", 1)[0]
X86 = platform.machine().lower() in ("x86_64", "amd64")


def test_host_is_what_the_machine_says():
    h = Target.host()
    assert h is Target.host() and Target.of(None) is h and Target.named("host") is h
    assert h.features == cpu_features() and h.march == "native" and h.cores == (os.cpu_count() or 1)
    assert h.vector_bytes == (64 if "avx512f" in h.features else 32 if {"avx", "avx2"} & h.features else 16)
    assert 0 < h.l1d_bytes <= h.l2_bytes <= h.l3_bytes


def test_named_cpus_have_gccs_features():
    v2, v3, v4 = (Target.named(f"x86-64-v{k}") for k in (2, 3, 4))
    assert v2.features < v3.features < v4.features
    assert {"avx2", "fma", "bmi2", "f16c", "movbe"} <= v3.features and not any("avx512" in f for f in v3.features)
    assert {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"} <= v4.features
    assert v3.vector_bytes == 32 and v3.vector_registers == 16 and v3.vector_lanes(4) == 8
    assert v4.vector_bytes == 64 and v4.vector_registers == 32 and v4.vector_lanes(2) == 32
    assert v4.features < Target.named("sapphirerapids").features
    assert "avx512_bf16" in Target.named("znver4").features and "sse4a" in Target.named("znver3").features
    assert not any("avx512" in f for f in Target.named("znver3").features)
    assert all(Target.named(n).name == n for n in NAMED)


def test_key_is_stable_and_says_what_differs():
    v3 = Target.named("x86-64-v3")
    assert v3.key() == Target.named("x86-64-v3").key()
    assert len({Target.named(n).key() for n in NAMED}) == len(NAMED)   # -march differs, if nothing else
    assert Target.named("x86-64-v3", cores=64).key() != v3.key()


def test_unknown_cpu_is_a_clear_error():
    with pytest.raises(KilnError, match="unknown CPU 'pentium9'.*x86-64-v3"):
        Target.named("pentium9")
    with pytest.raises(KilnError, match="unknown target 'pentium9'"):
        kiln.compile(_model(), target="pentium9")
    with pytest.raises(KilnError, match="CPU target is a kiln Target or a CPU name"):
        Target.of(42)


def test_flags_follow_the_target():
    from kiln.codegen.build import default_cflags
    assert "-march=native" in default_cflags(Target.host())
    v3 = default_cflags(Target.named("x86-64-v3"))
    assert "-march=x86-64-v3" in v3 and "native" not in v3
    if X86:
        assert "-mprefer-vector-width=256" in v3


def _model() -> onnx.ModelProto:
    """A pointwise and a depthwise Conv (NCHWc at -O3), a pool and a MatMul with a constant
    weight (packed panels): what the target's vector width shapes."""
    rng = np.random.default_rng(0)
    consts = {"w1": rng.standard_normal((32, 16, 1, 1)) * 0.2, "w2": rng.standard_normal((32, 1, 3, 3)) * 0.2,
              "m": rng.standard_normal((32, 40)) * 0.2}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="pw"),
             helper.make_node("Relu", ["a"], ["b"], name="r1"),
             helper.make_node("Conv", ["b", "w2"], ["c"], name="dw", group=32, pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["e"], name="gap"),
             helper.make_node("Flatten", ["e"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "m"], ["y"], name="fc")]
    g = helper.make_graph(nodes, "targeted",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 16, 8, 8])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 40])],
                          [numpy_helper.from_array(v.astype(np.float32), k) for k, v in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_graph_decisions_follow_the_target_not_the_host():
    """The NCHWc block and the packed weight's panel width come from the target's vector width."""
    m = _model()
    for name, block, lanes in (("x86-64-v3", 8, 8), ("x86-64-v4", 16, 16)):
        text = str(kiln.compile(m, cpu=name).graph)
        panel = weight_panel_width(40, 32, DType.float32, Target.named(name))    # 40 columns
        assert panel % lanes == 0 and panel <= 4 * lanes, (name, panel)
        # (the classifier reads the pooled pixel blocked: its weight is %m.nchwc<block>.panels<panel>)
        assert f"{{block = {block}}}" in text and f"%m.nchwc{block}.panels{panel}:" in text, name
    same = kiln.compile(m, target=Target.named("x86-64-v3"))
    assert same.cpu == Target.named("x86-64-v3") and "{block = 8}" in str(same.graph)


def test_lowering_decisions_follow_the_target_not_the_host():
    """At -O0 the graph is the same for every CPU: what differs in the loops is the lowering's
    (conv register blocks, GEMM tiles, vector loops sized from the target's vectors)."""
    import re

    from kiln.compiler import run_stages

    def widths(cpu):
        text = run_stages(_model(), "loops", opt_level=0, cpu=cpu).text("loops")
        return text, [int(n) for n in re.findall(r"vectorized for \(\S+ = 0; \S+ < (\d+);", text)]
    (t3, w3), (t4, w4) = widths("x86-64-v3"), widths("x86-64-v4")
    assert t3 != t4 and max(w3) < max(w4)
    assert t4 == widths(Target.named("x86-64-v4"))[0]


@pytest.mark.skipif(not X86, reason="x86-64 CPU levels")
def test_code_for_another_cpu_gives_the_reference_result():
    x = np.random.default_rng(1).standard_normal((2, 16, 8, 8)).astype(np.float32)
    want = kiln.compile(_model(), target="interpreter").run(x=x)["y"]
    runnable = [n for n in ("x86-64-v2", "x86-64-v3", "x86-64-v4")
                if Target.named(n).features <= cpu_features()]
    for name in runnable:
        np.testing.assert_allclose(kiln.compile(_model(), cpu=name).run(x=x)["y"], want, rtol=1e-4, atol=1e-5)


def _load_as(path, features: frozenset, tmp_path) -> subprocess.CompletedProcess:
    """Load and run artifact `path` in a fresh process whose load check sees only `features`."""
    script = textwrap.dedent(f"""
        import numpy as np, kiln
        m = kiln.load({str(path)!r})
        np.save({str(tmp_path / "y.npy")!r}, m.run(x=np.load({str(tmp_path / "x.npy")!r}))["y"])
    """)
    env = {**os.environ, "KILN_CHECK_CPU_FEATURES": ",".join(sorted(features))}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env)


@pytest.mark.skipif(not X86, reason="x86-64 CPU levels")
def test_portable_artifact_runs_where_avx2_is_all_there_is(tmp_path):
    """Acceptance (issue 12): an x86-64-v3 artifact built here runs in a process whose CPU
    check says AVX2 and no AVX-512; an x86-64-v4 one is refused there with a clear error."""
    avx2 = Target.named("x86-64-v3").features
    if not avx2 <= cpu_features():
        pytest.skip("this CPU has no AVX2: it cannot run x86-64-v3 code")
    x = np.random.default_rng(2).standard_normal((2, 16, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = kiln.compile(_model(), target="interpreter").run(x=x)["y"]
    v3 = tmp_path / "v3.kiln"
    manifest = kiln.save(kiln.compile(_model(), cpu="x86-64-v3"), v3)
    t = manifest["target"]
    assert t["cpu"] == "x86-64-v3" and "-march=x86-64-v3" in t["cflags"] and set(t["features"]) == set(avx2)
    if shutil.which("objdump"):
        with zipfile.ZipFile(v3) as z:
            (tmp_path / "v3.so").write_bytes(z.read("model.so"))
        asm = subprocess.run(["objdump", "-d", str(tmp_path / "v3.so")], capture_output=True, text=True).stdout
        assert "%ymm" in asm and "%zmm" not in asm
    r = _load_as(v3, avx2, tmp_path)
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-5)

    v4 = tmp_path / "v4.kiln"
    kiln.save(kiln.compile(_model(), cpu="x86-64-v4"), v4)
    r = _load_as(v4, avx2, tmp_path)
    assert r.returncode != 0
    assert "KilnError" in r.stderr and "avx512" in r.stderr and "which this CPU lacks" in r.stderr, r.stderr
    assert "built for a CPU (x86-64-v4)" in r.stderr and "--cpu x86-64-v3" in r.stderr


def test_cli_compile_cpu(tmp_path):
    from click.testing import CliRunner

    from kiln.cli import cli
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    out = tmp_path / "m.kiln"
    r = CliRunner().invoke(cli, ["compile", str(src), "--cpu", "x86-64-v3", "-o", str(out)])
    assert r.exit_code == 0, r.output
    with zipfile.ZipFile(out) as z:
        target = json.loads(z.read("manifest.json"))["target"]
    assert target["cpu"] == "x86-64-v3" and target["key"] == Target.named("x86-64-v3").key()
    r = CliRunner().invoke(cli, ["compile", str(src), "--cpu", "pentium9"])
    assert r.exit_code != 0 and "pentium9" in r.output
