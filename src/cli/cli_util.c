/* Small helpers shared by the subcommands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "core/alloc.h"

char *cli_read_all(FILE *f, size_t limit, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = tk_malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (cap - n < 4096 + 1) {
            char *q = cap <= limit ? tk_realloc(buf, cap * 2) : NULL;
            if (!q) {
                tk_free(buf);
                return NULL;
            }
            buf = q;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f) || n > limit) {
        tk_free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

bool cli_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}
