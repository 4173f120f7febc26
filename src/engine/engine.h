/* Internal engine entry points: an engine over any step function, so tests
 * (and future backends) can drive the real loop, scheduler, sampler and
 * callbacks without a model. tk_engine_create builds this over kv.h + forward.h. */
#ifndef TK_ENGINE_ENGINE_H
#define TK_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "model/forward.h"
#include "tokamak.h"

struct tk_tokenizer;

typedef struct engine_backend {
    void *ctx;
    int n_vocab;
    const struct tk_tokenizer *tok; /* NULL: no text, no EOS detection */
    int n_blocks;                   /* KV blocks the backend stores */
    size_t kv_bytes_per_token;
    const char *weight_dtype;
    int n_threads;
    int (*block_alloc)(void *ctx);  /* -1 when empty */
    void (*block_free)(void *ctx, int block);
    int (*blocks_free)(void *ctx);
    /* One step; logits: (count of want_logits) x n_vocab, in sequence order. */
    tk_status (*step)(void *ctx, const tk_batch *b, float *logits);
    uint64_t (*last_bytes)(void *ctx); /* may be NULL */
    void (*destroy)(void *ctx);        /* at tk_engine_free, after the loop stops; may be NULL */
} engine_backend;

/* The default step budget for max_batch running sequences (see docs/engine.md). */
int engine_default_step_tokens(int max_batch);

/* Create an engine over be (copied; be->ctx is destroyed by be->destroy at
 * tk_engine_free, also when this call fails) and start its loop thread. */
tk_status engine_create_backend(const engine_backend *be, const tk_engine_opts *opts, tk_engine **out);

#endif
