#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TK_ERR_MAX 512

/* Per thread, so two engines or two test threads never see each other's message. */
static _Thread_local char err_msg[TK_ERR_MAX];

const char *tk_last_error(void) { return err_msg; }

const char *tk_status_str(tk_status st) {
    switch (st) {
    case TK_OK:
        return "ok";
    case TK_ERR_INVALID:
        return "invalid";
    case TK_ERR_FORMAT:
        return "format";
    case TK_ERR_UNSUPPORTED:
        return "unsupported";
    case TK_ERR_IO:
        return "io";
    case TK_ERR_NOMEM:
        return "nomem";
    case TK_ERR_RANGE:
        return "range";
    case TK_ERR_FULL:
        return "full";
    case TK_ERR_NOT_FOUND:
        return "not_found";
    case TK_ERR_INTERNAL:
        return "internal";
    }
    return "unknown";
}

tk_status tk_fail(tk_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    return st;
}

void tk_error_prefix(const char *fmt, ...) {
    char pre[TK_ERR_MAX], old[TK_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, err_msg, sizeof old);
    size_t n = strlen(pre);
    if (n > TK_ERR_MAX - 3) n = TK_ERR_MAX - 3;
    memcpy(err_msg, pre, n);
    memcpy(err_msg + n, ": ", 2);
    size_t rest = TK_ERR_MAX - n - 3, ol = strlen(old);
    if (ol > rest) ol = rest;
    memcpy(err_msg + n + 2, old, ol);
    err_msg[n + 2 + ol] = 0;
}

void tk_error_clear(void) { err_msg[0] = 0; }

void tk_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "tokamak: internal error: %s (%s:%d)\n", expr, file, line);
    abort();
}
