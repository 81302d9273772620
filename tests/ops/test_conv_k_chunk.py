"""A dense blocked conv's reduction in chunks (kiln.lower.nchwc.NCHWC_K_CHUNK): every output row of a
channel group sums one chunk of input blocks (a register tile, kiln.loops rfactor) into the group's
sums before the next chunk, hinting the next chunk's weights. Same results as whole rows; the rule
picks it for 7x7 planes whose weights stream, not for larger planes, few groups or one chunk."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.errors import KilnError
from kiln.interpreter import Interpreter
from kiln.lower.nchwc import k_chunk
from kiln.ops.layout import BlockedGeom
from kiln.passes.layout import transform
from kiln.targets.target import Target
from tests.ops.test_layout_lower import CASES, conv_case
from tests.passes.util import random_inputs

CHUNKED = {
    **{k: CASES[k] for k in ("1x1", "3x3_pad_relu", "3x3_stride2_residual", "3x3_dilated_clip",
                            "channels_not_multiple", "5x5_valid")},
    "3x3_64_relu": dict(n=1, c=64, h=7, oc=32, k=3, p=1, epilogue="relu"),       # 8 blocks of 8: 4 chunks of 2
    "1x1_64_residual": dict(n=2, c=64, h=5, oc=24, k=1, epilogue="residual"),
    "3x3_40_stride2": dict(n=1, c=40, h=9, oc=16, k=3, s=2, p=1),                 # 5 blocks, the last part-used
}


def blocked(case: str):
    g = conv_case(**CHUNKED[case])
    b = g.clone()
    transform(b, 8, selective=False, override="direct")
    return g, b


@pytest.mark.parametrize("kc", [1, 2])
@pytest.mark.parametrize("case", list(CHUNKED))
def test_chunked_reduction_matches_reference(case, kc):
    g, b = blocked(case)
    icbg = -(-CHUNKED[case]["c"] // 8)
    if icbg % kc:
        kc = 1
    xs = random_inputs(g, 1)
    got = kiln.compile(b, target="cpu", opt_level=0, decisions={"nchwc.order": "channels", "nchwc.prefetch": 1,
                                                               "nchwc.k_chunk": kc}).run({"x": xs[0]})["y"]
    np.testing.assert_allclose(got, Interpreter(g).run(xs)[0], rtol=1e-4, atol=1e-4)


def test_a_chunk_that_does_not_divide_the_blocks_is_refused():
    _, b = blocked("3x3_40_stride2")       # 5 input blocks
    with pytest.raises(KilnError, match="nchwc.k_chunk.*divide the 5 input blocks"):
        kiln.compile(b, target="cpu", opt_level=0, decisions={"nchwc.order": "channels", "nchwc.prefetch": 1,
                                                             "nchwc.k_chunk": 2})


def geom(c, h, oc, k=1, s=1, n=1, groups=1):
    p = k // 2
    o = (h + 2 * p - k) // s + 1
    return BlockedGeom(n, c // 16, h, h, 16, oc // 16, c // 16 // groups, [k, k], 16, [s, s], [1, 1], [p, p],
                       [o, o], False, groups)


def test_chunk_rule():
    """ResNet-50's stage-4 convs on 2 cores: the 3x3 512 -> 512 of 7x7 in chunks of one block (36
    KiB of weights for the tile's 4 output blocks), 2048 -> 512 in chunks of 8 (32 KiB); not a
    14x14 plane (the group's sums past the stack), 4 groups on 2 cores, a conv of one chunk, a
    grouped conv, a group's weights under an eighth of L2, a batch of 4. On one core the groups need not be many."""
    two, one = (Target.named("x86-64-v4", cores=c, l1d_bytes=48 << 10, l2_bytes=2 << 20) for c in (2, 1))
    assert k_chunk(geom(512, 7, 512, k=3), 4, 7, 4, 4, two) == 1
    assert k_chunk(geom(512, 14, 512, k=3, s=2), 4, 7, 4, 4, two) == 1
    assert k_chunk(geom(2048, 7, 512), 4, 7, 4, 4, two) == 8
    assert k_chunk(geom(2048, 7, 512, n=4), 4, 7, 4, 4, two) == 0      # a batch: not measured to pay
    assert k_chunk(geom(1024, 14, 512), 4, 14, 4, 4, two) == 0
    assert k_chunk(geom(2048, 7, 256), 4, 7, 4, 4, two) == 0
    assert k_chunk(geom(2048, 7, 256), 4, 7, 4, 4, one) == 8
    assert k_chunk(geom(128, 7, 512), 4, 7, 4, 4, two) == 0
    assert k_chunk(geom(1024, 7, 1024, k=3, groups=32), 4, 7, 4, 4, two) == 0
    assert k_chunk(geom(960, 1, 256), 4, 1, 4, 4, one) == 0        # 240 KiB a group: under an eighth of L2
    assert k_chunk(geom(1024, 1, 256), 4, 1, 4, 4, one) == 8


def test_chunked_kernel():
    """The kernel: a register tile's sums of one chunk (acc.rf) added into the group's (acc), the
    parallel loop over the groups, and one hint of the next chunk's weights per input lane into L2;
    whole rows (no acc.rf) with nchwc.k_chunk=0."""
    from kiln.compiler import run_stages
    g = conv_case(n=1, c=512, h=7, oc=512, k=3, p=1)
    b = g.clone()
    transform(b, 16, selective=False, override="direct")
    two = Target.named("x86-64-v4", cores=2, l1d_bytes=48 << 10, l2_bytes=2 << 20)
    src = run_stages(b, "c", cpu=two).source.text
    assert "acc_rf[" in src and "kiln_pool_for(" in src and src.count(", 0, 2);") == 1
    off = run_stages(b, "c", cpu=two, decisions={"nchwc.k_chunk": 0}).source.text
    assert "acc_rf[" not in off and ", 0, 2);" not in off
