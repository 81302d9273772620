#ifndef KILN_STRING_SPLIT
#define KILN_STRING_SPLIT
/* StringSplit (ONNX), the kernel behind kiln.lower.strings' lowering: each of the n strings
   in[i] split on sep (kiln_str_split, kiln_strings.h; an empty sep splits on whitespace runs)
   at most maxsplit times (-1: no limit). counts[i] = its piece count; *width = the largest;
   out holds n rows of *width pieces (views into the input: nothing is copied), each padded
   with empty strings. Returns 0, 2 for a malformed kiln_str, or 3 when a string has more than cap
   pieces (the most the output holds per string). */
static int32_t kiln_string_split(const kiln_str* in, int64_t n, kiln_str sep, int64_t maxsplit, int64_t cap,
                                 kiln_str* out, int64_t* counts, int64_t* width) {
  *width = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!kiln_str_ok(in[i])) return 2;
    counts[i] = kiln_str_split(in[i], sep, maxsplit, 0, 0);
    if (counts[i] > cap) return 3;
    if (counts[i] > *width) *width = counts[i];
  }
  for (int64_t i = 0; i < n; ++i) {
    kiln_str* row = out + i * *width;
    const int64_t got = kiln_str_split(in[i], sep, maxsplit, row, *width);
    for (int64_t j = got; j < *width; ++j) { row[j].ptr = ""; row[j].len = 0; }
  }
  return 0;
}
#endif
