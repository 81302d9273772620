"""The GEMM micro-kernel's register tile (kiln.lower.gemm.choose_tile / weight_panel_width)
on 16-register (AVX2) and 32-register (AVX-512) machines: mr accumulator rows of nvec
vectors, plus nvec B vectors and one broadcast, must fit the register file (one more and
the C compiler spills an accumulator: a load and a store in every k step)."""

import numpy as np
import pytest
from onnx import helper

import kiln.lower.gemm as g
from kiln.dtypes import DType
from kiln.targets.target import Target
from tests.ops.test_packed_lower import _check, _model

AVX2 = Target.named("x86-64-v3")
AVX512 = Target.named("x86-64-v4")


@pytest.mark.parametrize("target,rows,mr", [(AVX512, 32, 8), (AVX512, 64, 8), (AVX512, 128, 8), (AVX512, 24, 6),
                                            (AVX512, 197, 6), (AVX512, 256, 6), (AVX512, 750, 6), (AVX2, 32, 6)])
def test_spilled_tiles(target, rows, mr):
    """Four-vector tiles on 32 registers take 8 rows (some accumulators spilled, SPILL_COST per
    row) where that pads fewer rows than 6: M = 32 is 4 blocks of 8, not 6 of 6 (36 rows); where
    6 pads little (197, 256, 750 rows) the tile stays 6; a symbolic row count's hint never spills,
    nor do 16 registers (two-vector tiles)."""
    nvec = 4 if target is AVX512 else 2
    assert g.choose_tile(rows, 4096, DType.float32, target, nvec=nvec)[0] == mr
    assert g.choose_tile(rows, 4096, DType.float32, target, nvec=nvec, exact_rows=False)[0] <= 6


@pytest.mark.parametrize("target,lanes", [(AVX2, 8), (AVX512, 16)])
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 13, 64, 128, 130])
@pytest.mark.parametrize("nvec", [1, 2, 3, 4])
def test_tile_fits_registers(target, lanes, rows, nvec):
    mr, nr = g.choose_tile(rows, 4096, DType.float32, target, nvec=nvec)
    assert nr == lanes * nvec
    # four-vector tiles on 32 registers may spill up to ONE_BLOCK_SPILL rows (test_spilled_tiles)
    spill = nvec >= 4 and target.vector_registers >= 32
    base = (target.vector_registers - nvec - 1) // nvec
    assert mr * nvec + nvec + 1 <= target.vector_registers or spill and mr <= base + g.ONE_BLOCK_SPILL, \
        (mr, nr)


@pytest.mark.parametrize("target,rows,mr", [(AVX512, 6, 6), (AVX512, 7, 7), (AVX512, 8, 8), (AVX512, 9, 5),
                                            (AVX2, 7, 5), (AVX2, 8, 5)])
def test_one_block_spill(target, rows, mr):
    """A few rows past what 32 registers hold in 4-vector tiles (7 or 8 rows: a Linear at batch 8)
    stay one row block, some accumulators spilled, rather than two blocks streaming B twice; a
    row more and it is two blocks again; 16 registers never spill (their tile is 2 vectors)."""
    nvec = 4 if target is AVX512 else 2
    assert g.choose_tile(rows, 4096, DType.float32, target, nvec=nvec)[0] == mr
    if rows > 6:   # a symbolic row count's hint: any other count may come, so no spilled tile
        assert g.choose_tile(rows, 4096, DType.float32, target, nvec=nvec, exact_rows=False)[0] == 5


@pytest.mark.parametrize("target,nvec", [(AVX2, 2), (AVX512, 4)])
@pytest.mark.parametrize("k", [512, 2048])
def test_weight_panel_width(target, nvec, k):
    """Four-vector panels where 32 registers hold a 6-row tile of them; two with 16 (where
    four would leave room for 2 rows), whether or not the rows alias in L1."""
    lanes = 16 if "avx512f" in target.features else 8
    assert g.weight_panel_width(4096, k, DType.float32, target) == lanes * nvec
    mr, _ = g.choose_tile(750, 4096, DType.float32, target, nvec=nvec)
    assert mr == 6


@pytest.mark.parametrize("x_shape,n", [((7, 2048), 130), ((2, 13, 512), 200), ((1, 1, 96), 65),
                                       ((8, 784), 256), ((2, 8, 33), 70)])
def test_packed_odd_shapes(x_shape, n):
    """Row counts that are not multiples of the tile, edge panels, K whose rows alias in L1,
    a bias epilogue: against NumPy and the interpreter."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((x_shape[-1], n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal(x_shape).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])],
               x_shape, {"w": w, "b": b})
    _check(m, x, x @ w + b, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("target,mr", [(AVX2, 2), (AVX512, 7)])
def test_spill_one(target, mr):
    """spill_one (rows aliasing in L1) allows one spilled accumulator of a 4-vector tile on
    32 registers (7 x 4), never on 16."""
    got, _ = g.choose_tile(256, 4096, DType.float32, target, nvec=4, spill_one=True)
    assert got == mr
    assert got * 4 + 4 + 1 <= target.vector_registers + 1


# -- when the GEMM forks: its serial time (from the target's vector width) against the fork
# and join (Target.fork_us: a wake-up when OpenMP's team sleeps between kernels, KILN_THREADS_IMPL=omp)
SPIN = Target.named("x86-64-v4", omp_spincount="10000", threads_impl="omp")
SLEEP = Target.named("x86-64-v4", omp_wait_policy="PASSIVE", omp_spincount="", threads_impl="omp")


def _forks(m, k, n, target, batch=(), overrides=None):
    from kiln.loops import Schedule, lower, placeholder
    from kiln.lower.decisions import choosing
    with choosing("gemm", overrides or {}, target):
        a = placeholder((*batch, m, k), DType.float32, "a")
        b = placeholder((k, n), DType.float32, "b")
        gm = g.gemm(a, b, target=target)
        sch = Schedule(gm.out)
        gm.schedule(sch)
        return "parallel for" in str(lower(sch, [a, b, gm.out], "gemm"))


def test_a_gemm_forks_when_its_serial_time_pays_for_it():
    assert SPIN.fork_us < SLEEP.fork_us
    assert not _forks(64, 32, 64, SPIN)          # 131K multiply-adds: ~2 us serial
    assert _forks(32, 256, 768, SPIN)            # 6.3M: ~100 us
    assert not _forks(16, 128, 256, SLEEP)       # 524K: ~9 us, less than waking a thread twice
    assert _forks(16, 128, 256, SPIN)
    assert _forks(256, 768, 768, SLEEP)
    assert not _forks(64, 32, 64, SPIN, overrides={"parallel_min_work": 0})   # the floor alone: the model still says no
    assert _forks(64, 32, 64, SPIN, overrides={"parallel_min_work": 0, "fork_gain": 0})   # a tuner forces a fork
    assert not _forks(256, 768, 768, SPIN, overrides={"parallel_min_work": 1 << 40})


@pytest.mark.parametrize("x_shape,n", [((4, 32, 256), 300), ((3, 5, 40), 70), ((8, 2, 16, 96), 130)])
def test_batched_activations_against_one_weight(x_shape, n):
    """A weight shared by the whole batch (the panel loop outside the batch), with a bias and
    a residual broadcast over the batch fused as the epilogue: against NumPy and the interpreter."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((x_shape[-1], n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    r = rng.standard_normal(x_shape[-2:-1] + (n,)).astype(np.float32)
    x = rng.standard_normal(x_shape).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
                helper.make_node("Add", ["u", "r"], ["y"])], x_shape, {"w": w, "b": b, "r": r})
    _check(m, x, x @ w + b + r, rtol=1e-4, atol=2e-4)


L2_2M = Target.named("x86-64-v4", l2_bytes=2 << 20)


@pytest.mark.parametrize("m,k,n,mr,nr,outside", [
    (784, 1536, 384, 6, 64, False),    # V 2.4 MB past half of L2: swept per S block (309 MB) -> panels outside
    (3136, 768, 192, 6, 64, True),     # V 590 KB stays in L2: the larger S outside, read once
    (196, 1536, 384, 6, 64, False),    # S the smaller: panels outside, as before
    (4096, 768, 3072, 6, 64, False),   # a transformer FFN at 4096 rows: V 9.4 MB would stream 683 times
    (12544, 96, 384, 6, 64, True),     # both fit or S streams once either way: the larger S outside
])
def test_loop_order_streams_the_fewest_bytes(m, k, n, mr, nr, outside):
    """S blocks outside the V panels unless V does not stay in L2 and reading S once per panel
    streams fewer bytes than reading V once per S block."""
    assert g.s_blocks_outside(m * k, k * n, -(-m // mr), -(-n // nr), 4, L2_2M) is outside
    if not outside:   # with an L2 that holds V, the rule falls back to the larger operand outside
        big = Target.named("x86-64-v4", l2_bytes=64 << 20)
        assert g.s_blocks_outside(m * k, k * n, -(-m // mr), -(-n // nr), 4, big) is (m > n)


def test_compiled_loop_order_follows_the_target_l2():
    """The packed MatMul's kernel records the order the rule picks for the target's L2, and
    computes the same product either way (784 x 1536 @ 1536 x 384, a ConvNeXt stage-3
    projection at batch 4)."""
    from kiln.compiler import run_stages
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((1536, 384)) * 0.05).astype(np.float32)
    x = rng.standard_normal((784, 1536)).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], x.shape, {"w": w})
    for l2, outside in ((2 << 20, False), (64 << 20, True)):
        st = run_stages(m, "loops", cpu=Target.named("x86-64-v4", l2_bytes=l2))
        (kernel,) = [kn for kn in st.lowered.kernels if "MatMulPacked" in kn.func.name]
        assert kernel.decisions["gemm.s_outer"] is outside, (l2, kernel.decisions)
    _check(m, x, x @ w, rtol=1e-3, atol=1e-3)
