/* A fake KV block pool for engine tests over a fake forward (the includer
 * defines FBS, the block size, and writes the step): reference-counted blocks
 * whose slots hold the token written there (-1: none; a freed block's slots
 * are cleared), and a failure code for any misuse (a bad free, a stale read,
 * a write into a shared block, which the step reports with fake_fail).
 * Include after cmocka.h. */
#ifndef TK_TEST_FAKE_POOL_H
#define TK_TEST_FAKE_POOL_H

#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "core/alloc.h"

typedef struct fake {
    int n_blocks, n_free;
    int *free_ids;  /* (n_blocks) */
    int *refs;      /* (n_blocks) holders */
    int32_t *store; /* (n_blocks, FBS) the token at each slot, -1 if none */
    /* What a step keeps beside the tokens, copied and cleared with them: a
     * value per slot and per block (a step that models a KV type whose
     * stores rewrite a block's earlier slots, as INT8 per-head scales do). */
    uint32_t *mark, *bmark;
    _Atomic int fail; /* a bad batch, a write into a shared block, a stale read, a bad free */
    _Atomic int step_us,
        tok_us;   /* sleep per step and per token of a step (a machine whose steps cost time) */
    int n_copies; /* block copies made */
} fake;

static void fake_fail(fake *f, int why) {
    if (!f->fail) f->fail = why;
}

static int f_alloc(void *c) {
    fake *f = c;
    if (!f->n_free) return -1;
    int b = f->free_ids[--f->n_free];
    if (f->refs[b]) fake_fail(f, 1);
    f->refs[b] = 1;
    for (int i = 0; i < FBS; i++) f->store[(size_t)b * FBS + i] = -1, f->mark[(size_t)b * FBS + i] = 0;
    f->bmark[b] = 0;
    return b;
}
static void f_free(void *c, int b) {
    fake *f = c;
    if (b < 0 || b >= f->n_blocks || f->refs[b] <= 0) {
        fake_fail(f, 2);
        return;
    }
    if (--f->refs[b] == 0) {
        for (int i = 0; i < FBS; i++) /* a freed block's KV is gone */
            f->store[(size_t)b * FBS + i] = -1, f->mark[(size_t)b * FBS + i] = 0xdead;
        f->bmark[b] = 0xdead;
        f->free_ids[f->n_free++] = b;
    }
}
static int f_n_free(void *c) { return ((fake *)c)->n_free; }
static void f_ref(void *c, int b) {
    fake *f = c;
    if (b < 0 || b >= f->n_blocks || f->refs[b] <= 0)
        fake_fail(f, 3);
    else
        f->refs[b]++;
}
static int f_refs(void *c, int b) { return ((fake *)c)->refs[b]; }
static void f_copy(void *c, int dst, int src, int n_slots) {
    fake *f = c;
    if (f->refs[dst] <= 0 || f->refs[src] <= 0 || n_slots < 0 || n_slots > FBS) fake_fail(f, 4);
    memcpy(f->store + (size_t)dst * FBS, f->store + (size_t)src * FBS, (size_t)n_slots * sizeof *f->store);
    memcpy(f->mark + (size_t)dst * FBS, f->mark + (size_t)src * FBS, (size_t)n_slots * sizeof *f->mark);
    f->bmark[dst] = f->bmark[src];
    f->n_copies++;
}

static fake *fake_new(int n_blocks) {
    fake *f = tk_calloc(1, sizeof *f);
    f->n_blocks = f->n_free = n_blocks;
    f->free_ids = tk_calloc((size_t)n_blocks, sizeof *f->free_ids);
    f->refs = tk_calloc((size_t)n_blocks, sizeof *f->refs);
    f->store = tk_calloc((size_t)n_blocks * FBS, sizeof *f->store);
    f->mark = tk_calloc((size_t)n_blocks * FBS, sizeof *f->mark);
    f->bmark = tk_calloc((size_t)n_blocks, sizeof *f->bmark);
    for (int i = 0; i < n_blocks; i++) f->free_ids[i] = n_blocks - 1 - i;
    return f;
}

/* A backend over the fake pool: n_vocab logits a row, the includer's step. */
static backend fake_backend(fake *f, int n_vocab, tk_status (*step)(void *, const tk_batch *, float *)) {
    return (backend){.ctx = f,
                     .n_vocab = n_vocab,
                     .n_blocks = f->n_blocks,
                     .block_size = FBS,
                     .kv_bytes_per_token = 4,
                     .weight_dtype = "fake",
                     .n_threads = 1,
                     .model_id = 1,
                     .block_alloc = f_alloc,
                     .block_free = f_free,
                     .blocks_free = f_n_free,
                     .block_ref = f_ref,
                     .block_refs = f_refs,
                     .block_copy = f_copy,
                     .step = step};
}

static void fake_delete(fake *f) {
    tk_free(f->free_ids);
    tk_free(f->refs);
    tk_free(f->store);
    tk_free(f->mark);
    tk_free(f->bmark);
    tk_free(f);
}

#endif
