/* Runs the model once. Returns 0 on success, -1 when native code could not allocate
 * memory, else -s where s & 0xFFFFF is k+2 for the failing call k (the artifact manifest's
 * "kernels"[k] names its nodes) and s >> 20 that kernel's status: an input value it rejected
 * (an index out of range, integer division by zero; "kernel_errors"[k] says which), or 1023
 * for memory. kiln_error_value(&v) then gives the value it rejected (per thread). */
int32_t kiln_error_value(int64_t* out);
