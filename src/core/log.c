#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int log_level(void) {
    const char *s = getenv("TOKAMAK_LOG");
    if (!s) return TK_LOG_WARN;
    if (!strcmp(s, "error")) return TK_LOG_ERROR;
    if (!strcmp(s, "info")) return TK_LOG_INFO;
    if (!strcmp(s, "debug")) return TK_LOG_DEBUG;
    return TK_LOG_WARN;
}

void tk_log(int level, const char *fmt, ...) {
    if (level > log_level()) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tokamak %s: %s\n", names[level], buf);
}
