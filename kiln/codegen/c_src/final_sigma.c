/* Python's Final_Sigma test for the U+03A3 at u[i..i+w): a cased letter before it and none
   after it, skipping case-ignorable code points both ways */
static int kiln_final_sigma(const unsigned char* u, int64_t n, int64_t i, int w) {
  int64_t j = i;
  int32_t c = -1;
  while (j > 0) {
    int64_t k = j - 1;
    while (k > 0 && j - k < 4 && (u[k] & 0xC0) == 0x80) --k;
    int32_t d;
    if (k + kiln_utf8_next(u + k, n - k, &d) != j) { d = -1; k = j - 1; }
    j = k;
    if (!kiln_is_ignorable(d)) { c = d; break; }
  }
  if (!kiln_is_cased(c)) return 0;
  for (j = i + w; j < n;) {
    int32_t d;
    const int ww = kiln_utf8_next(u + j, n - j, &d);
    if (!kiln_is_ignorable(d)) return !kiln_is_cased(d);
    j += ww;
  }
  return 1;
}
