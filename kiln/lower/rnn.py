"""RNN, GRU and LSTM lowerings (cpu target): one C kernel per node, time steps looped inside.
"""

from __future__ import annotations

import math

from kiln.codegen.csource import c_instance
from kiln.lower.context import lowering
from kiln.ops.rnn import _activation_specs, _GATES, _num_dirs


def _lit(v: float, ct: str) -> str:
    """An exact C literal of Python float `v` in compute type `ct` (float or double)."""
    if v != v:
        return f"(({ct})NAN)"
    if v in (float("inf"), float("-inf")):
        return f"(({ct}){'-' if v < 0 else ''}INFINITY)"
    return f"(({ct}){float(v).hex()})"


def _c_act(name: str, a, b, v: str, ct: str) -> str:
    """C for activation `name` of expression `v` (a variable name), as the reference computes it."""
    fn = (lambda f: f + "f") if ct == "float" else (lambda f: f)
    one, zero = f"(({ct})1)", f"(({ct})0)"
    la = _lit(a, ct) if a is not None else None
    lb = _lit(b, ct) if b is not None else None
    return {
        "relu": f"({v} < {zero} ? {zero} : {v})",
        "tanh": f"{fn('tanh')}({v})",
        "sigmoid": f"({one} / ({one} + {fn('exp')}(-{v})))",
        "affine": f"({la} * {v} + {lb})",
        "leakyrelu": f"({v} >= {zero} ? {v} : {la} * {v})",
        "thresholdedrelu": f"({v} > {la} ? {v} : {zero})",
        "scaledtanh": f"({la} * {fn('tanh')}({lb} * {v}))",
        "hardsigmoid": f"kiln_rnn_unit({la} * {v} + {lb})",
        "elu": f"({v} >= {zero} ? {v} : {la} * ({fn('exp')}({v}) - {one}))",
        "softsign": f"({v} / ({one} + {fn('fabs')}({v})))",
        "softplus": f"{fn('log1p')}({fn('exp')}({v}))",
    }[name]


def _rnn_c(src_name: str, src: str, ct: str, jb: int) -> tuple[str, str]:
    """(the functions' name prefix, the C) of kiln/codegen/c_src/rnn.c for rows of C type `src`
    (dtype name `src_name`) computed in `ct` with `jb`-wide vector blocks."""
    base = f"kiln_rnn_{src_name}_{ct}"
    macros = {"KILN_RNN_SRC": src, "KILN_RNN_CT": ct, "KILN_RNN_JB": str(jb), "KILN_RNN_V": f"{base}_v",
              "KILN_RNN_GEMM": f"{base}_gemm", "KILN_RNN_GEMM_BLOCK": f"{base}_gemm_block",
              "KILN_RNN_TRANSPOSE": f"{base}_transpose", "KILN_RNN_TRANSPOSE_ROWS": f"{base}_transpose_rows"}
    return base, c_instance("rnn.c", macros, base.upper())


def _lower_rnn(kind: str):
    def lower(ctx, *args):
        from kiln.dtypes import DType
        xt, wt, rt = ctx.input_types[:3]
        dt = xt.dtype
        if dt.c is None or not dt.is_float:
            ctx.fail(f"{dt} data has no native (C) kernel for {kind}", stage="lower")
        t, ct = dt.c, ("double" if dt is DType.float64 else "float")
        layout = int(ctx.attr("layout", 0))
        steps, batch, inp = xt.shape if not layout else (xt.shape[1], xt.shape[0], xt.shape[2])
        nd, g = _num_dirs(ctx), _GATES[kind]
        hs = int(ctx.attr("hidden_size", rt.shape[-1]))
        gh = g * hs
        names = ["X", "W", "R", "B", "lens", "h0", "c0", "P"][:len(ctx.node.inputs)]
        p, k = {}, 0
        for i, name in enumerate(names):
            if ctx.has_input(i):
                p[name], k = f"in{k}", k + 1
        want = {"W": (nd, gh, inp), "R": (nd, gh, hs), "B": (nd, 2 * gh), "P": (nd, 3 * hs),
                "lens": (batch,), "h0": (batch, nd, hs) if layout else (nd, batch, hs)}
        want["c0"] = want["h0"]
        for i, name in enumerate(names):
            if ctx.has_input(i) and name in want and tuple(ctx.input_types[i].shape) != want[name]:
                ctx.fail(f"{name} must have shape {want[name]}, got {tuple(ctx.input_types[i].shape)}")
        clip = ctx.attr("clip", None)
        specs = _activation_specs(ctx, kind, nd)
        direction = ctx.attr("direction", "forward")
        y_shape = (batch, steps, nd, hs) if layout else (steps, nd, batch, hs)
        h_shape = (batch, nd, hs) if layout else (nd, batch, hs)
        n_out = len(ctx.node.outputs)
        shapes = [y_shape, h_shape, h_shape][:n_out]
        # element offsets: X[t][b][k], Y[t][d][b][j], H[d][b][j]
        X = (lambda t_, b_: f"(({t_}) * {batch} + ({b_})) * {inp}") if not layout else \
            (lambda t_, b_: f"(({b_}) * {steps} + ({t_})) * {inp}")
        Y = (lambda t_, d_, b_: f"((({t_}) * {nd} + ({d_})) * {batch} + ({b_})) * {hs}") if not layout else \
            (lambda t_, d_, b_: f"((({b_}) * {steps} + ({t_})) * {nd} + ({d_})) * {hs}")
        H = (lambda d_, b_: f"(({d_}) * {batch} + ({b_})) * {hs}") if not layout else \
            (lambda d_, b_: f"(({b_}) * {nd} + ({d_})) * {hs}")
        pre = (lambda v: v) if clip is None else \
            (lambda v: f"kiln_rnn_clip({v}, {_lit(float(clip), ct)})")

        jb = 16 if ct == "float" else 8  # outputs per vector block (64 bytes)
        scratch = {"RNN": hs, "GRU": 8 * hs, "LSTM": 4 * hs}[kind]
        lens = (f"(int64_t){p['lens']}[b]" if "lens" in p else str(steps))
        big = lambda work: work >= 1 << 16  # noqa: E731 - enough multiply-adds to share out

        # the products and transposes: kiln/codegen/c_src/rnn.c, instantiated for rows of the
        # input type (X, W, R) and of the compute type (the state, the scratch)
        fx, preamble = _rnn_c(dt.name, t, ct, jb)
        fc, more = (fx, "") if t == ct else _rnn_c(ct, ct, ct, jb)
        preamble += more

        def gemm(dst, dst_stride, src, rows, n_rows, mat, col0, ncols, depth):
            """dst[r][j] = sum_q row(r)[q] * mat[q][col0 + j] for r < n_rows, j < ncols (mat: the
            transposed weights, `gh` wide); src = (its C type, pointer), rows = (div, hi, lo,
            stride): row(r) = pointer + (r / div * hi + r % div * lo) * stride."""
            fn = fc if src[0] == ct else fx
            div, hi, lo, stride = rows
            par = int(big(n_rows * ncols * depth))
            return (f"{fn}_gemm({dst}, {dst_stride}, {src[1]}, {div}, {hi}, {lo}, {stride}, {n_rows}, {mat}, "
                    f"{gh}, {col0}, {ncols}, {depth}, {par});")

        def transpose(dst, src, depth):
            """dst[q][j] = src[d][j][q] (j < gh, q < depth), in 16 x 16 tiles."""
            return f"{fx}_transpose({dst}, {src}, d, {gh}, {depth}, {int(big(gh * depth) and gh > 16)});"

        def step_mv(dst_off, vec_off, col0, ncols):
            """This step's recurrent product for every batch row: scratch[b][dst_off + j] =
            sum_q v_b[q] * R[d][col0 + j][q], v_b = h_b (vec_off None) or scratch[b][vec_off:]."""
            src = (ct, "hall") if vec_off is None else (ct, f"(scall + {vec_off})")
            rows = (1, 1, 0, hs) if vec_off is None else (1, 1, 0, scratch)
            return gemm(f"(scall + {dst_off})", scratch, src, rows, batch, "Rt", col0, ncols, hs)

        def bias(which, j):  # wb (which=0) or rb (1) element j of direction d
            return f"(({ct}){p['B']}[d * {2 * gh} + {which * gh} + {j}])" if "B" in p else f"(({ct})0)"

        def peep(which, j):
            return f"(({ct}){p['P']}[d * {3 * hs} + {which * hs} + {j}])" if "P" in p else f"(({ct})0)"

        def act(slot, v):  # per-direction activation, selected by d at run time
            alts = [_c_act(*specs[d][slot], v, ct) for d in range(nd)]
            return alts[0] if nd == 1 or alts[0] == alts[1] else f"(d == 0 ? {alts[0]} : {alts[1]})"

        def rows(lines):
            """An elementwise phase over the batch rows live at this step: xw = the row's x @ W^T,
            h / c its state, sc its scratch (the recurrent products land there)."""
            par = "#pragma omp parallel for schedule(static)" if big(batch * hs * 8) and batch > 1 else ""
            return "\n".join([par,
                              f"for (int64_t b = 0; b < {batch}; ++b) {{",
                              f"  const int64_t len = {lens};",
                              "  if (!(s < len)) continue;",
                              "  const int64_t ti = rev ? len - 1 - s : s;",
                              f"  const {ct}* xw = xwall + (ti * {batch} + b) * {gh};",
                              f"  {ct} *h = hall + b * {hs}, *c = call + b * {hs}, *sc = scall + b * {scratch};",
                              "  (void)xw; (void)c; (void)ti;",
                              *("  " + line for line in lines),
                              "}"])

        # one time step, phase by phase; each cell follows the reference's order of operations
        if kind == "RNN":
            cell = [step_mv(0, None, 0, hs), rows([
                f"for (int64_t j = 0; j < {hs}; ++j) {{",
                f"  {ct} v = xw[j] + sc[j]; v = v + {bias(0, 'j')}; v = v + {bias(1, 'j')};",
                f"  v = {pre('v')}; h[j] = {act(0, 'v')};",
                "}"])]
        elif kind == "GRU":  # scratch: hr [3H] | r [H] | r*h [H] | x@W^T + wb [3H]
            lbr = bool(ctx.attr("linear_before_reset", 0))
            ptrs = f"{ct} *hr = sc, *rr_ = sc + {3 * hs}, *m = sc + {4 * hs}, *xb = sc + {5 * hs}; (void)m;"
            cell = [step_mv(0, None, 0, 3 * hs if lbr else 2 * hs), rows([
                ptrs,
                f"for (int64_t j = 0; j < {3 * hs}; ++j) xb[j] = xw[j] + {bias(0, 'j')};",
                f"for (int64_t j = 0; j < {hs}; ++j) {{",
                f"  {ct} v = xb[{hs} + j] + hr[{hs} + j]; v = v + {bias(1, f'{hs} + j')};",
                f"  v = {pre('v')}; rr_[j] = {act(0, 'v')};",
                "}",
                *([] if lbr else [f"for (int64_t j = 0; j < {hs}; ++j) m[j] = rr_[j] * h[j];"])])]
            if lbr:
                hh = f"xb[{2 * hs} + j] + rr_[j] * (hr[{2 * hs} + j] + {bias(1, f'{2 * hs} + j')})"
            else:
                cell.append(step_mv(2 * hs, 4 * hs, 2 * hs, hs))
                hh = f"(xb[{2 * hs} + j] + hr[{2 * hs} + j]) + {bias(1, f'{2 * hs} + j')}"
            cell.append(rows([
                ptrs,
                f"for (int64_t j = 0; j < {hs}; ++j) {{",
                f"  {ct} v = {hh};",
                f"  v = {pre('v')}; const {ct} hh = {act(1, 'v')};",
                f"  v = xb[j] + hr[j]; v = v + {bias(1, 'j')};",
                f"  v = {pre('v')}; const {ct} z = {act(0, 'v')};",
                f"  h[j] = ((({ct})1) - z) * hh + z * h[j];",
                "}"]))
        else:  # LSTM: gates i, o, f, c; peepholes i, o, f
            forget = bool(ctx.attr("input_forget", 0))
            cell = [step_mv(0, None, 0, 4 * hs), rows([
                f"for (int64_t j = 0; j < {4 * hs}; ++j) {{",
                f"  {ct} v = xw[j] + sc[j]; v = v + {bias(0, 'j')}; sc[j] = v + {bias(1, 'j')};",
                "}",
                f"for (int64_t j = 0; j < {hs}; ++j) {{",
                f"  {ct} v = sc[j] + {peep(0, 'j')} * c[j]; v = {pre('v')}; {ct} gi = {act(0, 'v')};",
                f"  {ct} gf;",
                (f"  gf = (({ct})1) - gi;" if forget else
                 f"  v = sc[{2 * hs} + j] + {peep(2, 'j')} * c[j]; v = {pre('v')}; gf = {act(0, 'v')};"),
                f"  v = sc[{3 * hs} + j]; v = {pre('v')}; {ct} gc = {act(1, 'v')};",
                f"  c[j] = gf * c[j] + gi * gc;",
                f"  v = sc[{hs} + j] + {peep(1, 'j')} * c[j]; v = {pre('v')}; {ct} go = {act(0, 'v')};",
                f"  {ct} cj = c[j];",
                f"  h[j] = go * {act(2, 'cj')};",
                "}"])]
        cell.append(rows([f"for (int64_t j = 0; j < {hs}; ++j) out0[{Y('ti', 'd', 'b')} + j] = ({t})h[j];"]))
        h0 = f"({ct}){p['h0']}[{H('d', 'b')} + j]" if "h0" in p else "0"
        c0 = f"({ct}){p['c0']}[{H('d', 'b')} + j]" if "c0" in p else "0"
        n_x = steps * batch
        sizes = {"Wt": inp * gh, "Rt": hs * gh, "xwall": n_x * gh, "hall": batch * hs, "call": batch * hs,
                 "scall": batch * scratch}
        offsets, total = {}, 0
        for name, n in sizes.items():
            offsets[name], total = total, total + n
        # x @ W^T for every (step, batch row) up front: row r = step * batch + b
        x_rows = (1, 1, 0, inp) if not layout else (batch, 1, steps, inp)
        body = [
            f"#define kiln_rnn_clip(v, m) ((v) < -(m) ? -(m) : (v) > (m) ? (m) : (v))",
            f"#define kiln_rnn_unit(v) ((v) < ({ct})0 ? ({ct})0 : (v) > ({ct})1 ? ({ct})1 : (v))",
            f"  {ct}* state = ({ct}*)malloc(sizeof({ct}) * ({total} + 1));",
            "  if (!state) return -1;",
            "  " + " ".join(f"{ct}* {name} = state + {off};" for name, off in offsets.items()),
            f"  memset(out0, 0, sizeof({t}) * {math.prod(y_shape)});",
            "  int rc = 0;",
            f"  for (int64_t b = 0; b < {batch}; ++b) {{",
            f"    if ({int(direction != 'forward')} && {lens} > {steps}) rc = 1;",
            "  }",
            f"  for (int64_t d = 0; d < {nd} && !rc; ++d) {{",
            f"    const int rev = {'d == 1' if direction == 'bidirectional' else int(direction == 'reverse')};",
            "    " + transpose("Wt", p["W"], inp),
            "    " + transpose("Rt", p["R"], hs),
            "    " + gemm("xwall", gh, (t, p["X"]), x_rows, n_x, "Wt", 0, gh, inp),
            f"    for (int64_t b = 0; b < {batch}; ++b)",
            f"      for (int64_t j = 0; j < {hs}; ++j) {{",
            f"        hall[b * {hs} + j] = {h0};",
            f"        call[b * {hs} + j] = {c0};",
            "      }",
            f"    for (int64_t s = 0; s < {steps}; ++s) {{",
            *("      " + line for block in cell for line in block.split("\n")),
            "    }",
            f"    for (int64_t b = 0; b < {batch}; ++b) {{",
            f"      const int live = {lens} > 0;",
            f"      for (int64_t j = 0; j < {hs}; ++j) {{",
            *([f"        out1[{H('d', 'b')} + j] = ({t})(live ? hall[b * {hs} + j] : 0);"] if n_out > 1 else []),
            *([f"        out2[{H('d', 'b')} + j] = ({t})(live ? call[b * {hs} + j] : 0);"] if n_out > 2 else []),
            "      }",
            "    }",
            "  }",
            "  free(state);",
            "  return rc;",
            "#undef kiln_rnn_clip",
            "#undef kiln_rnn_unit",
        ]
        return ctx.extern("\n".join(body), list(args), [(s, dt) for s in shapes], preamble=preamble,
                          errors={1: f"a sequence_lens value exceeds the sequence length {steps}"})
    return lower


for _kind in _GATES:
    lowering(_kind)(_lower_rnn(_kind))
