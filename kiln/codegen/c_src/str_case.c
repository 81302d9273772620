/* Python's str.lower() / str.upper() of one kiln_str, into the string arena: the function
   behind kiln.codegen.strings.case_helpers, which bakes the mapping tables from Python's own
   Unicode database (full case mappings: "ß".upper() is "SS"), so results never depend on
   the machine's C locale. Instantiated once per kind: define KILN_CASE_FN (the function's
   name), KILN_CASE_CP and KILN_CASE_OFF (the tables: the mapped code points, sorted, and the
   offsets of their mappings in KILN_CASE_BYTES), KILN_CASE_N (how many code points),
   KILN_CASE_RATIO (the most output bytes per input byte), KILN_CASE_ASCII(b) (an ASCII byte
   mapped) and KILN_CASE_SIGMA (1 for lower(): U+03A3 by Python's Final_Sigma rule,
   kiln_final_sigma) before this file.

   Returns 0, 1 (out of arena memory) or 2 (a malformed kiln_str). */
static int KILN_CASE_FN(kiln_str s, kiln_str* out) {
  if (!kiln_str_ok(s) || s.len > INT64_MAX / KILN_CASE_RATIO) return 2;
  char* p = kiln_str_alloc(s.len * KILN_CASE_RATIO);
  if (!p) return 1;
  const unsigned char* u = (const unsigned char*)s.ptr;
  int64_t o = 0, i = 0;
  while (i < s.len) {
    if (u[i] < 0x80) { p[o++] = (char)KILN_CASE_ASCII(u[i]); ++i; continue; }
    int32_t c;
    const int w = kiln_utf8_next(u + i, s.len - i, &c);
#if KILN_CASE_SIGMA
    if (c == 0x3A3) { p[o++] = (char)0xCF; p[o++] = kiln_final_sigma(u, s.len, i, w) ? (char)0x82 : (char)0x83;
      i += w; continue; }
#endif
    int64_t lo = 0, hi = KILN_CASE_N;
    while (lo < hi) { const int64_t mid = (lo + hi) / 2; if (KILN_CASE_CP[mid] < c) lo = mid + 1; else hi = mid; }
    if (c >= 0 && lo < KILN_CASE_N && KILN_CASE_CP[lo] == c) {
      const int32_t a = KILN_CASE_OFF[lo], b = KILN_CASE_OFF[lo + 1];
      memcpy(p + o, KILN_CASE_BYTES + a, (size_t)(b - a));
      o += b - a;
    } else {
      memcpy(p + o, u + i, (size_t)w);
      o += w;
    }
    i += w;
  }
  out->ptr = p; out->len = o;
  return 0;
}
