/* Streaming detokenizer: ids -> UTF-8 text, one token at a time.
 *
 * A byte-level token can end in the middle of a character (a Chinese character
 * is often two tokens), so the bytes of an unfinished character are held back
 * until the next push completes it. Anything that can never become valid UTF-8
 * is replaced by U+FFFD, one per maximal invalid subpart, as Python's
 * bytes.decode(errors="replace") and the WHATWG decoder do. */
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "tokenizer/tok_internal.h"

struct tok_stream {
    const tk_tokenizer *t;
    bool show_special;
    bool strip_space;      /* SPM: the next text token drops one leading space (see push) */
    unsigned char pend[4]; /* (npend) bytes of an unfinished character */
    int npend;
};

tk_status tok_stream_init(const tk_tokenizer *t, bool show_special, tok_stream **out) {
    *out = NULL;
    if (!t) return tk_fail(TK_ERR_INVALID, "tok_stream_init: NULL tokenizer");
    tok_stream *s = tk_calloc(1, sizeof *s);
    if (!s) return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    s->t = t;
    s->show_special = show_special;
    *out = s;
    return TK_OK;
}

void tok_stream_free(tok_stream *s) { tk_free(s); }

size_t tok_stream_bound(const tk_tokenizer *t) {
    /* held-back bytes + one token, every byte possibly becoming a 3-byte U+FFFD */
    return 3 * (t->max_piece + 4);
}

typedef struct sink {
    char *out;
    size_t cap, n;
} sink;

static inline void put(sink *k, const void *p, size_t n) {
    if (n > k->cap - k->n) n = k->cap - k->n; /* callers size with tok_stream_bound; never overrun */
    memcpy(k->out + k->n, p, n);
    k->n += n;
}

/* Emit src[0..n) after the held-back bytes; hold back an unfinished tail. */
static void feed(tok_stream *s, const unsigned char *src, size_t n, sink *k) {
    unsigned char buf[TOK_MAX_PIECE + 8];
    size_t m = 0;
    memcpy(buf, s->pend, (size_t)s->npend);
    m = (size_t)s->npend;
    memcpy(buf + m, src, n);
    m += n;
    s->npend = 0;
    size_t i = 0;
    while (i < m) {
        uint32_t cp;
        int l = tok_utf8_next(buf + i, m - i, &cp);
        if (l > 0) {
            put(k, buf + i, (size_t)l);
            i += (size_t)l;
        } else if (l < 0) {
            put(k, "\xef\xbf\xbd", 3);
            i += (size_t)-l;
        } else { /* a valid start that needs more bytes: at most 3, since l == 0 only when m - i < need */
            memcpy(s->pend, buf + i, m - i);
            s->npend = (int)(m - i);
            break;
        }
    }
}

size_t tok_stream_push(tok_stream *s, int32_t id, char *out, size_t cap) {
    if (!s || !out) return 0;
    const tk_tokenizer *t = s->t;
    sink k = {out, cap, 0};
    if (id < 0 || id >= t->n_vocab) { /* an id the vocabulary does not have reads as U+FFFD */
        feed(s, (const unsigned char *)"\xef\xbf\xbd", 3, &k);
        return k.n;
    }
    int ty = t->type[id];
    bool hidden = ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN || ty == TOK_TYPE_UNUSED;
    const unsigned char *p = (const unsigned char *)t->dec_buf + t->dec_off[id];
    size_t n = (size_t)(t->dec_off[id + 1] - t->dec_off[id]);
    if (t->kind == TOK_KIND_SPM && t->add_space_prefix) {
        /* The encoder put a "▁" before text that starts the input or follows a
         * special token; take it away again so decode(encode(x)) == x. */
        bool special = hidden || ty == TOK_TYPE_USER;
        if (special) {
            s->strip_space = true;
        } else {
            if (s->strip_space && n && p[0] == ' ') {
                p++;
                n--;
            }
            s->strip_space = false;
        }
    }
    if (hidden && !s->show_special) return 0;
    feed(s, p, n, &k);
    return k.n;
}

size_t tok_stream_flush(tok_stream *s, char *out, size_t cap) {
    if (!s || !out) return 0;
    sink k = {out, cap, 0};
    if (s->npend) put(&k, "\xef\xbf\xbd", 3); /* an unfinished character is one maximal subpart */
    s->npend = 0;
    s->strip_space = false;
    return k.n;
}
