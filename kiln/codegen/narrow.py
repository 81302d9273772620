"""C conversion helpers for the storage-only dtypes: bfloat16, the float8 family, float4e2m1
and the sub-byte integers (int4/uint4/int2/uint2).

C has no types for these, so the C backend keeps them in memory as what NumPy/ml_dtypes
stores (one element per byte, bfloat16 in two) and computes on them in float32 (the
integers in int32). Each format has four helpers, emitted into a module only when used:

    kiln_<f>_to_<c>(storage)  -> compute      load: exact
    kiln_<c>_to_<f>(compute)  -> storage      store: rounds as ml_dtypes' astype does
    kiln_round_<f>(compute)   -> compute      the value `store` then `load` gives
    (float formats) kiln_f32_to_<f>_sat       Cast's saturate=1: overflow and +-Inf to +-max

(<f> is the format's tag, <c> f32 or i32). float8e8m0 also has Cast-25's rounding modes
(`kiln_f32_to_f8e8m0_<up|down|nearest>[_sat]`). The semantics are those of the reference
(ml_dtypes and kiln.ops.elementwise's Cast): round to nearest even; the fn formats have no
Inf (overflow gives NaN), the fnuz ones no negative zero and one NaN (0x80); float4e2m1 has
neither NaN nor Inf and saturates; integers from floats truncate, take 0 outside the int32
range, then wrap. tests/codegen/test_narrow_dtypes.py checks every 8-bit pattern and many
float32 values against ml_dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FloatFormat:
    """A small binary float: `ebits` exponent bits, `mbits` mantissa bits, `bias`."""
    tag: str
    ebits: int
    mbits: int
    bias: int
    max_code: int      # the largest finite magnitude code
    inf: bool          # all-ones exponent with zero mantissa is Inf (IEEE-like, e5m2)
    nan_code: int      # the (positive) NaN ml_dtypes produces; fnuz: 0x80 (it has no sign)
    fnuz: bool = False  # no negative zero; NaN is 0x80 only

    @property
    def sign_bit(self) -> int:
        return 1 << (self.ebits + self.mbits)


FLOATS = {
    "f8e4m3fn": FloatFormat("f8e4m3fn", 4, 3, 7, 0x7E, False, 0x7F),
    "f8e4m3fnuz": FloatFormat("f8e4m3fnuz", 4, 3, 8, 0x7F, False, 0x80, fnuz=True),
    "f8e5m2": FloatFormat("f8e5m2", 5, 2, 15, 0x7B, True, 0x7E),
    "f8e5m2fnuz": FloatFormat("f8e5m2fnuz", 5, 2, 16, 0x7F, False, 0x80, fnuz=True),
    "f4e2m1": FloatFormat("f4e2m1", 2, 1, 1, 0x7, False, 0),  # no NaN: see _encode
}

# sub-byte integers: tag -> (bits, signed)
INTS = {"i4": (4, True), "u4": (4, False), "i2": (2, True), "u2": (2, False)}

E8M0_MODES = ("up", "down", "nearest")

_BITS = ("static inline uint32_t kiln_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }\n"
         "static inline float kiln_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }")

# float (or double) -> int32 as ml_dtypes converts to its sub-byte integers: truncation,
# and 0 for NaN and values outside the int32 range
_FTOI = ("static inline int32_t kiln_ftoi_ml(double x) {\n"
         "  return (x >= -2147483648.0 && x <= 2147483647.0) ? (int32_t)x : 0;\n}")


def _decode(f: FloatFormat) -> str:
    """storage -> float: normals are float32 normals (rebias the exponent), subnormals are
    m * 2^(1 - bias - mbits), exactly."""
    e_mask, m_mask = (1 << f.ebits) - 1, (1 << f.mbits) - 1
    sub_scale = float(2.0 ** (1 - f.bias - f.mbits)).hex() + "f"
    width_mask = (1 << (f.ebits + f.mbits + 1)) - 1
    if f.fnuz:
        special = "  if (b == 0x80) return NAN;\n"
    elif f.inf:
        special = (f"  if (e == {e_mask}) return m ? (s ? -NAN : NAN) : (s ? -INFINITY : INFINITY);\n")
    elif f.tag == "f4e2m1":
        special = ""
    else:  # fn: only S.1111.111 is NaN
        special = f"  if ((b & 0x7F) == 0x7F) return s ? -NAN : NAN;\n"
    return (f"static inline float kiln_{f.tag}_to_f32(uint8_t b) {{\n"
            f"  b &= 0x{width_mask:X};\n"
            f"  uint32_t s = b >> {f.ebits + f.mbits}, e = (b >> {f.mbits}) & {e_mask}, m = b & {m_mask};\n"
            + special +
            f"  float mag = e ? kiln_bits_f32(((e + {127 - f.bias}) << 23) | (m << {23 - f.mbits}))"
            f" : (float)m * {sub_scale};\n"
            f"  return s ? -mag : mag;\n}}")


def _encode(f: FloatFormat, saturate: bool) -> str:
    """float -> storage, round to nearest even on the float32 bits; the magnitude code r is
    compared with the format's largest finite code to catch overflow."""
    name = f"kiln_f32_to_{f.tag}" + ("_sat" if saturate else "")
    shift = 23 - f.mbits
    min_normal_exp = 127 + 1 - f.bias  # float32 biased exponent of the format's min normal
    sb = f.ebits + f.mbits
    sign = "(s << %d)" % sb
    if f.tag == "f4e2m1":
        # ml_dtypes: NaN becomes a zero of the opposite sign; overflow and Inf saturate
        nan, over = f"((s ^ 1) << {sb})", f"({sign} | 0x{f.max_code:X})"
    elif f.fnuz:
        nan = "0x80"
        over = f"({sign} | 0x{f.max_code:X})" if saturate else "0x80"
    else:
        nan = f"({sign} | 0x{f.nan_code:X})"
        over = f"({sign} | 0x{f.max_code:X})" if saturate else \
            f"({sign} | 0x{(f.max_code + 1) if f.inf else f.nan_code:X})"
    zero = "0" if f.fnuz else sign
    return (f"static inline uint8_t {name}(float x) {{\n"
            f"  uint32_t u = kiln_f32_bits(x), s = u >> 31, a = u & 0x7FFFFFFFu, r;\n"
            f"  if (a > 0x7F800000u) return {nan};\n"
            f"  if (a == 0x7F800000u) return {over};\n"
            f"  if ((a >> 23) >= {min_normal_exp}) {{\n"
            f"    r = ((a + 0x{(1 << (shift - 1)) - 1:X}u + ((a >> {shift}) & 1u)) >> {shift})"
            f" - ({127 - f.bias}u << {f.mbits});\n"
            f"  }} else {{  /* the format's subnormals: shift the full significand, round half to even */\n"
            f"    uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | (e ? 0x800000u : 0u);\n"
            f"    uint32_t sh = {min_normal_exp} - (e ? e : 1) + {shift};\n"
            f"    if (sh > 25) r = 0;\n"
            f"    else {{ uint32_t q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1);\n"
            f"      r = q + (rem > half || (rem == half && (q & 1u))); }}\n"
            f"  }}\n"
            f"  if (r > 0x{f.max_code:X}) return {over};\n"
            f"  return r ? ({sign} | r) : {zero};\n}}")


def _e8m0(mode: str | None, saturate: bool) -> str:
    """float -> float8e8m0 (a bare biased exponent, 0xFF = NaN). mode None: ml_dtypes' astype
    (round half up on the exponent, non-positive values and zero are NaN); otherwise Cast-25's
    rounding modes on the float32 exponent field, sign ignored, as the reference `_to_e8m0`."""
    if mode is None:
        return ("static inline uint8_t kiln_f32_to_f8e8m0(float x) {\n"
                "  uint32_t u = kiln_f32_bits(x), e = (u >> 23) & 0xFFu, m = u & 0x7FFFFFu;\n"
                "  if ((u >> 31) || u == 0 || e == 0xFFu) return 0xFF;\n"
                "  e += e ? (m >= 0x400000u) : (m > 0x400000u);\n"
                "  return e > 0xFEu ? 0xFF : (uint8_t)e;\n}")
    step = {"up": "e += (m > 0u);",
            "down": "",
            "nearest": "e += ((m >> 22) & 1u) && ((m & 0x3FFFFFu) || e);"}[mode]
    sat = "  if (e > 0xFEu) e = 0xFEu;\n" if saturate else ""
    return (f"static inline uint8_t kiln_f32_to_f8e8m0_{mode}{'_sat' if saturate else ''}(float x) {{\n"
            f"  uint32_t u = kiln_f32_bits(x), e = (u >> 23) & 0xFFu, m = u & 0x7FFFFFu;\n"
            f"  if (e == 0xFFu) return 0xFF;\n"
            f"  {step}\n{sat}"
            f"  return e > 0xFEu ? 0xFF : (uint8_t)e;\n}}")


_E8M0_LOAD = ("static inline float kiln_f8e8m0_to_f32(uint8_t b) {\n"
              "  return b == 0xFF ? NAN : kiln_bits_f32(b ? (uint32_t)b << 23 : 0x400000u);\n}")

_BF16 = {
    "kiln_bf16_to_f32": "static inline float kiln_bf16_to_f32(uint16_t b) { return kiln_bits_f32((uint32_t)b << 16); }",
    # NaN: the quiet NaN with its sign (as ml_dtypes); others round to nearest even (overflow gives Inf)
    "kiln_f32_to_bf16": ("static inline uint16_t kiln_f32_to_bf16(float x) {\n"
                         "  uint32_t u = kiln_f32_bits(x);\n"
                         "  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7FC0u);\n"
                         "  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);\n}"),
}


def _int_helpers(tag: str) -> dict[str, str]:
    bits, signed = INTS[tag]
    mask, half = (1 << bits) - 1, 1 << (bits - 1)
    val = f"(((v & {mask}) ^ {half}) - {half})" if signed else f"(v & {mask})"
    return {
        f"kiln_{tag}_to_i32": f"static inline int32_t kiln_{tag}_to_i32(uint8_t b) {{ int32_t v = b; return {val}; }}",
        f"kiln_i32_to_{tag}": f"static inline uint8_t kiln_i32_to_{tag}(int32_t v) {{ return (uint8_t)(v & {mask}); }}",
        f"kiln_round_{tag}": f"static inline int32_t kiln_round_{tag}(int32_t v) {{ return {val}; }}",
    }


def _catalog() -> dict[str, tuple[tuple[str, ...], str]]:
    """helper name -> (helpers it calls, C definition)."""
    out: dict = {"kiln_f32_bits": ((), _BITS), "kiln_ftoi_ml": ((), _FTOI)}
    for name, src in _BF16.items():
        out[name] = (("kiln_f32_bits",), src)
    for f in FLOATS.values():
        out[f"kiln_{f.tag}_to_f32"] = (("kiln_f32_bits",), _decode(f))
        for sat in (False, True):
            out[f"kiln_f32_to_{f.tag}" + ("_sat" if sat else "")] = (("kiln_f32_bits",), _encode(f, sat))
    out["kiln_f8e8m0_to_f32"] = (("kiln_f32_bits",), _E8M0_LOAD)
    out["kiln_f32_to_f8e8m0"] = (("kiln_f32_bits",), _e8m0(None, False))
    for mode in E8M0_MODES:
        for sat in (False, True):
            out[f"kiln_f32_to_f8e8m0_{mode}" + ("_sat" if sat else "")] = (("kiln_f32_bits",), _e8m0(mode, sat))
    for tag in ("bf16", *FLOATS, "f8e8m0"):
        out[f"kiln_round_{tag}"] = ((f"kiln_f32_to_{tag}", f"kiln_{tag}_to_f32"),
                                    f"static inline float kiln_round_{tag}(float x) "
                                    f"{{ return kiln_{tag}_to_f32(kiln_f32_to_{tag}(x)); }}")
    for tag in INTS:
        for name, src in _int_helpers(tag).items():
            out[name] = ((), src)
    return out


CATALOG = _catalog()


def helper_source(names) -> list[str]:
    """C definitions of the named helpers and of those they call, callees first (each once)."""
    done: list[str] = []

    def add(name: str):
        if name in done:
            return
        deps, _ = CATALOG[name]
        for d in deps:
            add(d)
        done.append(name)

    for n in sorted(names):
        add(n)
    return [CATALOG[n][1] for n in done]
