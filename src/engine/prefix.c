/* The prefix cache (see prefix.h): a hash table of cached blocks chained by
 * bucket, one entry per pool block (an entry is indexed by its block id), the
 * blocks' token ids for the full comparison, and an LRU list of the idle ones. */
#include "engine/prefix.h"

#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

typedef struct pc_entry {
    uint64_t hash, gen;
    uint64_t parent_gen; /* the parent entry's generation when this one was made */
    int parent;          /* the parent's block id; -1: the root */
    int hnext;           /* next entry of the bucket; -1: last */
    int lprev, lnext;    /* the idle list (older, newer); -1: an end */
    bool cached, idle;
} pc_entry;

struct prefix_cache {
    int n_blocks, bs;
    uint64_t seed;
    prefix_hash_fn hash;
    pc_entry *e;    /* (n_blocks) */
    int32_t *toks;  /* (n_blocks, bs) the token ids of each cached block */
    int *bucket;    /* (mask + 1) first entry of each bucket; -1: empty */
    uint64_t mask;  /* buckets - 1 (a power of two >= n_blocks) */
    int old, young; /* the idle list's least and most recently used ends; -1: empty */
    int n_cached, n_idle;
    uint64_t next_gen, evictions, collisions;
};

static uint64_t mix64(uint64_t z) {
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ULL;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t prefix_hash_default(uint64_t parent, const int32_t *tokens, int n) {
    uint64_t h = mix64(parent + 0x9e3779b97f4a7c15ULL);
    for (int i = 0; i < n; i++) h = mix64(h ^ (uint64_t)(uint32_t)tokens[i]);
    return h;
}

uint64_t prefix_seed(uint64_t model_id, tk_kv_type type, tk_kv_scale scale, int block_size) {
    uint64_t h = mix64(model_id ^ 0x70726566697863ULL); /* "prefixc" */
    h = mix64(h ^ (uint64_t)(unsigned)type);
    h = mix64(h ^ (uint64_t)(unsigned)scale);
    return mix64(h ^ (uint64_t)(unsigned)block_size);
}

tk_status prefix_init(int n_blocks, int block_size, uint64_t seed, prefix_cache **out) {
    if (!out) return tk_fail(TK_ERR_INVALID, "prefix cache: out is NULL");
    *out = NULL;
    if (n_blocks < 1 || n_blocks > (1 << 30) || block_size < 1 || block_size > 4096)
        return tk_fail(TK_ERR_INVALID, "prefix cache: %d blocks of %d tokens, expected 1..2^30 of 1..4096",
                       n_blocks, block_size);
    prefix_cache *pc = tk_calloc(1, sizeof *pc);
    if (!pc) return tk_fail(TK_ERR_NOMEM, "prefix cache: out of memory");
    uint64_t nb = 1;
    while (nb < (uint64_t)n_blocks) nb <<= 1;
    pc->n_blocks = n_blocks;
    pc->bs = block_size;
    pc->seed = seed;
    pc->hash = prefix_hash_default;
    pc->mask = nb - 1;
    pc->e = tk_calloc((size_t)n_blocks, sizeof *pc->e);
    pc->toks = tk_calloc((size_t)n_blocks * (size_t)block_size, sizeof *pc->toks);
    pc->bucket = tk_calloc((size_t)nb, sizeof *pc->bucket);
    if (!pc->e || !pc->toks || !pc->bucket) {
        prefix_free(pc);
        return tk_fail(TK_ERR_NOMEM, "prefix cache: out of memory for %d blocks of %d tokens", n_blocks,
                       block_size);
    }
    for (uint64_t i = 0; i < nb; i++) pc->bucket[i] = -1;
    for (int i = 0; i < n_blocks; i++)
        pc->e[i] = (pc_entry){.parent = -1, .hnext = -1, .lprev = -1, .lnext = -1};
    pc->old = pc->young = -1;
    *out = pc;
    return TK_OK;
}

void prefix_free(prefix_cache *pc) {
    if (!pc) return;
    tk_free(pc->e);
    tk_free(pc->toks);
    tk_free(pc->bucket);
    tk_free(pc);
}

void prefix_set_hash(prefix_cache *pc, prefix_hash_fn fn) {
    TK_ASSERT(pc->n_cached == 0); /* entries hashed the old way could never be found again */
    pc->hash = fn ? fn : prefix_hash_default;
}

prefix_link prefix_root(const prefix_cache *pc) { return (prefix_link){.hash = pc->seed, .block = -1}; }

bool prefix_link_valid(const prefix_cache *pc, const prefix_link *link) {
    if (link->block < 0) return true;
    const pc_entry *x = &pc->e[link->block];
    return x->cached && x->gen == link->gen;
}

static const int32_t *toks_of(const prefix_cache *pc, int b) { return pc->toks + (size_t)b * (size_t)pc->bs; }

int prefix_find(prefix_cache *pc, const prefix_link *parent, const int32_t *tokens, prefix_link *next) {
    uint64_t h = pc->hash(parent->hash, tokens, pc->bs);
    for (int b = pc->bucket[h & pc->mask]; b >= 0; b = pc->e[b].hnext) {
        const pc_entry *x = &pc->e[b];
        if (x->hash != h) continue;
        /* The hash is a hint: the tokens and the parent entry decide. */
        bool same_parent = x->parent == parent->block && (parent->block < 0 || x->parent_gen == parent->gen);
        if (!same_parent || memcmp(toks_of(pc, b), tokens, (size_t)pc->bs * sizeof *tokens) != 0) {
            pc->collisions++;
            continue;
        }
        *next = (prefix_link){.hash = h, .block = b, .gen = x->gen};
        return b;
    }
    return -1;
}

void prefix_insert(prefix_cache *pc, const prefix_link *parent, int block, const int32_t *tokens,
                   prefix_link *next) {
    TK_ASSERT(block >= 0 && block < pc->n_blocks && !pc->e[block].cached);
    TK_ASSERT(prefix_link_valid(pc, parent));
    uint64_t h = pc->hash(parent->hash, tokens, pc->bs);
    pc_entry *x = &pc->e[block];
    *x = (pc_entry){.hash = h,
                    .gen = ++pc->next_gen,
                    .parent_gen = parent->gen,
                    .parent = parent->block,
                    .hnext = pc->bucket[h & pc->mask],
                    .lprev = -1,
                    .lnext = -1,
                    .cached = true};
    pc->bucket[h & pc->mask] = block;
    memcpy(pc->toks + (size_t)block * (size_t)pc->bs, tokens, (size_t)pc->bs * sizeof *tokens);
    pc->n_cached++;
    *next = (prefix_link){.hash = h, .block = block, .gen = x->gen};
}

bool prefix_has(const prefix_cache *pc, int block) {
    return block >= 0 && block < pc->n_blocks && pc->e[block].cached;
}

bool prefix_is_idle(const prefix_cache *pc, int block) { return prefix_has(pc, block) && pc->e[block].idle; }

static void lru_unlink(prefix_cache *pc, int b) {
    pc_entry *x = &pc->e[b];
    if (x->lprev >= 0)
        pc->e[x->lprev].lnext = x->lnext;
    else
        pc->old = x->lnext;
    if (x->lnext >= 0)
        pc->e[x->lnext].lprev = x->lprev;
    else
        pc->young = x->lprev;
    x->lprev = x->lnext = -1;
    x->idle = false;
    pc->n_idle--;
}

void prefix_idle(prefix_cache *pc, int block) {
    TK_ASSERT(prefix_has(pc, block) && !pc->e[block].idle);
    pc_entry *x = &pc->e[block];
    x->idle = true;
    x->lprev = pc->young;
    x->lnext = -1;
    if (pc->young >= 0)
        pc->e[pc->young].lnext = block;
    else
        pc->old = block;
    pc->young = block;
    pc->n_idle++;
}

void prefix_busy(prefix_cache *pc, int block) {
    TK_ASSERT(prefix_is_idle(pc, block));
    lru_unlink(pc, block);
}

int prefix_evict(prefix_cache *pc) {
    int b = pc->old;
    if (b < 0) return -1;
    lru_unlink(pc, b);
    pc_entry *x = &pc->e[b];
    int *p = &pc->bucket[x->hash & pc->mask];
    while (*p != b) {
        TK_ASSERT(*p >= 0); /* every cached entry is in its bucket */
        p = &pc->e[*p].hnext;
    }
    *p = x->hnext;
    x->hnext = -1;
    x->cached = false;
    pc->n_cached--;
    pc->evictions++;
    return b;
}

int prefix_n_cached(const prefix_cache *pc) { return pc->n_cached; }
int prefix_n_idle(const prefix_cache *pc) { return pc->n_idle; }
uint64_t prefix_evictions(const prefix_cache *pc) { return pc->evictions; }
uint64_t prefix_collisions(const prefix_cache *pc) { return pc->collisions; }
