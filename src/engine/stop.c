#include "engine/stop.h"

#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"

struct stop_matcher {
    int n;
    char **stops;   /* (n) owned copies */
    size_t *lens;   /* (n) */
    size_t max_len; /* longest stop string */
    size_t max_push;
    char *buf; /* (max_len + max_push) text held back, then the new text */
    size_t held;
    bool done; /* a stop string matched */
};

tk_status stop_init(const char *const *stops, int n, size_t max_push, stop_matcher **out) {
    if (!out) return tk_fail(TK_ERR_INVALID, "stop_init: out is NULL");
    *out = NULL;
    if (n < 0 || n > TK_MAX_STOP)
        return tk_fail(TK_ERR_INVALID, "stop: %d stop strings, expected 0..%d", n, TK_MAX_STOP);
    if (n > 0 && !stops) return tk_fail(TK_ERR_INVALID, "stop: %d stop strings but the array is NULL", n);
    stop_matcher *m = tk_calloc(1, sizeof *m);
    if (!m) return tk_fail(TK_ERR_NOMEM, "stop: out of memory");
    m->max_push = max_push;
    if (n > 0) {
        m->stops = tk_calloc((size_t)n, sizeof *m->stops);
        m->lens = tk_calloc((size_t)n, sizeof *m->lens);
        if (!m->stops || !m->lens) goto nomem;
    }
    for (int i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0]) {
            stop_free(m);
            return tk_fail(TK_ERR_INVALID, "stop: stop string %d is %s", i, stops[i] ? "empty" : "NULL");
        }
        m->lens[i] = strlen(stops[i]);
        if (m->lens[i] > 4096) {
            size_t l = m->lens[i];
            stop_free(m);
            return tk_fail(TK_ERR_RANGE, "stop: stop string %d is %zu bytes, at most 4096", i, l);
        }
        m->stops[i] = tk_strdup(stops[i]);
        if (!m->stops[i]) goto nomem;
        m->n = i + 1;
        if (m->lens[i] > m->max_len) m->max_len = m->lens[i];
    }
    size_t cap;
    if (!tk_add_size(m->max_len, max_push, &cap) || !tk_add_size(cap, 1, &cap)) {
        stop_free(m);
        return tk_fail(TK_ERR_RANGE, "stop: max_push %zu too large", max_push);
    }
    m->buf = tk_malloc(cap);
    if (!m->buf) goto nomem;
    *out = m;
    return TK_OK;
nomem:
    stop_free(m);
    return tk_fail(TK_ERR_NOMEM, "stop: out of memory");
}

void stop_free(stop_matcher *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) tk_free(m->stops[i]);
    tk_free(m->stops);
    tk_free(m->lens);
    tk_free(m->buf);
    tk_free(m);
}

size_t stop_out_bound(const stop_matcher *m) { return m->max_len + m->max_push; }

/* Length of the longest suffix of buf[0, h) that is a proper prefix of some
 * stop string: those bytes may still become a match. */
static size_t held_suffix(const stop_matcher *m, size_t h) {
    size_t best = 0;
    for (int i = 0; i < m->n; i++) {
        size_t k = m->lens[i] - 1 < h ? m->lens[i] - 1 : h;
        for (; k > best; k--)
            if (memcmp(m->buf + h - k, m->stops[i], k) == 0) break;
        if (k > best) best = k;
    }
    return best;
}

bool stop_push(stop_matcher *m, const char *text, size_t len, char *out, size_t *out_len) {
    *out_len = 0;
    if (m->done) return true;
    if (len > m->max_push) len = m->max_push; /* contract breach: never overrun buf */
    if (m->n == 0) {
        memcpy(out, text, len);
        *out_len = len;
        return false;
    }
    size_t old = m->held;
    memcpy(m->buf + old, text, len);
    size_t h = old + len;
    /* The held part had no complete match, so a new match ends in the new text
     * and starts at most max_len - 1 bytes before it. */
    size_t from = old > m->max_len ? old - m->max_len : 0;
    size_t best = h;
    for (int i = 0; i < m->n; i++) {
        const char *p = memmem(m->buf + from, h - from, m->stops[i], m->lens[i]);
        if (p && (size_t)(p - m->buf) < best) best = (size_t)(p - m->buf);
    }
    if (best < h) {
        memcpy(out, m->buf, best);
        *out_len = best;
        m->held = 0;
        m->done = true;
        return true;
    }
    size_t keep = held_suffix(m, h);
    size_t emit = h - keep;
    memcpy(out, m->buf, emit);
    *out_len = emit;
    memmove(m->buf, m->buf + emit, keep);
    m->held = keep;
    return false;
}

size_t stop_flush(stop_matcher *m, char *out) {
    if (m->done) return 0;
    size_t n = m->held;
    memcpy(out, m->buf, n);
    m->held = 0;
    return n;
}
