/* Scaler (ai.onnx.ml), the kernel behind kiln.lower.ml_preprocess' lowering: out[q] =
   ((float)in[q] - offset[j]) * scale[j], in float, for the n values of rows of `width`
   features (j = q % width). An attribute given once for every feature has step 0, per feature
   step 1. Instantiated once per input type: define KILN_SCALER_T (the input's C type) and
   KILN_SCALER_FN (the function's name) before this file. Always inlined (the sizes and steps
   are constants there). */
__attribute__((always_inline)) static inline void KILN_SCALER_FN(
    const KILN_SCALER_T* in, float* out, int64_t n, int64_t width, const float* offset, int64_t offset_step,
    const float* scale, int64_t scale_step) {
  for (int64_t q = 0; q < n; ++q) {
    const int64_t j = q % width;
    const float d = (float)in[q] - offset[j * offset_step];
    out[q] = d * scale[j * scale_step];
  }
}
