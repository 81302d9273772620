/* CumSum / CumProd (ONNX), the kernel behind kiln.lower.reduce's lowering: a scan along one
   axis, the axis read at run time. Instantiated once per (op, element type): define
   KILN_SCAN_T (the element's C type), KILN_SCAN_ACC (the accumulator's: double for floats,
   wrapping uint64_t for integers, as the reference's widened cumsum/cumprod),
   KILN_SCAN_OP(a, b) (a + b or a * b), KILN_SCAN_UNIT (0 or 1) and KILN_SCAN_FN (the
   function's name) before this file. Always inlined: each call site's literal sizes and
   flags become constants.

   in, out [dims] (rank dims); lines run in parallel when the tensor has at least
   parallel_min elements. Returns 0, KILN_FAIL(1, axis) for an axis outside [-rank, rank),
   or -1 when out of memory. */
__attribute__((always_inline)) static inline int32_t KILN_SCAN_FN(
    const KILN_SCAN_T* in, KILN_SCAN_T* out, const int64_t* dims, int64_t rank, int64_t axis,
    int64_t parallel_min, int reverse, int exclusive) {
  if (axis < -rank || axis >= rank) KILN_FAIL(1, axis);
  if (axis < 0) axis += rank;
  int64_t O = 1, N = dims[axis], I = 1;
  for (int64_t d = 0; d < axis; ++d) O *= dims[d];
  for (int64_t d = axis + 1; d < rank; ++d) I *= dims[d];
  int32_t failed = 0;
  #pragma omp parallel if (O * N * I >= parallel_min)
  {
    KILN_SCAN_ACC* acc = (KILN_SCAN_ACC*)malloc((size_t)I * sizeof(KILN_SCAN_ACC) + 1);
    #pragma omp for schedule(static)
    for (int64_t o = 0; o < O; ++o) {
      if (!acc) {
        #pragma omp atomic write
        failed = 1;
        continue;
      }
      for (int64_t i = 0; i < I; ++i) acc[i] = (KILN_SCAN_ACC)KILN_SCAN_UNIT;
      for (int64_t s = 0; s < N; ++s) {
        const int64_t base = (o * N + (reverse ? N - 1 - s : s)) * I;
        for (int64_t i = 0; i < I; ++i) {
          KILN_SCAN_ACC v = (KILN_SCAN_ACC)in[base + i];
          if (exclusive) { out[base + i] = (KILN_SCAN_T)acc[i]; acc[i] = KILN_SCAN_OP(acc[i], v); }
          else { acc[i] = KILN_SCAN_OP(acc[i], v); out[base + i] = (KILN_SCAN_T)acc[i]; }
        }
      }
    }
    free(acc);
  }
  return failed ? -1 : 0;
}
