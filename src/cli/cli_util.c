/* Small helpers shared by the subcommands. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/alloc.h"
#include "core/error.h"

tk_status cli_read_all(FILE *f, const char *what, size_t limit, char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = tk_malloc(cap);
    *out = NULL;
    *len = 0;
    if (!buf) return tk_fail(TK_ERR_NOMEM, "%s: out of memory", what);
    for (;;) {
        if (cap - n < 4096 + 1) {
            if (n > limit) break;
            size_t nc = cap * 2;
            char *q = tk_realloc(buf, nc);
            if (!q) {
                tk_free(buf);
                return tk_fail(TK_ERR_NOMEM, "%s: out of memory after %zu bytes", what, n);
            }
            buf = q;
            cap = nc;
        }
        /* never more than limit + 1 bytes: one past the limit tells "too long" */
        size_t want = cap - n - 1;
        if (want > limit + 1 - n) want = limit + 1 - n;
        size_t r = fread(buf + n, 1, want, f);
        n += r;
        if (r == 0 || n > limit) break;
    }
    if (ferror(f)) {
        int e = errno;
        tk_free(buf);
        return tk_fail(TK_ERR_IO, "%s: read error: %s", what, strerror(e));
    }
    if (n > limit) {
        tk_free(buf);
        return tk_fail(TK_ERR_RANGE, "%s: more than the %zu bytes read at most", what, limit);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return TK_OK;
}
