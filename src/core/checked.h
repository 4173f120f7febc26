/* Overflow-safe size arithmetic for everything read from files and requests. */
#ifndef TK_CORE_CHECKED_H
#define TK_CORE_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Each returns false on overflow and leaves *out unspecified. */
static inline bool tk_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
static inline bool tk_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool tk_add_size(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }
static inline bool tk_mul_size(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool tk_mul_i64(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}

/* True when [off, off+len) lies inside [0, size). */
static inline bool tk_range_ok(uint64_t off, uint64_t len, uint64_t size) {
    return off <= size && len <= size - off;
}

#endif
