/* String tensors are arrays of kiln_str: UTF-8 bytes (not NUL-terminated) and their length. */
#ifndef KILN_STR_DEFINED
#define KILN_STR_DEFINED
typedef struct { const char* ptr; int64_t len; } kiln_str;
#endif
