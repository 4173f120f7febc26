/* The prefix cache: full KV blocks addressed by their content, so a new
 * sequence whose prompt starts like an earlier one reuses that KV instead of
 * prefilling it. Pure bookkeeping over block ids (the scheduler holds the
 * blocks and their reference counts); nothing here allocates after init.
 *
 * A cached block is named by a chain hash: hash(parent's hash, its
 * block_size token ids), whose root is a seed made from everything else that
 * decides the KV (model, KV type, scale mode, block size). A hash is only a
 * hint: a lookup trusts an entry only when its tokens equal the asked ones
 * and its parent is the very entry matched one block before (block id and
 * generation), so the whole prefix is compared token by token and a hash
 * collision can never hand out the wrong KV.
 *
 * Only FULL blocks are cached: they are never written again, which matters
 * for INT8 KV with per-head scales, where a token appended to a block can
 * grow its channel scales and requantize its earlier values.
 *
 * Cached blocks that no sequence holds are "idle" and sit on an LRU list; the
 * scheduler evicts from its old end when the pool runs short, before it
 * preempts anyone. One thread at a time (the engine loop). */
#ifndef TK_ENGINE_PREFIX_H
#define TK_ENGINE_PREFIX_H

#include <stdbool.h>
#include <stdint.h>

#include "tokamak.h"

/* A chain hash of one block after its parent's; tests swap in a constant one
 * to force collisions. */
typedef uint64_t (*prefix_hash_fn)(uint64_t parent, const int32_t *tokens, int n);

/* Where a sequence's chain stands: the hash of its blocks so far and the
 * cached entry of the last one (block -1: the root, no block yet). */
typedef struct prefix_link {
    uint64_t hash;
    int block;
    uint64_t gen; /* the entry's generation: a re-cached block id is another entry */
} prefix_link;

typedef struct prefix_cache prefix_cache;

/* A cache for a pool of n_blocks blocks of block_size tokens; seed is the root
 * hash (prefix_seed). Sizes everything once. */
tk_status prefix_init(int n_blocks, int block_size, uint64_t seed, prefix_cache **out);
/* Frees the table only: the caller drops the blocks' holds first (prefix_evict
 * until -1). NULL: no-op. */
void prefix_free(prefix_cache *pc);

/* The root hash for KV made by model_id with this KV type, scale mode and block size. */
uint64_t prefix_seed(uint64_t model_id, tk_kv_type type, tk_kv_scale scale, int block_size);
/* The default chain hash (64-bit, over the parent hash and the token ids). */
uint64_t prefix_hash_default(uint64_t parent, const int32_t *tokens, int n);
/* Replace the chain hash (NULL: the default). Only while the cache is empty. */
void prefix_set_hash(prefix_cache *pc, prefix_hash_fn fn);

/* The link before a sequence's first block. */
prefix_link prefix_root(const prefix_cache *pc);
/* Whether the entry link names is still cached (the root always is). */
bool prefix_link_valid(const prefix_cache *pc, const prefix_link *link);

/* The cached block that follows parent and holds tokens (block_size of them):
 * its id, with *next its link; -1 when none does. */
int prefix_find(prefix_cache *pc, const prefix_link *parent, const int32_t *tokens, prefix_link *next);
/* Cache block (full, never written again, not cached yet) after parent with
 * these tokens, as a busy entry (a sequence holds it); *next is its link.
 * The caller gives the cache its own hold on the block (a reference). */
void prefix_insert(prefix_cache *pc, const prefix_link *parent, int block, const int32_t *tokens,
                   prefix_link *next);

bool prefix_has(const prefix_cache *pc, int block);
bool prefix_is_idle(const prefix_cache *pc, int block);
/* A cached block's last sequence holder let go: it becomes idle, the most
 * recently used. Sequences release their blocks last to first, so a chain's
 * tail is evicted before its head (a head without its tail still matches;
 * a tail without its head never does). */
void prefix_idle(prefix_cache *pc, int block);
/* A sequence took an idle cached block: it is no longer evictable. */
void prefix_busy(prefix_cache *pc, int block);
/* Take the least recently used idle block out of the cache: its id (the caller
 * drops the cache's hold, which frees it), or -1 when no block is idle. */
int prefix_evict(prefix_cache *pc);

int prefix_n_cached(const prefix_cache *pc); /* blocks in the cache, busy or idle */
int prefix_n_idle(const prefix_cache *pc);   /* cached blocks no sequence holds */
uint64_t prefix_evictions(const prefix_cache *pc);
/* Entries whose hash matched a lookup but whose tokens or parent did not. */
uint64_t prefix_collisions(const prefix_cache *pc);

#endif
