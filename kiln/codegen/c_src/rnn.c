/* RNN, GRU and LSTM (ONNX): the matrix products and weight transposes of kiln.lower.rnn's
   kernel, which generates the cells (activations, order of operations) around them.
   Instantiated once per (source, compute) type pair: define KILN_RNN_SRC (the C type of the
   rows read), KILN_RNN_CT (the compute type: float or double), KILN_RNN_JB (outputs per vector
   block: 16 floats or 8 doubles, 64 bytes), KILN_RNN_V (a name for that vector type) and the
   functions' names KILN_RNN_GEMM, KILN_RNN_GEMM_BLOCK, KILN_RNN_TRANSPOSE,
   KILN_RNN_TRANSPOSE_ROWS before this file. Always inlined: each call site's literal sizes
   and flags become constants. */
typedef KILN_RNN_CT KILN_RNN_V __attribute__((vector_size(KILN_RNN_JB * sizeof(KILN_RNN_CT))));

/* Rows r0..r0+3 (clamped to n_rows) by columns j0..j0+JB of KILN_RNN_GEMM's product. */
__attribute__((always_inline)) static inline void KILN_RNN_GEMM_BLOCK(
    KILN_RNN_CT* dst, int64_t dst_stride, const KILN_RNN_SRC* src, int64_t div, int64_t hi, int64_t lo,
    int64_t src_stride, int64_t n_rows, const KILN_RNN_CT* mat, int64_t gh, int64_t col0, int64_t depth,
    int64_t j0, int64_t r0) {
  const KILN_RNN_SRC* sr[4];
  for (int64_t u = 0; u < 4; ++u) {
    const int64_t r = r0 + u < n_rows ? r0 + u : n_rows - 1;
    sr[u] = src + (r / div * hi + r % div * lo) * src_stride;
  }
  KILN_RNN_V acc[4] = {{0}};
  for (int64_t q = 0; q < depth; ++q) {
    KILN_RNN_V mv;
    memcpy(&mv, mat + q * gh + col0 + j0, sizeof mv);
    for (int64_t u = 0; u < 4; ++u) acc[u] += (KILN_RNN_CT)sr[u][q] * mv;
  }
  for (int64_t u = 0; u < 4 && r0 + u < n_rows; ++u) memcpy(dst + (r0 + u) * dst_stride + j0, &acc[u], sizeof acc[u]);
}

/* dst[r * dst_stride + j] = sum_q row(r)[q] * mat[q * gh + col0 + j] for r < n_rows, j < ncols
   (mat: the transposed weights, gh wide; row(r) = src + (r / div * hi + r % div * lo) *
   src_stride, which reads X in either layout). Blocks of JB columns x 4 rows accumulate in
   vector registers, q summed in order; a column block of mat stays in L1 across the rows.
   Blocks run in parallel when `parallel`. */
__attribute__((always_inline)) static inline void KILN_RNN_GEMM(
    KILN_RNN_CT* dst, int64_t dst_stride, const KILN_RNN_SRC* src, int64_t div, int64_t hi, int64_t lo,
    int64_t src_stride, int64_t n_rows, const KILN_RNN_CT* mat, int64_t gh, int64_t col0, int64_t ncols,
    int64_t depth, int parallel) {
  const int64_t full = ncols / KILN_RNN_JB * KILN_RNN_JB;
  if (parallel) {
    #pragma omp parallel for collapse(2) schedule(static)
    for (int64_t j0 = 0; j0 < full; j0 += KILN_RNN_JB)
      for (int64_t r0 = 0; r0 < n_rows; r0 += 4)
        KILN_RNN_GEMM_BLOCK(dst, dst_stride, src, div, hi, lo, src_stride, n_rows, mat, gh, col0, depth, j0, r0);
  } else {
    for (int64_t j0 = 0; j0 < full; j0 += KILN_RNN_JB)
      for (int64_t r0 = 0; r0 < n_rows; r0 += 4)
        KILN_RNN_GEMM_BLOCK(dst, dst_stride, src, div, hi, lo, src_stride, n_rows, mat, gh, col0, depth, j0, r0);
  }
  for (int64_t r = 0; r < n_rows && full < ncols; ++r) {
    const KILN_RNN_SRC* sr = src + (r / div * hi + r % div * lo) * src_stride;
    for (int64_t j = full; j < ncols; ++j) {
      KILN_RNN_CT acc = 0;
      for (int64_t q = 0; q < depth; ++q) acc += (KILN_RNN_CT)sr[q] * mat[q * gh + col0 + j];
      dst[r * dst_stride + j] = acc;
    }
  }
}

/* Columns j0..j0+15 of KILN_RNN_TRANSPOSE, in 16 x 16 tiles. */
__attribute__((always_inline)) static inline void KILN_RNN_TRANSPOSE_ROWS(
    KILN_RNN_CT* dst, const KILN_RNN_SRC* src, int64_t d, int64_t gh, int64_t depth, int64_t j0) {
  for (int64_t q0 = 0; q0 < depth; q0 += 16)
    for (int64_t j = j0; j < j0 + 16 && j < gh; ++j)
      for (int64_t q = q0; q < q0 + 16 && q < depth; ++q)
        dst[q * gh + j] = (KILN_RNN_CT)src[(d * gh + j) * depth + q];
}

/* dst[q][j] = src[d][j][q] (j < gh, q < depth): direction d's weights transposed, in parallel
   when `parallel`. */
__attribute__((always_inline)) static inline void KILN_RNN_TRANSPOSE(
    KILN_RNN_CT* dst, const KILN_RNN_SRC* src, int64_t d, int64_t gh, int64_t depth, int parallel) {
  if (parallel) {
    #pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < gh; j0 += 16) KILN_RNN_TRANSPOSE_ROWS(dst, src, d, gh, depth, j0);
  } else {
    for (int64_t j0 = 0; j0 < gh; j0 += 16) KILN_RNN_TRANSPOSE_ROWS(dst, src, d, gh, depth, j0);
  }
}
