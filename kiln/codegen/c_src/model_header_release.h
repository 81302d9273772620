/* Strings the model makes live in a per-thread arena of the library; output strings may
 * point there (or into the inputs, or into the library): read (copy) them, then call
 * ${symbol}() from the same thread, which frees that arena. */
int32_t ${symbol}(void);
