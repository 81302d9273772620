#define KILN_FLOORDIV(T, a, b) ({ T q_ = (a), d_ = (b), r_ = q_ % d_; q_ = q_ / d_; \
  (r_ != 0 && ((r_ < 0) != (d_ < 0))) ? q_ - 1 : q_; })
#define KILN_FLOORMOD(T, a, b) ({ T m_ = (a), e_ = (b), s_ = m_ % e_; \
  (s_ != 0 && ((s_ < 0) != (e_ < 0))) ? s_ + e_ : s_; })
/* a string tensor's element: UTF-8 bytes, not NUL-terminated (kiln.runtime.strings) */
typedef struct { const char* ptr; int64_t len; } kiln_str;
/* the bytes of strings kernels make: a per-thread arena, freed by <prefix>_strings_release
   (weak and hidden: one copy per library, whatever its translation units) */
typedef struct kiln_str_chunk { struct kiln_str_chunk* next; size_t used, cap; } kiln_str_chunk;
/* (defined once per library: kiln_runtime_defs.h, in one of its translation units) */
#pragma GCC visibility push(hidden)
extern __thread kiln_str_chunk* kiln_str_chunks;
/* n bytes that stay valid until the arena is released; NULL when out of memory */
char* kiln_str_alloc(int64_t n);
void kiln_str_free_all(void);
#pragma GCC visibility pop
static inline void* kiln_alloc(size_t n) { return aligned_alloc(64, (n + 63) / 64 * 64); }
/* exp_floored's floor, an argument whose exp is still a normal number. Variables, not
   literals: with a constant the compiler folds exp(floor) and turns exp(max(x, floor))
   back into a blend of exp(x), whose out-of-range lanes send vector exp down its scalar path */
#pragma GCC visibility push(hidden)
extern float kiln_exp_floor_f32;
extern double kiln_exp_floor_f64;
/* run-time checks: the first failing check of a kernel records its status and the bad
   value (threads race to be first; the winner writes the value), and the kernel leaves
   the value in this thread's kiln_err_value as it returns (on the calling thread) */
extern __thread int64_t kiln_err_value;
#pragma GCC visibility pop
static inline void kiln_fail(int32_t* status, int64_t* bad, int32_t code, int64_t value) {
  int32_t none = 0;
  if (__atomic_compare_exchange_n(status, &none, code, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) *bad = value;
}
/* hand-written kernels: fail with `code`, reporting `value` */
#define KILN_FAIL(code, value) do { kiln_err_value = (int64_t)(value); return (code); } while (0)
/* the entry's status for its k-th call failing with s: k in the low 20 bits, s (1..1022;
   1023: out of memory or unknown) above them */
#define KILN_CALL_STATUS(k, s) ((int32_t)(k) + 2 + ((int32_t)((s) > 0 && (s) < 1023 ? (s) : 1023) << 20))
/* the value the last failed check on this thread reported (declared as defined, weak: not one
   of the module's functions, which an artifact renames) */
__attribute__((weak)) int32_t kiln_error_value(int64_t* out);
