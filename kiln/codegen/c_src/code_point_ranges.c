/* Whether code point c lies in one of KILN_RANGES_N sorted, disjoint ranges [lo[k], hi[k]]
   (kiln.codegen.strings: the cased and case-ignorable sets of Python's Final_Sigma rule).
   Instantiated per set: define KILN_RANGES_FN (the function's name), KILN_RANGES_LO and
   KILN_RANGES_HI (the tables) and KILN_RANGES_N before this file. */
static int KILN_RANGES_FN(int32_t c) {
  int64_t lo = 0, hi = KILN_RANGES_N;
  while (lo < hi) { const int64_t mid = (lo + hi) / 2; if (KILN_RANGES_HI[mid] < c) lo = mid + 1; else hi = mid; }
  return c >= 0 && lo < KILN_RANGES_N && KILN_RANGES_LO[lo] <= c;
}
