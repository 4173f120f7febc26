/* Internal engine entry points: an engine over any backend (backend.h), so
 * tests can drive the real loop, scheduler, sampler and callbacks with a test
 * double instead of a model. tk_engine_create builds it over the CPU backend. */
#ifndef TK_ENGINE_ENGINE_H
#define TK_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "engine/prefix.h"
#include "engine/sched.h"
#include "tokamak.h"

/* The default step cap for max_batch running sequences: the most tokens a
 * time-based step may hold, and what the forward's buffers are sized for
 * (see docs/engine.md, "Step budget"). */
int engine_default_step_tokens(int max_batch);

/* The automatic time target: a step carrying prefill aims at ENGINE_STEP_RATIO
 * times what its decodes alone cost, at most ENGINE_STEP_MAX_S seconds (also
 * the target when nothing decodes); every step offers a waiting prefill at
 * least ENGINE_STEP_MIN_CHUNK tokens. */
#define ENGINE_STEP_RATIO     2.0
#define ENGINE_STEP_MAX_S     1.0
#define ENGINE_STEP_MIN_CHUNK 16

/* Speculative decoding: the default and largest draft cap per sequence, the
 * default and longest n-gram, and the most draft rows one step verifies (the
 * logits buffer is sized for max_batch plus these). */
#define ENGINE_SPEC_K         8
#define ENGINE_SPEC_K_MAX     32
#define ENGINE_SPEC_NGRAM     3
#define ENGINE_SPEC_NGRAM_MAX 16
#define ENGINE_SPEC_MAX_ROWS  256

/* The default time-based budget options (adaptive, automatic target). */
void engine_default_budget(sched_budget_opts *b);
/* Whether opts ask for a time-based budget: step_tokens 0 (the default) or
 * step_ms > 0 (then step_tokens is the cap). NULL opts: the defaults. */
bool engine_step_adaptive(const tk_engine_opts *o);

/* Create an engine over be (copied; be->ctx is destroyed by be->destroy at
 * tk_engine_free, also when this call fails) and start its loop thread. The
 * engine uses be's blocks, steps and byte counts; the sharing calls may be NULL. */
tk_status engine_create_backend(const backend *be, const tk_engine_opts *opts, tk_engine **out);

/* Replace the prefix cache's chain hash (tests force hash collisions with a
 * constant one, which the token comparison must catch). Call it before the
 * first tk_engine_submit; no-op when the engine runs without the cache. */
void engine_set_prefix_hash(tk_engine *e, prefix_hash_fn fn);

#endif
