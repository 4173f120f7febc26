/* The vocabulary: pieces, types, the piece -> id map, BPE merge ranks, added
 * tokens, and what every token decodes to. Shared by both loaders. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "tokenizer/tok_internal.h"

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

tk_status tok_alloc(tok_kind kind, int32_t n_vocab, tk_tokenizer **out) {
    *out = NULL;
    if (n_vocab <= 0 || n_vocab > TOK_MAX_VOCAB)
        return tk_fail(TK_ERR_FORMAT, "tokenizer: vocabulary size %d outside 1..%d", (int)n_vocab,
                       TOK_MAX_VOCAB);
    tk_tokenizer *t = tk_calloc(1, sizeof *t);
    if (!t) return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    t->kind = kind;
    t->n_vocab = n_vocab;
    t->bos = t->eos = t->unk = t->pad = -1;
    for (int i = 0; i < 256; i++) t->byte_tok[i] = -1;
    *out = t;
    return TK_OK;
}

void tok_free(tk_tokenizer *t) {
    if (!t) return;
    tok_free_pre(t);
    tk_free(t->piece_buf);
    tk_free(t->piece_off);
    tk_free(t->dec_buf);
    tk_free(t->dec_off);
    tk_free(t->type);
    tk_free(t->score);
    tk_free(t->map);
    tk_free(t->merge_l);
    tk_free(t->merge_r);
    tk_free(t->pairs);
    tk_free(t->raw_map);
    tk_free(t->byte_pairs);
    tk_free(t->nfc_inert);
    tk_free(t->whole_ok);
    tk_free(t->added);
    tk_free(t->chat_template);
    tk_free(t);
}

static inline const char *piece_at(const tk_tokenizer *t, int32_t id, size_t *len) {
    *len = (size_t)(t->piece_off[id + 1] - t->piece_off[id]);
    return t->piece_buf + t->piece_off[id];
}

tk_status tok_set_pieces(tk_tokenizer *t, const char *const *pieces, const size_t *lens,
                         const uint8_t *types) {
    uint64_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (lens[i] > TOK_MAX_PIECE)
            return tk_fail(TK_ERR_FORMAT, "tokenizer: token %d is %zu bytes (limit %d)", (int)i, lens[i],
                           TOK_MAX_PIECE);
        if (types[i] < TOK_TYPE_NORMAL || types[i] > TOK_TYPE_BYTE)
            return tk_fail(TK_ERR_FORMAT, "tokenizer: token %d has type %d, expected 1..6", (int)i,
                           (int)types[i]);
        total += lens[i];
    }
    t->piece_buf = tk_malloc(total + 1);
    t->piece_off = tk_calloc((size_t)t->n_vocab + 1, sizeof *t->piece_off);
    t->type = tk_malloc((size_t)t->n_vocab);
    t->map_cap = pow2_at_least((uint64_t)t->n_vocab * 2);
    t->map = tk_malloc(t->map_cap * sizeof *t->map);
    if (!t->piece_buf || !t->piece_off || !t->type || !t->map)
        return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    memset(t->map, 0xff, t->map_cap * sizeof *t->map);
    uint64_t off = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (lens[i]) memcpy(t->piece_buf + off, pieces[i], lens[i]);
        t->piece_off[i] = off;
        off += lens[i];
        t->type[i] = types[i];
    }
    t->piece_off[t->n_vocab] = off;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t n;
        const char *p = piece_at(t, i, &n);
        if (n == 0) continue; /* holes in a sparse vocabulary */
        uint64_t mask = t->map_cap - 1, h = tok_hash(p, n) & mask;
        for (;; h = (h + 1) & mask) {
            int32_t j = t->map[h];
            if (j < 0) {
                t->map[h] = i;
                break;
            }
            size_t m;
            const char *q = piece_at(t, j, &m);
            if (m == n && !memcmp(p, q, n)) { /* duplicate piece: the later id wins, as in llama.cpp */
                t->map[h] = i;
                break;
            }
        }
    }
    return TK_OK;
}

int32_t tok_find(const tk_tokenizer *t, const char *s, size_t len) {
    if (!t->map || len == 0) return -1;
    uint64_t mask = t->map_cap - 1, h = tok_hash(s, len) & mask;
    for (;; h = (h + 1) & mask) {
        int32_t j = t->map[h];
        if (j < 0) return -1;
        size_t m;
        const char *q = piece_at(t, j, &m);
        if (m == len && !memcmp(s, q, len)) return j;
    }
}

tk_status tok_set_merges(tk_tokenizer *t, int64_t n, const char *const *l, const size_t *llen,
                         const char *const *r, const size_t *rlen) {
    if (n < 0 || n > (int64_t)TOK_MAX_VOCAB * 4)
        return tk_fail(TK_ERR_FORMAT, "tokenizer: %lld merges", (long long)n);
    t->n_merges = n;
    if (n == 0) return TK_OK;
    t->merge_l = tk_malloc((size_t)n * sizeof(int32_t));
    t->merge_r = tk_malloc((size_t)n * sizeof(int32_t));
    t->pair_cap = pow2_at_least((uint64_t)n * 2);
    t->pairs = tk_calloc(t->pair_cap, sizeof *t->pairs);
    char *cat = tk_malloc(2 * TOK_MAX_PIECE + 1);
    if (!t->merge_l || !t->merge_r || !t->pairs || !cat) {
        tk_free(cat);
        return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory for %lld merges", (long long)n);
    }
    for (int64_t i = 0; i < n; i++) {
        int32_t a = tok_find(t, l[i], llen[i]), b = tok_find(t, r[i], rlen[i]);
        if (a < 0 || b < 0) {
            tk_free(cat);
            return tk_fail(TK_ERR_FORMAT, "tokenizer: merge %lld names unknown token '%.*s'", (long long)i,
                           (int)(a < 0 ? (llen[i] > 64 ? 64 : llen[i]) : (rlen[i] > 64 ? 64 : rlen[i])),
                           a < 0 ? l[i] : r[i]);
        }
        memcpy(cat, l[i], llen[i]); /* both are vocabulary pieces, so each is <= TOK_MAX_PIECE */
        memcpy(cat + llen[i], r[i], rlen[i]);
        int32_t c = tok_find(t, cat, llen[i] + rlen[i]);
        if (c < 0) {
            tk_free(cat);
            return tk_fail(TK_ERR_FORMAT,
                           "tokenizer: merge %lld ('%.*s' + '%.*s') makes a token not in the vocabulary",
                           (long long)i, (int)(llen[i] > 64 ? 64 : llen[i]), l[i],
                           (int)(rlen[i] > 64 ? 64 : rlen[i]), r[i]);
        }
        t->merge_l[i] = a;
        t->merge_r[i] = b;
        uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1, mask = t->pair_cap - 1;
        for (uint64_t h = tok_mix64(key) & mask;; h = (h + 1) & mask) {
            if (t->pairs[h].key == key) break; /* a repeated merge keeps its first (best) rank */
            if (!t->pairs[h].key) {
                t->pairs[h] = (tok_pair){key, (int32_t)i, c};
                break;
            }
        }
    }
    tk_free(cat);
    return TK_OK;
}

int32_t tok_find_raw(const tk_tokenizer *t, const char *s, size_t len) {
    if (!t->raw_map || len == 0) return -1;
    uint64_t mask = t->raw_cap - 1, h = tok_hash(s, len) & mask;
    for (;; h = (h + 1) & mask) {
        int32_t j = t->raw_map[h];
        if (j < 0) return -1;
        if (t->dec_off[j + 1] - t->dec_off[j] == len && !memcmp(s, t->dec_buf + t->dec_off[j], len)) return j;
    }
}

static tk_status build_raw_map(tk_tokenizer *t) {
    t->raw_cap = pow2_at_least((uint64_t)t->n_vocab * 2);
    t->raw_map = tk_malloc(t->raw_cap * sizeof *t->raw_map);
    if (!t->raw_map) return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    memset(t->raw_map, 0xff, t->raw_cap * sizeof *t->raw_map);
    uint64_t mask = t->raw_cap - 1;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t n = (size_t)(t->dec_off[i + 1] - t->dec_off[i]);
        if (t->type[i] != TOK_TYPE_NORMAL || n == 0) continue;
        const char *p = t->dec_buf + t->dec_off[i];
        for (uint64_t h = tok_hash(p, n) & mask;; h = (h + 1) & mask) {
            int32_t j = t->raw_map[h];
            if (j < 0) {
                t->raw_map[h] = i;
                break;
            }
            /* two normal tokens with the same bytes (a piece that is not byte-level text): keep the first */
            if (t->dec_off[j + 1] - t->dec_off[j] == n && !memcmp(p, t->dec_buf + t->dec_off[j], n)) break;
        }
    }
    return TK_OK;
}

tk_status tok_add_added(tk_tokenizer *t, int32_t id, bool special) {
    if (id < 0 || id >= t->n_vocab)
        return tk_fail(TK_ERR_FORMAT, "tokenizer: added token id %d outside 0..%d", (int)id,
                       (int)t->n_vocab - 1);
    size_t n;
    const char *p = piece_at(t, id, &n);
    if (n == 0) return TK_OK;
    for (size_t i = 0; i < n;) { /* text is split at matches, so a match must not cut a character */
        uint32_t cp;
        int k = tok_utf8_next((const unsigned char *)p + i, n - i, &cp);
        if (k <= 0) return TK_OK; /* never matched in text; still decodes as its bytes */
        i += (size_t)k;
    }
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id == id) {
            t->added[i].special = special;
            return TK_OK;
        }
    if (t->n_added % 64 == 0) {
        tok_added *a = tk_realloc(t->added, ((size_t)t->n_added + 64) * sizeof *a);
        if (!a) return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
        t->added = a;
    }
    t->added[t->n_added++] = (tok_added){id, special};
    return TK_OK;
}

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest are
 * shifted to U+0100.. so every byte has a visible character. */
static uint32_t byte_to_cp(int b) {
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) return (uint32_t)b;
    int n = 0;
    for (int i = 0; i < b; i++)
        if (!((i >= 0x21 && i <= 0x7e) || (i >= 0xa1 && i <= 0xac) || (i >= 0xae && i <= 0xff))) n++;
    return 256u + (uint32_t)n;
}

static int put_utf8(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

static int cmp_added(const void *pa, const void *pb, void *ctx) {
    const tk_tokenizer *t = ctx;
    const tok_added *a = pa, *b = pb;
    uint64_t la = t->piece_off[a->id + 1] - t->piece_off[a->id],
             lb = t->piece_off[b->id + 1] - t->piece_off[b->id];
    if (la != lb) return la > lb ? -1 : 1; /* longest first: HF's leftmost-longest match */
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Characters NFC cannot change, whatever comes after them: no canonical
 * decomposition, combining class 0, and never the second half of a composition
 * (utf8proc marks those with comb_index >= 0x8000). Hangul vowel and trailing
 * jamo compose algorithmically, so they are excluded by range. A character
 * that could compose with an inert one before it is itself not inert, so its
 * presence still sends the text through utf8proc. */
static tk_status build_nfc_inert(tk_tokenizer *t) {
    t->nfc_inert = tk_calloc(TOK_NFC_SPAN / 8, 1);
    if (!t->nfc_inert) return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    for (uint32_t cp = 0; cp < TOK_NFC_SPAN; cp++) {
        if (cp >= 0xd800 && cp <= 0xdfff) continue;
        if (cp >= 0x1160 && cp <= 0x11ff) continue;
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        bool canon_decomp = p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0;
        bool second = p->comb_index != UINT16_MAX && p->comb_index >= 0x8000;
        if (p->combining_class == 0 && !canon_decomp && !second)
            t->nfc_inert[cp >> 3] |= (uint8_t)(1u << (cp & 7));
    }
    return TK_OK;
}

static bool is_hidden_type(int ty) { return ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN; }

/* Byte-level decode of one piece: every character must be one of the 256
 * byte characters, else the piece's own bytes are used (HF ByteLevel decoder). */
static size_t decode_bpe_piece(const int16_t *cp_byte, const char *p, size_t n, char *o) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int m = tok_utf8_next((const unsigned char *)p + i, n - i, &cp);
        if (m <= 0 || cp >= 0x144 || cp_byte[cp] < 0) {
            memcpy(o, p, n);
            return n;
        }
        o[k++] = (char)cp_byte[cp];
        i += (size_t)m;
    }
    return k;
}

static const char *const EOG_NAMES[] = {"<|im_end|>", "<|endoftext|>",   "<|eot_id|>",
                                        "<|eom_id|>", "<|end_of_text|>", "</s>",
                                        "<|end|>",    "<end_of_turn>",   "<|return|>"};

tk_status tok_finish(tk_tokenizer *t) {
    int16_t cp_byte[0x144];
    for (int i = 0; i < 0x144; i++) cp_byte[i] = -1;
    if (t->kind == TOK_KIND_BPE) {
        for (int b = 0; b < 256; b++) {
            char u[4];
            uint32_t cp = byte_to_cp(b);
            cp_byte[cp] = (int16_t)b;
            int32_t id = tok_find(t, u, (size_t)put_utf8(cp, u));
            if (id < 0)
                return tk_fail(TK_ERR_FORMAT, "tokenizer: byte-level vocabulary has no token for byte 0x%02x",
                               b);
            t->byte_tok[b] = id;
        }
    } else {
        for (int b = 0; b < 256; b++) {
            char name[8];
            static const char hex[] = "0123456789ABCDEF";
            memcpy(name, "<0x", 3);
            name[3] = hex[b >> 4];
            name[4] = hex[b & 15];
            name[5] = '>';
            t->byte_tok[b] = tok_find(t, name, 6);
        }
    }

    /* What each token decodes to. */
    uint64_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) total += t->piece_off[i + 1] - t->piece_off[i];
    t->dec_buf = tk_malloc(total + 1);
    t->dec_off = tk_calloc((size_t)t->n_vocab + 1, sizeof *t->dec_off);
    if (!t->dec_buf || !t->dec_off) return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    uint64_t off = 0;
    t->max_piece = 1;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t n;
        const char *p = piece_at(t, i, &n);
        char *o = t->dec_buf + off;
        size_t k = 0;
        int ty = t->type[i];
        if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER || ty == TOK_TYPE_UNKNOWN ||
            ty == TOK_TYPE_UNUSED) {
            memcpy(o, p, n); /* added tokens are stored as plain text */
            k = n;
        } else if (t->kind == TOK_KIND_BPE) {
            k = decode_bpe_piece(cp_byte, p, n, o);
        } else if (ty == TOK_TYPE_BYTE && n == 6 && !memcmp(p, "<0x", 3)) {
            o[0] = (char)strtol((char[]){p[3], p[4], 0}, NULL, 16);
            k = 1;
        } else {
            for (size_t j = 0; j < n;) { /* "▁" (E2 96 81) is a space */
                if (j + 3 <= n && !memcmp(p + j, "\xe2\x96\x81", 3)) {
                    o[k++] = ' ';
                    j += 3;
                } else {
                    o[k++] = p[j++];
                }
            }
        }
        t->dec_off[i] = off;
        off += k;
        if (n > t->max_piece) t->max_piece = n;
        if (k > t->max_piece) t->max_piece = k;
    }
    t->dec_off[t->n_vocab] = off;

    if (t->n_added > 1) qsort_r(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added, t);
    memset(t->added_first, 0, sizeof t->added_first);
    for (int i = 0; i < t->n_added; i++) {
        unsigned char c = (unsigned char)t->piece_buf[t->piece_off[t->added[i].id]];
        t->added_first[c >> 3] |= (uint8_t)(1u << (c & 7));
    }

    /* End of generation: the declared EOS plus the turn/text enders the family uses. */
    t->n_eog = 0;
    if (t->eos >= 0) t->eog[t->n_eog++] = t->eos;
    for (size_t k = 0; k < sizeof EOG_NAMES / sizeof EOG_NAMES[0]; k++) {
        int32_t id = tok_find(t, EOG_NAMES[k], strlen(EOG_NAMES[k]));
        if (id < 0 || id == t->eos || !(is_hidden_type(t->type[id]) || t->type[id] == TOK_TYPE_USER))
            continue;
        if (t->n_eog < TOK_MAX_EOG) t->eog[t->n_eog++] = id;
    }
    if (t->kind == TOK_KIND_BPE) {
        tk_status st = build_raw_map(t);
        if (!st && t->nfc) st = build_nfc_inert(t);
        if (!st && !(t->byte_pairs = tk_malloc(65536 * sizeof *t->byte_pairs)))
            st = tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
        for (int i = 0; !st && i < 65536; i++) {
            const tok_pair *p = tok_pair_find(t, t->byte_tok[i >> 8], t->byte_tok[i & 255]);
            t->byte_pairs[i] = p ? *p : (tok_pair){0, INT32_MAX, -1};
        }
        if (!st) st = tok_compute_whole(t);
        if (!st) st = tok_compile_pre(t);
        return st;
    }
    return TK_OK;
}

/* ---- public accessors ---- */

int tok_n_vocab(const tk_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t tok_bos(const tk_tokenizer *t) { return t->bos; }
int32_t tok_eos(const tk_tokenizer *t) { return t->eos; }

bool tok_is_eog(const tk_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return true;
    return false;
}

const char *tok_piece(const tk_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    size_t n;
    const char *p = piece_at(t, id, &n);
    if (len) *len = n;
    return p;
}

int tok_token_type(const tk_tokenizer *t, int32_t id) {
    return (id < 0 || id >= t->n_vocab) ? 0 : t->type[id];
}
int64_t tok_n_merges(const tk_tokenizer *t) { return t->n_merges; }

void tok_merge(const tk_tokenizer *t, int64_t i, const char **a, size_t *alen, const char **b, size_t *blen) {
    if (i < 0 || i >= t->n_merges) {
        *a = *b = NULL;
        *alen = *blen = 0;
        return;
    }
    *a = piece_at(t, t->merge_l[i], alen);
    *b = piece_at(t, t->merge_r[i], blen);
}

const char *tok_model_name(const tk_tokenizer *t) { return t->model_name; }
const char *tok_pre_name(const tk_tokenizer *t) { return t->pre_name; }
const char *tok_chat_template(const tk_tokenizer *t) { return t->chat_template; }

void tok_build_free(tok_build *b) {
    tk_free(b->pieces);
    tk_free(b->lens);
    tk_free(b->types);
    tk_free(b->ml);
    tk_free(b->mr);
    tk_free(b->mll);
    tk_free(b->mrl);
}
