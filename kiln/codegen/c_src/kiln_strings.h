#ifndef KILN_STRINGS_HELPERS
#define KILN_STRINGS_HELPERS
static inline int kiln_str_ok(kiln_str s) { return s.len >= 0 && (s.len == 0 || s.ptr != 0); }
static inline int kiln_str_eq(kiln_str a, kiln_str b) {
  return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, (size_t)a.len) == 0);
}
/* byte-wise order (= code point order for UTF-8), shorter first on a common prefix */
static inline int kiln_str_cmp(kiln_str a, kiln_str b) {
  const int64_t n = a.len < b.len ? a.len : b.len;
  const int c = n > 0 ? memcmp(a.ptr, b.ptr, (size_t)n) : 0;
  return c ? c : (a.len > b.len) - (a.len < b.len);
}
/* index of s in table[0..n) sorted by kiln_str_cmp, or -1 */
static inline int64_t kiln_str_find(const kiln_str* table, int64_t n, kiln_str s) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    const int c = kiln_str_cmp(table[mid], s);
    if (c == 0) return mid;
    if (c < 0) lo = mid + 1; else hi = mid;
  }
  return -1;
}
/* a + b in the arena; 0 on success, 1 out of memory, 2 a bad length */
static inline int kiln_str_concat(kiln_str a, kiln_str b, kiln_str* out) {
  if (!kiln_str_ok(a) || !kiln_str_ok(b) || a.len > INT64_MAX - b.len) return 2;
  char* p = kiln_str_alloc(a.len + b.len);
  if (!p) return 1;
  if (a.len) memcpy(p, a.ptr, (size_t)a.len);
  if (b.len) memcpy(p + a.len, b.ptr, (size_t)b.len);
  out->ptr = p; out->len = a.len + b.len;
  return 0;
}
/* the code point at p[0..n) (n >= 1) and its byte width; an invalid or truncated
   sequence is one byte, code point -1 (copied as is, matched by nothing) */
static inline int kiln_utf8_next(const unsigned char* p, int64_t n, int32_t* cp) {
  const unsigned c = p[0];
  if (c < 0x80) { *cp = (int32_t)c; return 1; }
  int w = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
  if (c >= 0xF5) w = 0;
  if (w == 0 || n < w) { *cp = -1; return 1; }
  int32_t v = (int32_t)(c & (0x7F >> w));
  for (int k = 1; k < w; ++k) {
    if ((p[k] & 0xC0) != 0x80) { *cp = -1; return 1; }
    v = (v << 6) | (int32_t)(p[k] & 0x3F);
  }
  if ((w == 3 && (v < 0x800 || (v >= 0xD800 && v < 0xE000))) || (w == 4 && (v < 0x10000 || v > 0x10FFFF))) {
    *cp = -1; return 1;
  }
  *cp = v;
  return w;
}
/* Python's str.isspace */
static inline int kiln_is_space(int32_t c) {
  return (c >= 9 && c <= 13) || (c >= 28 && c <= 32) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}
/* the byte width of a whitespace code point at s[i], else 0 */
static inline int kiln_space_at(kiln_str s, int64_t i) {
  int32_t c;
  const int w = kiln_utf8_next((const unsigned char*)s.ptr + i, s.len - i, &c);
  return kiln_is_space(c) ? w : 0;
}
static inline int64_t kiln_str_find_from(kiln_str s, kiln_str sep, int64_t from) {
  for (int64_t i = from; i + sep.len <= s.len; ++i)
    if (s.ptr[i] == sep.ptr[0] && memcmp(s.ptr + i, sep.ptr, (size_t)sep.len) == 0) return i;
  return -1;
}
/* Python's s.split(sep or None, maxsplit) (maxsplit < 0: no limit): writes the pieces
   (views into s) to parts[0..cap) and returns their count, which may exceed cap */
static int64_t kiln_str_split(kiln_str s, kiln_str sep, int64_t maxsplit, kiln_str* parts, int64_t cap) {
  int64_t count = 0, i = 0;
  if (maxsplit < 0) maxsplit = INT64_MAX;
#define KILN_PART(a, b) do { if (count < cap) { parts[count].ptr = s.ptr + (a); parts[count].len = (b) - (a); } \
  ++count; } while (0)
  if (sep.len > 0) {
    int64_t pos;
    while (maxsplit-- > 0 && (pos = kiln_str_find_from(s, sep, i)) >= 0) { KILN_PART(i, pos); i = pos + sep.len; }
    KILN_PART(i, s.len);
  } else {
    int w;
    while (maxsplit-- > 0) {
      while (i < s.len && (w = kiln_space_at(s, i))) i += w;
      if (i == s.len) break;
      const int64_t j = i;
      int32_t c;
      while (i < s.len && !(w = kiln_space_at(s, i))) i += kiln_utf8_next((const unsigned char*)s.ptr + i, s.len - i, &c);
      KILN_PART(j, i);
    }
    if (i < s.len) {
      while (i < s.len && (w = kiln_space_at(s, i))) i += w;
      if (i != s.len) KILN_PART(i, s.len);
    }
  }
#undef KILN_PART
  return count;
}
#endif
