/* The scheduler: pure bookkeeping, no model. It owns the running set and the
 * waiting FIFO, reserves KV blocks, and turns them into one step's plan:
 *   1. every running sequence gets the blocks its next tokens need; when the
 *      pool cannot cover them, idle cached blocks are evicted (least recently
 *      used first), then the newest running sequence is preempted (its
 *      blocks freed, its tokens recomputed when it is admitted again);
 *   2. all running decodes (one token each);
 *   3. prefill chunks of running sequences, oldest first, within the budget;
 *   4. waiting sequences admitted first-come-first-served while a batch slot,
 *      budget and the blocks of their whole known sequence are free; with the
 *      prefix cache, the longest cached chain of full blocks that starts the
 *      sequence is shared (read-only) and only the rest is prefilled (at
 *      least the last token, for its logits).
 * Full blocks enter the prefix cache as soon as they fill (sched_advance), so
 * running sequences share them too; a block leaves it only by eviction.
 * The budget is fixed (step_tokens) or time-based: the owner reports each
 * step's measured seconds (sched_observe) and the next budget is the number
 * of tokens that fits the target step time by the fitted step model
 * (sched_cost; sched_budget_tokens, a pure function). Nothing here reads a
 * clock.
 * The engine loop thread owns a sched; nothing here locks or allocates per step. */
#ifndef TK_ENGINE_SCHED_H
#define TK_ENGINE_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/prefix.h"
#include "tokamak.h"

/* Where blocks come from (the KV pool in the engine, a counter in tests).
 * Blocks are reference counted: alloc hands out a block with one holder, free
 * drops one. The prefix cache needs the sharing calls (NULL: no cache). */
struct sched_seq;

typedef struct sched_blocks {
    void *ctx;
    int (*alloc)(void *ctx); /* a block id, or -1 when none is free */
    void (*free)(void *ctx, int block);
    int (*n_free)(void *ctx);
    void (*ref)(void *ctx, int block); /* one more holder */
    int (*refs)(void *ctx, int block); /* holders (0: free) */
    /* Make bt[j] writable: a shared block is copied into a free block, the
     * table's hold on the shared one dropped (backend_block_cow). The
     * scheduler calls it only with a free block in the pool. */
    tk_status (*cow)(void *ctx, int32_t *bt, int j);
    /* Told after seq was preempted (its blocks are back), so the owner can let
     * go of what it keeps beside them (a draft model's KV); may be NULL. */
    void (*preempted)(void *ctx, struct sched_seq *seq);
    /* Copy positions [0, n_slots) of block src into block dst (every layer,
     * scales included); may be NULL. With rewrite_block, a verification's
     * drafts may rescale the block they start in: a copy of its positions
     * taken before the step (the sequence's journal) puts it back after a
     * rejection (sched_spec_settle). */
    void (*copy)(void *ctx, int dst, int src, int n_slots);
} sched_blocks;

/* The time-based step budget (docs/engine.md, "Step budget"). */
typedef struct sched_budget_opts {
    bool adaptive;   /* false: every step's budget is sched_opts.step_tokens */
    double target_s; /* > 0: every step aims at this many seconds; 0: automatic */
    double ratio;    /* automatic: ratio x the step's predicted decode time ... */
    double max_s;    /* ... at most max_s, and max_s when nothing decodes */
    int min_chunk;   /* prefill tokens a step always offers while a prefill waits */
} sched_budget_opts;

/* Measured costs: a step's time modelled as
 *     fixed_s + dec_s x n_decode + pre_s x n_prefill + attn_s x prefill_kpos
 * (prefill_kpos: the positions the step's prefill tokens attend to, over
 * 1,024; sched_prefill_kpos) and fitted over every step by
 * recursive least squares with the four costs >= 0 (docs/engine.md, "Step
 * budget"). A decode step is mostly fixed cost (the weights are read once for
 * all its sequences), so a decode token is not priced alone: a step with 32
 * decodes costs far less than 32 steps with one. A prompt's tokens cost more
 * the further in they are (each attends to every earlier one): at 2,048
 * positions ~3x its first tokens on a CPU, which a per-token prefill cost
 * would blame on the decodes beside it.
 * Old steps are forgotten only along what new ones tell (a run of equal mixed
 * steps does not erase what decode-only steps said about the decodes); where
 * no step told the parts apart a weak prior decides: the fixed part takes a
 * decode step, the per-token parts a prefill chunk. */
typedef struct sched_cost {
    double fixed_s;   /* per step, whatever it holds */
    double dec_s;     /* per decode token on top */
    double pre_s;     /* per prefill token on top; 0 until a step with prefill ran */
    double attn_s;    /* per 1,024 positions attended to (summed over the prefill tokens) */
    int last_prefill; /* prefill tokens of the last step that had any (growth is at most 2x) */
    /* The fit's normal equations, info x (fixed_s, dec_s, pre_s, attn_s) =
     * rhs, over steps with x = (1, n_decode, n_prefill, prefill_kpos) (info
     * row-major); w, w_pre: the decayed count of steps and of steps with
     * prefill (0: none seen). */
    double info[16], rhs[4], w, w_pre;
} sched_cost;

/* How much of the past a step keeps (along its own direction): ~10 steps of
 * memory, SCHED_COST_KEEP_LONG when the step ran longer than SCHED_COST_LONG
 * x its prediction, so a step that ran long is corrected at once (the tail is
 * what the budget protects) and one that ran short over a few. The prior
 * weighs SCHED_COST_PRIOR of a step: it adds SCHED_COST_PRIOR x (fixed_s^2 +
 * 100 dec_s^2 + pre_s^2 + attn_s^2) to the squares. */
#define SCHED_COST_KEEP      0.9
#define SCHED_COST_KEEP_LONG 0.5
#define SCHED_COST_LONG      1.25
#define SCHED_COST_PRIOR     0.01

typedef struct sched_opts {
    int block_size;
    int ctx;              /* most positions of one sequence */
    int n_blocks;         /* blocks in the pool */
    int max_batch;        /* running sequences */
    int step_tokens;      /* fixed token budget of a step, or the cap of the time-based one (>= max_batch) */
    bool no_chunking;     /* a prompt is prefilled whole, in one step */
    bool static_batching; /* admit only when nothing runs */
    sched_budget_opts budget;
    /* The prefix cache (prefix.h): full blocks are kept by content after their
     * sequence lets go and shared with sequences whose tokens start the same. */
    bool prefix_cache;
    uint64_t prefix_seed; /* the chain's root hash (prefix_seed) */
    /* The KV type rewrites a block from its first slot when a position in it is
     * written again (INT8 with per-head scales, backend_rewrite_from): a
     * sequence found cached in full then recomputes its whole last block, not
     * only its last token into a copy of the block. */
    bool rewrite_block;
} sched_opts;

enum { SCHED_FREE = 0, SCHED_WAITING, SCHED_RUNNING };
enum { SCHED_CAUSE_NONE = 0, SCHED_CAUSE_NO_BLOCKS, SCHED_CAUSE_BEHIND_PREFILL, SCHED_CAUSE_PREEMPTED };

/* One sequence, embedded by the engine in its request. Fields are read-only
 * outside sched.c except n_tokens, which the owner raises as tokens are
 * sampled, and tokens, which the owner sets before sched_add. */
typedef struct sched_seq {
    uint64_t order;        /* arrival number: FCFS, and "newest" for preemption */
    const int32_t *tokens; /* (n_tokens) the known tokens, for the prefix cache (owner's; may be
                            * NULL without it) */
    int n_tokens;          /* tokens known so far (prompt + output) */
    int n_computed;        /* tokens whose K/V are in the cache */
    int n_blocks;          /* blocks held */
    int32_t *bt;           /* (bt_cap) block table: ids in position order */
    int bt_cap;            /* ceil(ctx / block_size) */
    int state;             /* SCHED_FREE/WAITING/RUNNING */
    int cause;             /* why it waits (SCHED_CAUSE_*) after the last plan */
    bool preempted;        /* waiting to be recomputed */
    int n_preempted;       /* times preempted */
    int n_hit;             /* tokens the prefix cache held at the last admission */
    /* Speculative decoding: draft tokens the owner wrote at tokens[n_tokens,
     * n_tokens + n_draft) for the next plan to verify after the sequence's
     * decode token (the owner sets it before sched_plan_step, which consumes
     * it: it may cut it, to 0 when blocks or the step cap are short). */
    int n_draft;
    /* The block of journal_pos as it was before this step's verification
     * wrote drafts into it (rewrite_block and a free block in the pool; -1:
     * none): sched_plan_step takes it, sched_spec_settle puts it back or drops
     * it. */
    int journal;
    int journal_pos;
    /* The prefix chain of the blocks [0, pc_n): cached (matched, or cached by
     * this sequence when they filled) or equal to a cached block; pc_off once
     * the chain's last entry was evicted (nothing later can be found). */
    prefix_link pc;
    int pc_n;
    bool pc_off;
    struct sched_seq *prev, *next;
} sched_seq;

typedef struct sched_item {
    sched_seq *seq;
    int pos0;         /* first position fed this step (= n_computed) */
    int n;            /* tokens fed */
    bool want_logits; /* the chunk reaches the end of the known tokens */
    int n_draft;      /* of n, draft tokens verified after the decode token (logits: n_draft + 1) */
} sched_item;

/* A decode: one known token reaching the end (plus its drafts, if any). A
 * prompt's last token that a chunk left alone is one too. */
static inline bool sched_item_is_decode(const sched_item *it) {
    return it->want_logits && it->n - it->n_draft == 1;
}

typedef struct sched_plan {
    int n_items;
    int n_tok;           /* sum of items[].n */
    double prefill_kpos; /* positions the prefill tokens attend to, / 1024 (sched_prefill_kpos) */
    int n_decode;        /* items that are decodes (a token, plus its drafts if any) */
    int n_draft;         /* draft tokens of the decodes (sum of items[].n_draft) */
    int n_preempted;     /* preemptions made while planning this step */
    int budget;          /* tokens this step could hold (decodes included) */
    double target_s;     /* the step time the budget aimed at; 0 for a fixed budget */
    sched_item *items;   /* (max_batch) owned by the sched */
} sched_plan;

typedef struct sched_counts {
    int running, waiting;
    int waiting_no_blocks, waiting_behind_prefill, waiting_preempted;
    int blocks_total, blocks_used, blocks_peak; /* used: held by sequences (a shared block once) */
    uint64_t preemptions;
    /* After rejected drafts (rewrite_block): blocks put back from their
     * journal, and known positions fed again (sched_spec_settle). */
    uint64_t spec_restores, spec_refed;
    /* The prefix cache: on, tokens looked up at admission and found cached,
     * blocks cached (busy or idle), idle blocks, and evictions. */
    bool prefix_cache;
    uint64_t prefix_query_tokens, prefix_hit_tokens, prefix_evictions, prefix_collisions;
    int prefix_blocks, prefix_idle;
    int budget; /* the last plan's budget and target (see sched_plan) */
    double target_s;
    sched_cost cost; /* the current estimates */
} sched_counts;

typedef struct sched sched;

/* Validates the options (block size, budget >= max_batch, a pool that holds
 * at least one full context, budget parameters) with messages naming both numbers. */
tk_status sched_init(const sched_opts *o, const sched_blocks *blocks, sched **out);
void sched_free(sched *s);
/* Most tokens one plan can hold (the forward's max_tokens): step_tokens (the
 * fixed budget or the time-based budget's cap), or step_tokens + ctx without
 * chunking (a whole prompt goes in one step). */
int sched_max_step_tokens(const sched_opts *o);
/* Blocks that cover n positions. */
int sched_blocks_for(const sched *s, int n);

/* Queue seq (n_tokens > 0 and <= ctx set by the caller) at the back of the
 * waiting FIFO with arrival number order. Allocates its block table. */
tk_status sched_add(sched *s, sched_seq *seq, uint64_t order);
/* Take seq out (finished or cancelled): its blocks go back to the pool at once. */
void sched_remove(sched *s, sched_seq *seq);
/* Plan one step. The plan stays valid until the next sched_* call. */
const sched_plan *sched_plan_step(sched *s);
/* The plan ran: every item's n_computed += n. Positions of draft tokens are
 * computed but not yet known: sched_spec_settle says which stay. */
void sched_advance(sched *s, const sched_plan *p);
/* After a decode with drafts ran and its owner took the accepted tokens
 * (n_tokens raised for each): the KV of positions [0, n_keep) is that of known
 * tokens, the rest is dropped. Blocks past n_tokens go back to the pool. With
 * a KV type that rewrites a block from its first slot (rewrite_block), a
 * dropped draft that shared a block with position n_keep - 1 may have changed
 * the block's scales: when the step began in that block and its journal was
 * taken, the block is put back as it was and the step's kept positions are
 * computed again (the next plan prefills them: at most the drafts + 1);
 * otherwise the block is computed again from its first slot. Blocks enter
 * the prefix cache only once their positions are known, so no cached block
 * ever held a draft. */
void sched_spec_settle(sched *s, sched_seq *seq, int n_keep);
/* The rollback rule of sched_spec_settle and of the draft model's KV
 * (drafter_settle): where a sequence whose KV ran past n_keep feeds again
 * from, for the KV of [0, n_keep) to be that of a run that never wrote the
 * rest. n_keep; with a KV type that rewrites a block from its first slot
 * (rewrite) and n_keep inside a block, the position of a copy of that block
 * taken before the dropped positions were written (copy_pos: the copy holds
 * the block's positions before it; -1: none), *restore then set (put the
 * copy back first), else the block's first position. */
int sched_rollback_to(int n_keep, int block_size, bool rewrite, int copy_pos, bool *restore);
/* The running sequences, oldest first (iterate with ->next); NULL when none. */
sched_seq *sched_running(const sched *s);
/* The step of plan p took seconds: update the cost estimates. Reads only
 * p's counts (n_tok, n_decode, n_draft, prefill_kpos), so its items may have been removed since;
 * call it before the next sched_plan_step. */
void sched_observe(sched *s, const sched_plan *p, double seconds);
void sched_counts_get(const sched *s, sched_counts *out);
/* True while anything is running or waiting. */
bool sched_busy(const sched *s);
/* Replace the prefix cache's chain hash (tests force collisions with a constant
 * one); only before the first sequence is added. No-op without the cache. */
void sched_set_prefix_hash(sched *s, prefix_hash_fn fn);

/* ---- the budget, as pure functions (tested without a clock) ---------------- */

/* The positions n prefill tokens from position pos0 on attend to (each its
 * own and every earlier one), / 1024. */
double sched_prefill_kpos(int pos0, int n);
/* Fold one step (n_decode decode tokens, n_prefill prefill tokens attending
 * to prefill_kpos x 1,024 positions, seconds) into c and refit the costs. */
void sched_cost_observe(sched_cost *c, int n_decode, int n_prefill, double prefill_kpos, double seconds);
/* The predicted time of a step with n_decode decodes and no prefill; 0 before
 * any step was seen. */
double sched_cost_decode_s(const sched_cost *c, int n_decode);
/* The step time a step with n_decode decodes aims at (seconds): target_s if
 * set, else max_s with no decodes, else min(max_s, ratio x predicted decode time). */
double sched_budget_target(const sched_budget_opts *b, const sched_cost *c, int n_decode);
/* Tokens a step with n_decode decodes may hold, decodes included: n_decode +
 * the prefill tokens that fit the target at the measured costs (the chunk
 * priced from position pos0, where the step's first prefill token is), at
 * least min_chunk, at most twice the last step's prefill (or min_chunk), and
 * never more than cap. Until a step with prefill was seen the prefill share
 * is min_chunk. */
int sched_budget_tokens(const sched_budget_opts *b, const sched_cost *c, int cap, int n_decode, int pos0);

#endif
