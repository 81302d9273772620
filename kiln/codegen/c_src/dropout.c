/* Dropout (ONNX) in training mode, the kernel behind kiln.lower.elementwise's lowering when
   training_mode is run-time data (or known true): the mask drawn from NumPy's legacy MT19937
   as the reference draws it (kiln_mt, kiln_random.h), so a seeded node gives exactly the
   reference's mask. Instantiated once per element type: define KILN_DROPOUT_T (its C type),
   KILN_DROPOUT_W (the type the scaling is computed in, as the reference: double for float64,
   else float) and KILN_DROPOUT_FN (the function's name) before this file. Always inlined.

   in, out [n]; mask [n] or NULL (not asked for). Not training, or ratio r 0: a copy and a
   mask of ones. `seeded` 0: the seed is fresh entropy (kiln_entropy), else `seed` (the
   node's seed mod 2^32). Returns 0, or 1 for a ratio outside [0, 1). */
__attribute__((always_inline)) static inline int32_t KILN_DROPOUT_FN(
    const KILN_DROPOUT_T* in, KILN_DROPOUT_T* out, bool* mask, int64_t n, double r, int training, int seeded,
    uint32_t seed) {
  if (!training || r == 0) {
    memcpy(out, in, n * sizeof(KILN_DROPOUT_T));
    if (mask) for (int64_t i = 0; i < n; ++i) mask[i] = 1;
    return 0;
  }
  if (!(r >= 0 && r < 1)) return 1;
  const KILN_DROPOUT_W scale = (KILN_DROPOUT_W)(1.0 / (1.0 - r));
  if (!seeded) {
    uint64_t w[4];
    kiln_entropy(w);
    seed = (uint32_t)w[0];
  }
  kiln_mt mt;
  kiln_mt_seed(&mt, seed);
  for (int64_t i = 0; i < n; ++i) {
    const double u = kiln_mt_draw(&mt);
    const bool keep = u >= r;
    out[i] = (KILN_DROPOUT_T)(keep ? (KILN_DROPOUT_W)in[i] * scale : (KILN_DROPOUT_W)0);
    if (mask) mask[i] = keep;
  }
  return 0;
}
