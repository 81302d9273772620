/* RegexFullMatch, the kernel behind kiln.lower.strings' lowering: glibc's POSIX regex
   engine on the pattern translated from RE2 syntax (kiln.lower.regex_posix). Instantiated
   once per pattern: define KILN_RX(name) (the pattern's own prefix pasted onto name) and
   KILN_RX_ERE (the translated pattern, a C string literal) before this file.

   The pattern is compiled once (pthread_once), in the "C" locale so the engine matches the
   translation's UTF-8 byte sequences whatever the process locale; REG_STARTEND lets it
   read kiln_str bytes without a terminating NUL. */
#include <regex.h>
#include <locale.h>
#include <limits.h>
#include <pthread.h>
static regex_t KILN_RX(re);
static int KILN_RX(state);  /* 1: compiled, 2: no C locale, 3: regcomp failed */
static locale_t KILN_RX(loc);
static pthread_once_t KILN_RX(once) = PTHREAD_ONCE_INIT;
static void KILN_RX(init)(void) {
  KILN_RX(loc) = newlocale(LC_ALL_MASK, "C", (locale_t)0);
  if (!KILN_RX(loc)) { KILN_RX(state) = 2; return; }
  const locale_t old = uselocale(KILN_RX(loc));
  KILN_RX(state) = regcomp(&KILN_RX(re), KILN_RX_ERE, REG_EXTENDED | REG_NOSUB) == 0 ? 1 : 3;
  uselocale(old);
}
/* out[i]: whether all of in[i] matches. Returns 0, 1 (no "C" locale), 2 (a malformed
   kiln_str), 3 (regcomp refused the pattern) or 4 (a string longer than regexec can address). */
static int32_t KILN_RX(match)(const kiln_str* in, bool* out, int64_t n) {
  pthread_once(&KILN_RX(once), KILN_RX(init));
  if (KILN_RX(state) != 1) return KILN_RX(state) == 2 ? 1 : 3;
  const locale_t old = uselocale(KILN_RX(loc));
  int rc = 0;
  for (int64_t i = 0; i < n && !rc; ++i) {
    const kiln_str s = in[i];
    if (!kiln_str_ok(s)) { rc = 2; break; }
    if (s.len > INT_MAX) { rc = 4; break; }
    regmatch_t m[1];
    m[0].rm_so = 0;
    m[0].rm_eo = (regoff_t)s.len;
    out[i] = regexec(&KILN_RX(re), s.len ? s.ptr : "", 1, m, REG_STARTEND) == 0;
  }
  uselocale(old);
  return rc;
}
