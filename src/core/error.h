/* Status messages: one line per failing call, kept per thread. */
#ifndef TK_CORE_ERROR_H
#define TK_CORE_ERROR_H

#include "tokamak.h"

/* Record a one-line message for tk_last_error() and return st, so callers can
 * write `return tk_fail(TK_ERR_FORMAT, "gguf: n_tensors %llu too large", n);` */
tk_status tk_fail(tk_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefix the current message with "ctx: " (for adding the file name, say). */
void tk_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tk_error_clear(void);

/* For broken invariants only, never for input: prints and aborts in every build. */
#define TK_ASSERT(cond)                                                                                      \
    do {                                                                                                     \
        if (!(cond)) tk_assert_fail(#cond, __FILE__, __LINE__);                                              \
    } while (0)
_Noreturn void tk_assert_fail(const char *expr, const char *file, int line);

#endif
