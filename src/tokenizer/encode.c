/* Text -> ids: UTF-8 repair, added-token splitting (longest first), NFC,
 * the PCRE2 pre-tokenizer, byte-level BPE merges, and SentencePiece merges.
 *
 * tok_encode allocates its own scratch per call, so one tokenizer serves many
 * threads at once. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>
#include <utf8proc.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "tokenizer/tok_internal.h"

int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int need;
    unsigned lo = 0x80, hi = 0xbf; /* allowed range of the second byte (Unicode table 3-7) */
    if (c >= 0xc2 && c <= 0xdf)
        need = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else
        return -1;
    uint32_t v = c & (need == 2 ? 0x1f : need == 3 ? 0x0f : 0x07);
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return 0;
        unsigned b = s[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xbf)) return -i;
        v = (v << 6) | (b & 0x3f);
    }
    *cp = v;
    return need;
}

/* ---- output ---- */

typedef struct out_ids {
    int32_t *ids;
    size_t cap, n;
} out_ids;

static inline void emit(out_ids *o, int32_t id) {
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++; /* keep counting past cap so the error can say how many were needed */
}

/* ---- scratch, grown per call ---- */

typedef struct merge_sym {
    int32_t id;          /* token id, or -1 (SPM character not in the vocabulary) */
    int32_t prev, next;  /* linked list over the word; -1 at the ends */
    uint32_t start, len; /* bytes of the word this symbol covers */
} merge_sym;

typedef struct merge_ent {
    double key;       /* lower merges first: BPE rank, or -score for SPM */
    int32_t pos;      /* left symbol */
    int32_t lid, rid; /* ids it was built from (BPE staleness check) */
    uint32_t len;     /* bytes of the merged pair (SPM staleness check) */
    int32_t out;      /* id of the merged token */
} merge_ent;

typedef struct scratch {
    merge_sym *sym; /* (sym_cap) */
    size_t sym_cap;
    merge_ent *heap; /* (heap_cap) */
    size_t heap_cap;
    int32_t *ids; /* (ids_cap) naive BPE symbols */
    size_t ids_cap;
    tok_pair *rank; /* (rank_cap) the merge of symbols (i, i+1); rank INT32_MAX if none */
    size_t rank_cap;
    char *buf; /* (buf_cap) text after repair / NFC / escaping */
    size_t buf_cap;
    int32_t *cps; /* (cps_cap) NFC code points */
    size_t cps_cap;
    /* Words already merged in this call -> their ids: text repeats words far
     * more often than the vocabulary lookup can answer them. */
    struct cache_slot *slots; /* (CACHE_SLOTS) */
    char *ckeys;              /* (CACHE_KEY_BYTES) word bytes */
    int32_t *cids;            /* (CACHE_IDS) ids */
    size_t n_slots, n_ckeys, n_cids;
} scratch;

typedef struct cache_slot {
    uint64_t hash; /* 0: empty */
    uint32_t key, len, ids, n;
} cache_slot;

#define CACHE_SLOTS     8192 /* power of two; refilled from empty at half full */
#define CACHE_KEY_BYTES (1u << 18)
#define CACHE_IDS       (1u << 16)

static void scratch_free(scratch *s) {
    tk_free(s->sym);
    tk_free(s->heap);
    tk_free(s->ids);
    tk_free(s->rank);
    tk_free(s->buf);
    tk_free(s->cps);
    tk_free(s->slots);
    tk_free(s->ckeys);
    tk_free(s->cids);
}

/* Grow *p to hold n elements of size sz; false on overflow or no memory. */
static bool grow(void **p, size_t *cap, size_t n, size_t sz) {
    if (n <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < n) {
        if (c > SIZE_MAX / 2) return false;
        c *= 2;
    }
    size_t bytes;
    if (!tk_mul_size(c, sz, &bytes)) return false;
    void *q = tk_realloc(*p, bytes);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* ---- the heap merger (long BPE words and all SPM text) ---- */

static inline bool ent_less(const merge_ent *a, const merge_ent *b) {
    return a->key < b->key || (a->key == b->key && a->pos < b->pos); /* ties: leftmost first */
}

static void heap_push(merge_ent *h, size_t *n, merge_ent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ent_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static merge_ent heap_pop(merge_ent *h, size_t *n) {
    merge_ent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && ent_less(&h[c + 1], &h[c])) c++;
        if (!ent_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Can symbols l and r merge? Fills e and returns true if so. */
static bool pair_eval(const tk_tokenizer *t, const char *text, const merge_sym *sym, int32_t l, int32_t r,
                      merge_ent *e) {
    const merge_sym *a = &sym[l], *b = &sym[r];
    if (t->kind == TOK_KIND_BPE) {
        const tok_pair *p;
        if (a->len == 1 && b->len == 1) { /* two single bytes: the small table */
            p = &t->byte_pairs[(unsigned char)text[a->start] << 8 | (unsigned char)text[b->start]];
            if (p->rank == INT32_MAX) return false;
        } else if (!(p = tok_pair_find(t, a->id, b->id))) {
            return false;
        }
        *e = (merge_ent){(double)p->rank, l, a->id, b->id, a->len + b->len, p->out};
        return true;
    }
    int32_t id = tok_find(t, text + a->start, (size_t)a->len + b->len);
    if (id < 0) return false;
    *e = (merge_ent){-(double)t->score[id], l, a->id, b->id, a->len + b->len, id};
    return true;
}

/* Merge the n symbols in s->sym (already linked 0..n-1) until no pair merges. */
static tk_status merge_heap(const tk_tokenizer *t, const char *text, scratch *s, size_t n) {
    if (n < 2) return TK_OK;
    if (!grow((void **)&s->heap, &s->heap_cap, 3 * n, sizeof *s->heap))
        return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    merge_sym *sym = s->sym;
    size_t hn = 0;
    merge_ent e;
    for (size_t i = 0; i + 1 < n; i++)
        if (pair_eval(t, text, sym, (int32_t)i, (int32_t)i + 1, &e)) heap_push(s->heap, &hn, e);
    while (hn) {
        e = heap_pop(s->heap, &hn);
        merge_sym *a = &sym[e.pos];
        if (a->len == 0 || a->next < 0) continue;
        merge_sym *b = &sym[a->next];
        if (a->len + b->len != e.len || a->id != e.lid || b->id != e.rid) continue; /* stale */
        a->id = e.out;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) sym[b->next].prev = e.pos;
        if (t->kind == TOK_KIND_BPE) { /* both neighbours' lookups miss the cache: start them together */
            if (a->prev >= 0) tok_pair_prefetch(t, sym[a->prev].id, a->id);
            if (a->next >= 0) tok_pair_prefetch(t, a->id, sym[a->next].id);
        }
        /* each merge removes one entry and adds at most two, so 3n never overflows */
        if (a->prev >= 0 && pair_eval(t, text, sym, a->prev, e.pos, &e)) heap_push(s->heap, &hn, e);
        if (a->next >= 0 && pair_eval(t, text, sym, (int32_t)(a - sym), a->next, &e))
            heap_push(s->heap, &hn, e);
    }
    return TK_OK;
}

/* ---- byte-level BPE ---- */

#define NAIVE_MAX 32 /* below this, a rescan beats the heap */

static inline tok_pair pair_at(const tk_tokenizer *t, int32_t l, int32_t r) {
    const tok_pair *p = tok_pair_find(t, l, r);
    return p ? *p : (tok_pair){0, INT32_MAX, -1};
}

/* BPE merges over the bytes w[0..n): the ids land in *res[0..*m). */
static tk_status bpe_merge(const tk_tokenizer *t, const unsigned char *w, size_t n, scratch *s,
                           const int32_t **res, size_t *m) {
    if (n <= NAIVE_MAX) {
        if (!grow((void **)&s->ids, &s->ids_cap, n, sizeof(int32_t)) ||
            !grow((void **)&s->rank, &s->rank_cap, n, sizeof(tok_pair)))
            return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
        int32_t *sym = s->ids;
        tok_pair *pr = s->rank;
        size_t k = n;
        for (size_t i = 0; i < n; i++) sym[i] = t->byte_tok[w[i]];
        for (size_t i = 0; i + 1 < k; i++) pr[i] = t->byte_pairs[(unsigned)w[i] << 8 | w[i + 1]];
        for (;;) {
            int32_t best = INT32_MAX;
            size_t bi = 0;
            for (size_t i = 0; i + 1 < k; i++)
                if (pr[i].rank < best) {
                    best = pr[i].rank;
                    bi = i;
                }
            if (best == INT32_MAX) break;
            sym[bi] = pr[bi].out;
            memmove(sym + bi + 1, sym + bi + 2, (k - bi - 2) * sizeof *sym);
            if (bi + 2 < k) memmove(pr + bi + 1, pr + bi + 2, (k - bi - 2) * sizeof *pr);
            k--;
            /* both neighbours' lookups miss the cache: start them together */
            if (bi > 0) tok_pair_prefetch(t, sym[bi - 1], sym[bi]);
            if (bi + 1 < k) tok_pair_prefetch(t, sym[bi], sym[bi + 1]);
            if (bi > 0) pr[bi - 1] = pair_at(t, sym[bi - 1], sym[bi]);
            if (bi + 1 < k) pr[bi] = pair_at(t, sym[bi], sym[bi + 1]);
        }
        *res = sym;
        *m = k;
        return TK_OK;
    }
    if (!grow((void **)&s->sym, &s->sym_cap, n, sizeof *s->sym) ||
        !grow((void **)&s->ids, &s->ids_cap, n, sizeof(int32_t)))
        return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++)
        s->sym[i] =
            (merge_sym){t->byte_tok[w[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, (uint32_t)i, 1};
    tk_status st = merge_heap(t, (const char *)w, s, n);
    if (st) return st;
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = s->sym[i].next) s->ids[k++] = s->sym[i].id;
    *res = s->ids;
    *m = k;
    return TK_OK;
}

static tk_status bpe_word(const tk_tokenizer *t, const unsigned char *w, size_t n, scratch *s, out_ids *o) {
    if (n == 1) {
        emit(o, t->byte_tok[w[0]]);
        return TK_OK;
    }
    uint64_t h = tok_hash((const char *)w, n) | 1;
    cache_slot *slot = NULL;
    if (s->slots) {
        for (size_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
            cache_slot *c = &s->slots[i];
            if (!c->hash) {
                slot = c;
                break;
            }
            if (c->hash == h && c->len == n && !memcmp(s->ckeys + c->key, w, n)) {
                for (uint32_t j = 0; j < c->n; j++) emit(o, s->cids[c->ids + j]);
                return TK_OK;
            }
        }
    }
    /* Most words are one token: skip merging when the word is a token that BPE
     * reproduces (or, with ignore_merges, any token at all). */
    const int32_t *ids;
    size_t m;
    int32_t id = tok_find_raw(t, (const char *)w, n);
    if (id >= 0 && (t->ignore_merges || t->whole_ok[id])) {
        ids = &id;
        m = 1;
    } else {
        tk_status st = bpe_merge(t, w, n, s, &ids, &m);
        if (st) return st;
    }
    for (size_t i = 0; i < m; i++) emit(o, ids[i]);
    if (slot) {
        if (s->n_slots >= CACHE_SLOTS / 2 || n > CACHE_KEY_BYTES - s->n_ckeys || m > CACHE_IDS - s->n_cids) {
            memset(s->slots, 0, CACHE_SLOTS * sizeof *s->slots); /* full: start over */
            s->n_slots = s->n_ckeys = s->n_cids = 0;
            if (n > CACHE_KEY_BYTES || m > CACHE_IDS) return TK_OK;
            for (size_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1))
                if (!s->slots[i].hash) {
                    slot = &s->slots[i];
                    break;
                }
        }
        *slot = (cache_slot){h, (uint32_t)s->n_ckeys, (uint32_t)n, (uint32_t)s->n_cids, (uint32_t)m};
        memcpy(s->ckeys + s->n_ckeys, w, n);
        memcpy(s->cids + s->n_cids, ids, m * sizeof *ids);
        s->n_ckeys += n;
        s->n_cids += m;
        s->n_slots++;
    }
    return TK_OK;
}

tk_status tok_compute_whole(tk_tokenizer *t) {
    t->whole_ok = tk_calloc((size_t)t->n_vocab, 1);
    if (!t->whole_ok) return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    scratch s = {0};
    tk_status st = TK_OK;
    for (int32_t i = 0; i < t->n_vocab && !st; i++) {
        size_t n = (size_t)(t->dec_off[i + 1] - t->dec_off[i]);
        if (t->type[i] != TOK_TYPE_NORMAL || n < 2 || tok_find_raw(t, t->dec_buf + t->dec_off[i], n) != i)
            continue;
        const int32_t *ids;
        size_t m;
        st = bpe_merge(t, (const unsigned char *)t->dec_buf + t->dec_off[i], n, &s, &ids, &m);
        if (!st) t->whole_ok[i] = m == 1 && ids[0] == i;
    }
    scratch_free(&s);
    return st;
}

static inline bool inert_at(const tk_tokenizer *t, const char *text, size_t len, size_t i, size_t *l) {
    unsigned char c = (unsigned char)text[i];
    if (c < 0x80) {
        *l = 1;
        return true;
    }
    uint32_t cp;
    int k = tok_utf8_next((const unsigned char *)text + i, len - i, &cp);
    *l = k > 0 ? (size_t)k : 1;
    return k > 0 && cp < TOK_NFC_SPAN && (t->nfc_inert[cp >> 3] & (1u << (cp & 7)));
}

/* NFC of text[0..len) appended to s->buf at *k (room is there). */
static tk_status nfc_run(const char *text, size_t len, scratch *s, size_t *k) {
    utf8proc_option_t opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    size_t want = len + 16;
    for (;;) {
        if (!grow((void **)&s->cps, &s->cps_cap, want, sizeof(int32_t)))
            return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
        utf8proc_ssize_t r = utf8proc_decompose((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, s->cps,
                                                (utf8proc_ssize_t)s->cps_cap, opt);
        if (r < 0) return tk_fail(TK_ERR_INTERNAL, "tokenizer: NFC: %s", utf8proc_errmsg(r));
        if ((size_t)r > s->cps_cap) {
            want = (size_t)r;
            continue;
        }
        utf8proc_ssize_t b = utf8proc_reencode(s->cps, r, opt); /* writes UTF-8 over the code points */
        if (b < 0) return tk_fail(TK_ERR_INTERNAL, "tokenizer: NFC: %s", utf8proc_errmsg(b));
        memcpy(s->buf + *k, s->cps, (size_t)b);
        *k += (size_t)b;
        return TK_OK;
    }
}

/* NFC of valid UTF-8 text; *res points at text or at s->buf. Only the runs
 * around characters NFC might touch go through utf8proc: text splits into
 * independent pieces before every inert character (see build_nfc_inert). */
static tk_status nfc(const tk_tokenizer *t, const char *text, size_t len, scratch *s, const char **res,
                     size_t *res_len) {
    size_t i = 0, l;
    while (i < len && inert_at(t, text, len, i, &l)) i += l;
    if (i == len) {
        *res = text;
        *res_len = len;
        return TK_OK;
    }
    size_t need;
    if (!tk_mul_size(len, 3, &need) || !grow((void **)&s->buf, &s->buf_cap, need + 16, 1))
        return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    size_t k = 0, done = 0, last_inert = SIZE_MAX;
    i = 0;
    while (i < len) {
        if (inert_at(t, text, len, i, &l)) {
            last_inert = i;
            i += l;
            continue;
        }
        /* The run: from the inert starter before it (it may compose) to the next inert character. */
        size_t start = last_inert != SIZE_MAX && last_inert >= done ? last_inert : done, j = i;
        while (j < len && !inert_at(t, text, len, j, &l)) j += l;
        memcpy(s->buf + k, text + done, start - done);
        k += start - done;
        tk_status st = nfc_run(text + start, j - start, s, &k);
        if (st) return st;
        done = i = j;
    }
    memcpy(s->buf + k, text + done, len - done);
    k += len - done;
    *res = s->buf;
    *res_len = k;
    return TK_OK;
}

static tk_status bpe_segment(const tk_tokenizer *t, const char *text, size_t len, pcre2_match_data *md,
                             scratch *s, out_ids *o) {
    const char *norm;
    size_t nlen;
    tk_status st = TK_OK;
    norm = text;
    nlen = len;
    if (t->nfc && (st = nfc(t, text, len, s, &norm, &nlen))) return st;
    const pcre2_code *re = t->re;
    size_t off = 0;
    while (off < nlen) {
        int rc = pcre2_match(re, (PCRE2_SPTR)norm, nlen, off, PCRE2_NO_UTF_CHECK, md, NULL);
        size_t ms = nlen, me = nlen;
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            ms = ov[0];
            me = ov[1];
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            return tk_fail(TK_ERR_INTERNAL, "tokenizer: pre-tokenizer match failed (%d)", rc);
        }
        if (ms > off) { /* text between matches is a piece of its own (Split "Isolated") */
            st = bpe_word(t, (const unsigned char *)norm + off, ms - off, s, o);
            if (st) return st;
        }
        if (ms >= nlen) break;
        if (me == ms) { /* an empty match cannot happen with the known patterns; step one character */
            uint32_t cp;
            int k = tok_utf8_next((const unsigned char *)norm + ms, nlen - ms, &cp);
            me = ms + (size_t)(k > 0 ? k : 1);
        }
        st = bpe_word(t, (const unsigned char *)norm + ms, me - ms, s, o);
        if (st) return st;
        off = me;
    }
    return TK_OK;
}

/* ---- SentencePiece BPE (llama.cpp's llm_tokenizer_spm) ---- */

static tk_status spm_segment(const tk_tokenizer *t, const char *text, size_t len, bool prefix_space,
                             scratch *s, out_ids *o) {
    size_t need;
    if (!tk_mul_size(len + 1, 3, &need)) return tk_fail(TK_ERR_RANGE, "tokenizer: text too long");
    if (!grow((void **)&s->buf, &s->buf_cap, need, 1))
        return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    size_t k = 0;
    if (prefix_space) {
        memcpy(s->buf, "\xe2\x96\x81", 3);
        k = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s->buf + k, "\xe2\x96\x81", 3);
            k += 3;
        } else {
            s->buf[k++] = text[i];
        }
    }
    const char *esc = s->buf;
    size_t n = 0;
    if (!grow((void **)&s->sym, &s->sym_cap, k, sizeof *s->sym))
        return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < k;) {
        uint32_t cp;
        int cl = tok_utf8_next((const unsigned char *)esc + i, k - i, &cp);
        size_t l = cl > 0 ? (size_t)cl : 1; /* input was repaired, so this is always a whole character */
        s->sym[n] = (merge_sym){tok_find(t, esc + i, l), (int32_t)n - 1, -1, (uint32_t)i, (uint32_t)l};
        if (n) s->sym[n - 1].next = (int32_t)n;
        n++;
        i += l;
    }
    tk_status st = merge_heap(t, esc, s, n);
    if (st) return st;
    for (int32_t i = n ? 0 : -1; i >= 0; i = s->sym[i].next) {
        const merge_sym *m = &s->sym[i];
        if (m->id >= 0) {
            emit(o, m->id);
            continue;
        }
        for (uint32_t j = 0; j < m->len; j++) { /* byte fallback: <0xXX>, else <unk> */
            int32_t b = t->byte_tok[(unsigned char)esc[m->start + j]];
            if (b < 0 && t->unk < 0)
                return tk_fail(TK_ERR_INVALID,
                               "tokenizer: character at byte %u has no token, no byte fallback and no <unk>",
                               m->start);
            emit(o, b >= 0 ? b : t->unk);
            if (b < 0) break; /* one <unk> per character */
        }
    }
    return TK_OK;
}

/* ---- the whole pipeline ---- */

size_t tok_encode_bound(const tk_tokenizer *t, size_t text_len) {
    (void)t;
    /* U+FFFD repair triples a byte; NFC grows text at most 3x; SPM adds one
     * prefix space per fragment. Every byte of the result is at most one token. */
    size_t b;
    if (!tk_mul_size(text_len, 9, &b) || !tk_add_size(b, 8, &b)) return SIZE_MAX;
    return b;
}

size_t tok_utf8_repair(const char *text, size_t len, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int l = tok_utf8_next((const unsigned char *)text + i, len - i, &cp);
        if (l > 0) {
            memcpy(out + k, text + i, (size_t)l);
            k += (size_t)l;
            i += (size_t)l;
        } else {
            memcpy(out + k, "\xef\xbf\xbd", 3);
            k += 3;
            i += l < 0 ? (size_t)-l : len - i; /* 0: a truncated character at the end */
        }
    }
    return k;
}

/* A tk_malloc'd copy of text with each invalid maximal subpart replaced by U+FFFD. */
static tk_status repair_utf8(const char *text, size_t len, char **res, size_t *res_len) {
    size_t need;
    if (!tk_mul_size(len, 3, &need) || !tk_add_size(need, 1, &need))
        return tk_fail(TK_ERR_RANGE, "tokenizer: text too long");
    char *r = tk_malloc(need);
    if (!r) return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    *res = r;
    *res_len = tok_utf8_repair(text, len, r);
    return TK_OK;
}

bool tok_utf8_valid(const char *text, size_t len) {
    for (size_t i = 0; i < len;) {
        if ((unsigned char)text[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int l = tok_utf8_next((const unsigned char *)text + i, len - i, &cp);
        if (l <= 0) return false;
        i += (size_t)l;
    }
    return true;
}

/* The added token starting at text[i] and ending by text[end], longest first;
 * -1 if none. Special tokens match only where special_ok. */
static int match_added(const tk_tokenizer *t, const char *text, size_t end, size_t i, bool special_ok) {
    for (int k = 0; k < t->n_added; k++) {
        const tok_added *a = &t->added[k];
        if (a->special && !special_ok) continue;
        size_t pl = (size_t)(t->piece_off[a->id + 1] - t->piece_off[a->id]);
        if (pl <= end - i && !memcmp(text + i, t->piece_buf + t->piece_off[a->id], pl)) return k;
    }
    return -1;
}

/* The pipeline over valid UTF-8. The marks cut the text into segments (each
 * mark, and each gap between marks); an added token is matched only inside one
 * segment, and a special one only inside a mark. */
static tk_status encode_valid(const tk_tokenizer *t, const char *text, size_t len, const tok_range *marks,
                              size_t n_marks, bool add_bos, out_ids *o) {
    scratch s = {0};
    tk_status st = TK_OK;
    pcre2_match_data *md = NULL;
    if (t->kind == TOK_KIND_BPE) {
        md = pcre2_match_data_create_from_pattern((const pcre2_code *)t->re,
                                                  (pcre2_general_context *)t->re_gctx);
        if (md && len >= 4096) { /* short texts rarely repeat a word: skip the cache's setup cost */
            s.slots = tk_calloc(CACHE_SLOTS, sizeof *s.slots);
            s.ckeys = tk_malloc(CACHE_KEY_BYTES);
            s.cids = tk_malloc(CACHE_IDS * sizeof *s.cids);
            if (!s.slots || !s.ckeys || !s.cids) {
                tk_free(s.slots); /* the cache is optional: run without it */
                tk_free(s.ckeys);
                tk_free(s.cids);
                s.slots = NULL;
                s.ckeys = NULL;
                s.cids = NULL;
            }
        }
        if (!md) {
            st = tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
    }
    if (add_bos && t->add_bos && t->bos >= 0) emit(o, t->bos);
    bool prev_special = true; /* SPM: a fragment at the start or after a special token gets a space prefix */
    size_t seg = 0, mk = 0;   /* marks[mk]: the first mark that ends after i */
    for (size_t i = 0; i <= len;) {
        int k = -1;
        unsigned char c = i < len ? (unsigned char)text[i] : 0;
        if (i < len && (t->added_first[c >> 3] & (1u << (c & 7)))) { /* an added token may start here */
            while (mk < n_marks && marks[mk].end <= i) mk++;
            bool in_mark = mk < n_marks && marks[mk].begin <= i;
            size_t end = in_mark ? marks[mk].end : mk < n_marks ? marks[mk].begin : len;
            k = match_added(t, text, end, i, in_mark);
        }
        if (k < 0 && i < len) {
            i++;
            continue;
        }
        if (i > seg) {
            if (t->kind == TOK_KIND_BPE)
                st = bpe_segment(t, text + seg, i - seg, md, &s, o);
            else
                st = spm_segment(t, text + seg, i - seg, t->add_space_prefix && prev_special, &s, o);
            if (st) goto done;
            prev_special = false;
        }
        if (k < 0) break; /* i == len */
        int32_t id = t->added[k].id;
        emit(o, id);
        prev_special = true;
        i += (size_t)(t->piece_off[id + 1] - t->piece_off[id]);
        seg = i;
    }
done:
    if (md) pcre2_match_data_free(md);
    scratch_free(&s);
    return st;
}

static tk_status check_fit(const out_ids *o, size_t cap, size_t *n_out) {
    if (o->n > o->cap)
        return tk_fail(TK_ERR_RANGE, "tok_encode: %zu ids do not fit in %zu (size with tok_encode_bound)",
                       o->n, cap);
    *n_out = o->n;
    return TK_OK;
}

tk_status tok_encode(const tk_tokenizer *t, const char *text, size_t len, bool add_bos, bool parse_special,
                     int32_t *ids, size_t cap, size_t *n_out) {
    *n_out = 0;
    if (!t || (!text && len)) return tk_fail(TK_ERR_INVALID, "tok_encode: NULL tokenizer or text");
    out_ids o = {ids, ids ? cap : 0, 0};
    char *repaired = NULL;
    tk_status st = TK_OK;
    if (!tok_utf8_valid(text, len)) {
        if ((st = repair_utf8(text, len, &repaired, &len))) return st;
        text = repaired;
    }
    tok_range all = {0, len};
    st = encode_valid(t, text, len, &all, parse_special ? 1 : 0, add_bos, &o);
    if (!st) st = check_fit(&o, cap, n_out);
    tk_free(repaired);
    return st;
}

tk_status tok_encode_marked(const tk_tokenizer *t, const char *text, size_t len, const tok_range *marks,
                            size_t n_marks, bool add_bos, int32_t *ids, size_t cap, size_t *n_out) {
    *n_out = 0;
    if (!t || (!text && len) || (!marks && n_marks))
        return tk_fail(TK_ERR_INVALID, "tok_encode_marked: NULL argument");
    for (size_t i = 0; i < n_marks; i++)
        if (marks[i].begin >= marks[i].end || marks[i].end > len || (i && marks[i].begin < marks[i - 1].end))
            return tk_fail(TK_ERR_INVALID,
                           "tok_encode_marked: mark %zu [%zu, %zu) is empty, unsorted or past %zu bytes", i,
                           marks[i].begin, marks[i].end, len);
    if (!tok_utf8_valid(text, len))
        return tk_fail(TK_ERR_INVALID, "tok_encode_marked: text is not valid UTF-8");
    out_ids o = {ids, ids ? cap : 0, 0};
    tk_status st = encode_valid(t, text, len, marks, n_marks, add_bos, &o);
    return st ? st : check_fit(&o, cap, n_out);
}
