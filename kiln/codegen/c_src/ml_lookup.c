/* LabelEncoder and CategoryMapper (ai.onnx.ml), the kernel behind kiln.lower.ml's lowering:
   each element of `in` looked up among the nk sorted keys (strings by their UTF-8 bytes, as
   kiln_str_cmp orders them), out = its value, else *dflt; a NaN key (floats) maps to *nan_val,
   or *dflt when the table has none (nan_val NULL). Instantiated once per (key, value) type
   pair: define KILN_LOOKUP_K and KILN_LOOKUP_V (their C types), KILN_LOOKUP_STRKEY (1: string
   keys, found with kiln_str_find), KILN_LOOKUP_ISNAN(x) (0 for keys that cannot be NaN) and
   KILN_LOOKUP_FN (the function's name) before this file. Always inlined. Returns 0. */
__attribute__((always_inline)) static inline int32_t KILN_LOOKUP_FN(
    const KILN_LOOKUP_K* in, KILN_LOOKUP_V* out, int64_t n, const KILN_LOOKUP_K* keys, int64_t nk,
    const KILN_LOOKUP_V* vals, const KILN_LOOKUP_V* dflt, const KILN_LOOKUP_V* nan_val) {
  for (int64_t i = 0; i < n; ++i) {
    if (KILN_LOOKUP_ISNAN(in[i])) { out[i] = nan_val ? nan_val[0] : dflt[0]; continue; }
#if KILN_LOOKUP_STRKEY
    const int64_t k = kiln_str_find(keys, nk, in[i]);
#else
    int64_t lo = 0, hi = nk;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys[mid] < in[i]) lo = mid + 1; else hi = mid;
    }
    const int64_t k = (lo < nk && keys[lo] == in[i]) ? lo : -1;
#endif
    out[i] = k >= 0 ? vals[k] : dflt[0];
  }
  return 0;
}
