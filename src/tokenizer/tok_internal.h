/* Private to src/tokenizer/: the tokenizer struct, its hash maps, and the steps
 * the loaders share. Nothing outside this directory includes it. */
#ifndef TK_TOKENIZER_INTERNAL_H
#define TK_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* A BPE merge: (left << 32 | right) + 1 (0 = empty slot), its rank, and its result. */
typedef struct tok_pair {
    uint64_t key;
    int32_t rank, out;
} tok_pair;

static inline uint64_t tok_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Hash of a byte string, eight bytes at a time (the vocabulary maps and the
 * encoder's word cache all use it). */
static inline uint64_t tok_hash(const char *s, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        __builtin_memcpy(&v, s, 8);
        h = (h ^ tok_mix64(v)) * 0x100000001b3ull;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)(unsigned char)s[i] << (8 * i);
    return tok_mix64(h ^ v);
}

/* GGUF tokenizer.ggml.token_type values. */
enum {
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6
};

typedef enum tok_kind {
    TOK_KIND_BPE = 0 /* byte-level (gpt2) */,
    TOK_KIND_SPM = 1 /* SentencePiece (llama) */
} tok_kind;

/* Limits that keep a hostile file from asking for absurd memory. */
#define TOK_MAX_VOCAB      (1 << 24)
#define TOK_MAX_PIECE      4096         /* bytes in one token */
#define TOK_MAX_JSON       (1ull << 30) /* bytes of tokenizer.json */
#define TOK_MAX_JSON_DEPTH 64
#define TOK_MAX_EOG        16
#define TOK_NFC_SPAN       0x30000 /* code points covered by nfc_inert */

/* An added token matched in text before the model sees it (special or user-defined). */
typedef struct tok_added {
    int32_t id;
    bool special; /* hidden in decode unless asked; matched only with parse_special */
} tok_added;

struct tk_tokenizer {
    tok_kind kind;
    int32_t n_vocab;
    /* Pieces as stored in the vocabulary ("Ġthe", "▁the", "<0x0A>"), concatenated. */
    char *piece_buf;     /* (piece_off[n_vocab]) */
    uint64_t *piece_off; /* (n_vocab + 1) */
    /* What each token decodes to (raw bytes; added tokens: their text). */
    char *dec_buf;     /* (dec_off[n_vocab]) */
    uint64_t *dec_off; /* (n_vocab + 1) */
    uint8_t *type;     /* (n_vocab) TOK_TYPE_* */
    float *score;      /* (n_vocab) SPM merge scores; NULL for BPE */
    size_t max_piece;  /* longest piece or decoded text, bytes */

    /* piece -> id: open addressing, slots hold id or -1. */
    int32_t *map;     /* (map_cap) */
    uint64_t map_cap; /* power of two */

    /* BPE merges in rank order, as token ids, and (left, right) -> rank and result. */
    int64_t n_merges;
    int32_t *merge_l, *merge_r; /* (n_merges) the pair each merge joins, for tok_merge */
    struct tok_pair *pairs;     /* (pair_cap) open addressing; one cache line answers a lookup */
    uint64_t pair_cap;
    bool ignore_merges; /* a whole word found in the vocab skips merging (Llama-3) */

    /* Raw bytes -> id over normal tokens (BPE), and whether BPE of a token's own
     * bytes gives back that token: then a word found here needs no merging. */
    int32_t *raw_map; /* (raw_cap) */
    uint64_t raw_cap;
    uint8_t *whole_ok; /* (n_vocab) */

    tok_pair *byte_pairs;  /* (65536) BPE: merge of (byte_tok[a], byte_tok[b]) at [a << 8 | b] */
    int32_t byte_tok[256]; /* BPE: id of each byte's character; SPM: <0xXX> id or -1 */

    /* Added tokens matched before the model, longest content first. */
    tok_added *added; /* (n_added) */
    int n_added;
    uint8_t added_first[32]; /* bitset of first bytes of added tokens (fast skip) */

    void *re;      /* pcre2_code_8 *: the pre-tokenizer (BPE only) */
    void *re_gctx; /* pcre2_general_context_8 * (counted allocation) */

    bool nfc;           /* NFC-normalise text between added tokens (Qwen2) */
    uint8_t *nfc_inert; /* (TOK_NFC_SPAN / 8) bit set: NFC leaves this character alone whatever follows */
    bool add_bos, add_space_prefix;
    int32_t bos, eos, unk, pad;
    int32_t eog[TOK_MAX_EOG];
    int n_eog;

    char model_name[16];
    char pre_name[32];
    char *chat_template; /* NUL-terminated, or NULL */
};

/* ---- vocab.c: building and looking up ---- */
tk_status tok_alloc(tok_kind kind, int32_t n_vocab, tk_tokenizer **out);
/* Set id's piece (copied) and type; call for every id once, in id order, before tok_finish. */
tk_status tok_set_pieces(tk_tokenizer *t, const char *const *pieces, const size_t *lens,
                         const uint8_t *types);
int32_t tok_find(const tk_tokenizer *t, const char *s, size_t len); /* -1 on a miss */
/* Merges given as piece strings; every name must be a token and so must a+b. */
tk_status tok_set_merges(tk_tokenizer *t, int64_t n, const char *const *l, const size_t *llen,
                         const char *const *r, const size_t *rlen);
/* The merge of (l, r): its entry, or NULL. Inline: it is the BPE inner loop. */
static inline const tok_pair *tok_pair_find(const tk_tokenizer *t, int32_t l, int32_t r) {
    if (!t->pairs) return NULL;
    uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1, mask = t->pair_cap - 1;
    for (uint64_t h = tok_mix64(key) & mask;; h = (h + 1) & mask) {
        const tok_pair *p = &t->pairs[h];
        if (p->key == key) return p;
        if (!p->key) return NULL;
    }
}
static inline void tok_pair_prefetch(const tk_tokenizer *t, int32_t l, int32_t r) {
    uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
    if (t->pairs) __builtin_prefetch(&t->pairs[tok_mix64(key) & (t->pair_cap - 1)]);
}
/* Raw bytes of a normal token -> id (BPE), -1 on a miss. */
int32_t tok_find_raw(const tk_tokenizer *t, const char *s, size_t len);
/* Register an added token (matched in text before BPE). */
tk_status tok_add_added(tk_tokenizer *t, int32_t id, bool special);
/* After pieces, merges, added tokens and the pre-tokenizer name are set: decoded
 * text, byte tables, regex, EOG set. */
tk_status tok_finish(tk_tokenizer *t);

/* ---- encode.c ---- */
/* Fill t->whole_ok: for each normal token, does BPE of its bytes give itself? */
tk_status tok_compute_whole(tk_tokenizer *t);

/* ---- pretok.c: the pre-tokenizer regexes ---- */
/* A known regex (from tokenizer.json) -> its pre name ("qwen2", "llama-bpe", "gpt2"), or NULL. */
const char *tok_pre_from_regex(const char *regex);
tk_status tok_compile_pre(tk_tokenizer *t); /* by t->pre_name */
void tok_free_pre(tk_tokenizer *t);

/* A byte range [begin, end) of a text. */
typedef struct tok_range {
    size_t begin, end;
} tok_range;

/* tok_encode for text assembled from trusted and untrusted parts (the chat
 * formatter): special tokens match only inside marks (sorted, disjoint,
 * non-empty), the format's own markers; everywhere else they are text.
 * Non-special added tokens match anywhere, but no added token straddles a
 * mark's boundary. text must be valid UTF-8 (TK_ERR_INVALID otherwise: repair
 * each untrusted part with tok_utf8_repair as it is appended). */
tk_status tok_encode_marked(const tk_tokenizer *t, const char *text, size_t len, const tok_range *marks,
                            size_t n_marks, bool add_bos, int32_t *ids, size_t cap, size_t *n_out);

/* ---- utf8 (encode.c) ---- */
bool tok_utf8_valid(const char *text, size_t len);
/* text with each invalid maximal subpart replaced by U+FFFD, written to out
 * (room for 3 * len bytes); returns the bytes written. */
size_t tok_utf8_repair(const char *text, size_t len, char *out);
/* The sequence at s[0..n): > 0 a valid character of that many bytes (*cp set);
 * -k an invalid maximal subpart of k bytes (Unicode's "maximal subpart" rule:
 * replace those k bytes by one U+FFFD); 0 a valid but unfinished prefix (all
 * n bytes, n < needed). n must be >= 1. */
int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);

/* What a loader collects before the vocabulary is built (pointers into the
 * source file or JSON; the arrays are owned). Shared by the GGUF and JSON loaders. */
typedef struct tok_build {
    const char **pieces;   /* (n) */
    size_t *lens;          /* (n) */
    uint8_t *types;        /* (n) */
    const char **ml, **mr; /* (n_merges) */
    size_t *mll, *mrl;     /* (n_merges) */
} tok_build;

void tok_build_free(tok_build *b);

#endif
