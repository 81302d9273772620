"""Every kernel kiln lowers prints as text that parses back to the same loop IR
(and the parsed module generates the same C, up to identifier names).

Benchmark models at the default level and -O0, a sample of the ONNX conformance node
models that lower natively (chosen so that together they produce every kind of IR node,
which is asserted: a lowering change that drops one makes the sample say which), and
random computes under random schedules (the property tests' generators). The whole
conformance node suite is the slow variant.
"""

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.models import MODELS
from kiln.codegen.c import emit_c
from kiln.compiler import run_stages
from kiln.errors import KilnError
from kiln.loops import lower
from kiln.loops import stmt as S
from kiln.loops.expr import BINARY, Expr, walk
from kiln.loops.parse import parse_func, parse_module
from kiln.loops.structural import assert_structural_equal
from tests.conformance.cases import node_cases
from tests.loops.test_properties import SETTINGS, elementwise, matmul, random_schedule, reduction


def loop_module(model, opt_level=None) -> S.LoopModule:
    """The LoopModule kiln builds for an ONNX model with static shapes (the pipeline's own)."""
    return run_stages(model, "loops", opt_level=opt_level).lowered.module


def _numbered(c_source: str) -> str:
    """C source with each generated identifier (v12_name, b3_name) cut to its number:
    a parsed module's names can carry the printer's _1 suffixes."""
    return re.sub(r"\b([vb]\d+)_\w*", r"\1", c_source)


def assert_roundtrips(module: S.LoopModule, c: bool = False) -> None:
    """Parsed back: structurally equal, printing the same text, each function alone too,
    and (c=True) generating the same C source up to identifier names."""
    text = str(module)
    back = parse_module(text)
    assert_structural_equal(module, back)
    assert str(back) == text
    for f in module.funcs:
        assert_structural_equal(f, parse_func(str(f)))
    if c:
        assert _numbered(emit_c(back)) == _numbered(emit_c(module))


def node_kinds(module: S.LoopModule) -> set:
    """The kinds of IR node in `module`: statement and function classes, loop kinds,
    allocation scopes, views, expression ops (and casts with a conversion mode)."""
    out = set()
    for f in module.funcs:
        out.add(type(f).__name__)
        if not isinstance(f, S.PrimFunc):
            continue
        for s in S.walk_stmts(f.body):
            out.add(type(s).__name__)
            if isinstance(s, S.For):
                out.add(f"For:{s.kind}")
            if isinstance(s, S.Allocate):
                out.add(f"Allocate:{s.scope}")
            if isinstance(s, S.Call):
                out.update("View" for a in s.args if isinstance(a, S.View))
            for e in [getattr(s, k, None) for k in ("min", "extent", "cond", "value", "expr")] + \
                    list(getattr(s, "indices", ())):
                if isinstance(e, Expr):
                    out.update(x.op if x.op != "cast" or x.arg is None else "cast:mode" for x in walk(e))
    return out


# What lowering produces (the hand-built IR in test_parse.py covers the rest: Evaluate,
# stack allocations, else branches, reductions, which lowered kernels do not use).
LOWERED_KINDS = {"PrimFunc", "ExternFunc", "Seq", "For", "Store", "Allocate", "IfThenElse", "Let", "Call", "View",
                 *(f"For:{k}" for k in S.LOOP_KINDS), "Allocate:auto", "Allocate:heap",
                 "var", "const", "load", "not", "cast", "cast:mode", "call", "select", "check", *BINARY}

SAMPLE = ["test_sce_mean_no_weight_ii_4d_log_prob_expanded", "test_bernoulli_seed_expanded", "test_mod_int64_fmod",
          "test_pow_types_int32_int32", "test_maxpool_3d_default", "test_castlike_FLOAT_to_FLOAT8E5M2",
          "test_not_2d", "test_bitwise_not_2d", "test_bitwise_or_ui64_bcast_3v1d", "test_bitshift_left_int64",
          "test_greater_equal", "test_div_uint64", "test_gathernd_example_int32_batch_dim1",
          "test_gemm_default_no_bias",
          "test_conv_with_strides_padding", "test_softmax_axis_1", "test_layer_normalization_4d_axis1",
          "test_where_example", "test_erf", "test_lstm_defaults", "test_gru_defaults", "test_einsum_batch_matmul",
          "test_averagepool_2d_pads", "test_argmax_default_axis_example", "test_cumsum_1d",
          "test_scatter_elements_with_axis", "test_instancenorm_example", "test_quantizelinear",
          "test_dequantizelinear", "test_convtranspose"]


def _cases(names=None):
    cases = node_cases()
    return cases if names is None else [c for c in cases if c.name in names]


def test_the_sample_names_real_cases():
    assert sorted(c.name for c in _cases(SAMPLE)) == sorted(SAMPLE)


def test_mlp_kernels_roundtrip_at_every_level():
    for level in (None, 0):
        assert_roundtrips(loop_module(MODELS["mlp"](), level), c=True)


@pytest.mark.slow
@pytest.mark.parametrize("level", [None, 0], ids=["default", "O0"])
@pytest.mark.parametrize("name", sorted(set(MODELS) - {"mlp"}))
def test_benchmark_model_kernels_roundtrip(name, level):
    assert_roundtrips(loop_module(MODELS[name](), level), c=True)


def test_conformance_sample_roundtrips_and_covers_every_lowered_node_kind():
    seen = set()
    for case in _cases(SAMPLE):
        module = loop_module(case.load()[0])
        assert_roundtrips(module, c=True)
        seen |= node_kinds(module)
    assert LOWERED_KINDS <= seen, f"no sample kernel has {sorted(LOWERED_KINDS - seen)}: add a case that does"


@pytest.mark.slow
def test_every_conformance_node_model_that_lowers_roundtrips():
    lowered = 0
    for case in _cases():
        try:
            module = loop_module(case.load()[0])
        except KilnError:          # not lowered natively (the conformance tests say why)
            continue
        assert_roundtrips(module)
        lowered += 1
    assert lowered > 1000


@SETTINGS
@given(st.data(), st.sampled_from([elementwise, reduction, matmul]))
def test_random_schedules_of_random_computes_roundtrip(data, program):
    inputs, _, out, _ = program(data.draw, np.random.default_rng(0))
    s = random_schedule(data.draw, out)
    func = lower(s, list(inputs) + [out], "kernel")
    back = parse_func(str(func))
    assert_structural_equal(func, back)
    assert str(back) == str(func)
