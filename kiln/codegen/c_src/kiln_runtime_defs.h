/* The definitions kiln_runtime.h declares: weak (and but for kiln_error_value, hidden), so one
   copy per library. One translation unit of each library holds them (kiln.codegen.c), not every
   one: compiled in each, they cost 10-14 ms of CPU per unit, a quarter of what an empty unit
   costs. Shared kernels' units (kept per machine, linked into any library) hold none. */
#pragma GCC visibility push(hidden)
__attribute__((weak)) __thread kiln_str_chunk* kiln_str_chunks = 0;
__attribute__((weak)) char* kiln_str_alloc(int64_t n) {
  if (n < 0) return 0;
  size_t need = n > 0 ? (size_t)n : 1;
  kiln_str_chunk* c = kiln_str_chunks;
  if (!c || c->cap - c->used < need) {
    size_t cap = need > ((size_t)1 << 16) ? need : ((size_t)1 << 16);
    if (cap > SIZE_MAX - sizeof(kiln_str_chunk)) return 0;
    c = (kiln_str_chunk*)malloc(sizeof(kiln_str_chunk) + cap);
    if (!c) return 0;
    c->next = kiln_str_chunks; c->used = 0; c->cap = cap;
    kiln_str_chunks = c;
  }
  char* p = (char*)(c + 1) + c->used;
  c->used += need;
  return p;
}
__attribute__((weak)) void kiln_str_free_all(void) {
  kiln_str_chunk* c = kiln_str_chunks;
  while (c) { kiln_str_chunk* next = c->next; free(c); c = next; }
  kiln_str_chunks = 0;
}
__attribute__((weak)) float kiln_exp_floor_f32 = -87.0f;
__attribute__((weak)) double kiln_exp_floor_f64 = -708.0;
__attribute__((weak)) __thread int64_t kiln_err_value = 0;
#pragma GCC visibility pop
__attribute__((weak)) int32_t kiln_error_value(int64_t* out) { *out = kiln_err_value; return 0; }
