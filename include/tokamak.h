/*
 * tokamak: a decode-first LLM inference engine.
 *
 * The one public header. Handles are opaque; every call that can fail on input
 * returns tk_status and leaves a one-line message for tk_last_error() in the
 * calling thread. Nothing in the library calls exit() or abort() on bad input.
 *
 * Thread safety: tk_model is immutable after tk_model_open and may be shared by
 * many engines and threads. tk_engine_submit, tk_engine_cancel and
 * tk_engine_stats are safe from any thread; everything else on an engine is
 * for the thread that created it.
 */
#ifndef TOKAMAK_H
#define TOKAMAK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TK_VERSION "0.1.0"

typedef enum tk_status {
    TK_OK = 0,
    TK_ERR_INVALID,     /* a bad argument or parameter */
    TK_ERR_FORMAT,      /* a malformed or inconsistent file */
    TK_ERR_UNSUPPORTED, /* well formed, but not something tokamak runs */
    TK_ERR_IO,          /* open/read/map failed */
    TK_ERR_NOMEM,       /* an allocation or a budget was exhausted */
    TK_ERR_RANGE,       /* an id, a length or a size past its limit */
    TK_ERR_FULL,        /* a queue or pool is full (overload) */
    TK_ERR_NOT_FOUND,   /* a key, tensor or request id that does not exist */
    TK_ERR_INTERNAL,    /* a broken invariant: a bug */
} tk_status;

/* The message set by the last failing call in this thread ("" if none). */
const char *tk_last_error(void);
/* A constant name for a status code ("ok", "invalid", ...). */
const char *tk_status_str(tk_status st);

/* ---- Models ---------------------------------------------------------------- */

typedef struct tk_model tk_model;

/* A type the matmul weights can be converted to at load. */
typedef enum tk_weight_type {
    TK_WEIGHTS_KEEP = 0, /* the file's types (default) */
    TK_WEIGHTS_F32,
    TK_WEIGHTS_F16,
    TK_WEIGHTS_BF16,
    TK_WEIGHTS_Q8_0,
    TK_WEIGHTS_Q4_0,
    TK_WEIGHTS_Q4_K,
    TK_WEIGHTS_Q6_K,
} tk_weight_type;

/* "keep", "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k"; NULL for a
 * value outside the enum. */
const char *tk_weight_type_name(tk_weight_type t);
/* The type named name (as above); false, *out untouched, for any other name. */
bool tk_weight_type_from_name(const char *name, tk_weight_type *out);

typedef struct tk_model_opts {
    /* Convert every matmul weight, the output matrix included, to this type at
     * load (embedding lookups keep the file's rows). Used for W8A8 from a BF16
     * file (TK_WEIGHTS_Q8_0), and by the ablation. */
    tk_weight_type repack;
    /* The output matrix's type at load; TK_WEIGHTS_KEEP (default): as repack.
     * W4A8 keeps the 151k-row output layer at 8 bits (repack q4_0,
     * repack_output q8_0), as the quantizer's defaults do. */
    tk_weight_type repack_output;
    /* false (default): copy the weights that are file views into anonymous
     * memory backed by transparent huge pages (streams faster: no TLB walk or
     * prefetcher stop every 4 KiB). true: read them through the file mapping
     * (less memory, instant load; llama.cpp's default). */
    bool use_mmap;
    /* false (default): in that copy, Q8_0 matmul weights are interleaved by
     * 16 or 8 rows and BF16 ones by pairs of 16 rows or by 4 (the layouts the decode kernels stream; same
     * bytes). true: keep the file's row order (for A/B measurements).
     * Ignored with use_mmap. */
    bool row_layout;
    /* false (default): BF16 matmuls multiply f32 activations (the float64
     * reference's path). true: in that copy, BF16 matmuls whose rows are a
     * multiple of 16 and k of 32 round their activations to BF16 first
     * (vdpbf16ps's arithmetic; a dot within 2^-8 of sum |w x| of the
     * unrounded one, docs/kernels.md). Ignored with use_mmap or row_layout. */
    bool bf16_dot;
    /* false (default): Q8_0 matmuls read the file's blocks (a scale per 32
     * values) with Q8_0 activations. true: in that copy, Q8_0 matmuls whose
     * rows are a multiple of 16 and k of 256 are requantized to one scale per
     * 256 values and read with Q8_K activations (one scale step per 256
     * values: faster batched decode and prefill, at a quality cost that
     * `tokamak eval` measures; docs/kernels.md). Ignored with use_mmap or
     * row_layout. */
    bool q8_coarse;
} tk_model_opts;

void tk_model_opts_default(tk_model_opts *o);

/* Open a GGUF file or a Hugging Face checkpoint directory (config.json +
 * safetensors). The model is immutable afterwards; free with tk_model_free.
 * opts may be NULL for defaults. */
tk_status tk_model_open(const char *path, const tk_model_opts *opts, tk_model **out);
void tk_model_free(tk_model *m);

typedef struct tk_model_info {
    const char *arch; /* "qwen3", "qwen2", "llama" */
    const char *name; /* general.name or the directory name */
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    int64_t n_params;            /* all weights, embeddings included */
    uint64_t weight_bytes;       /* bytes of all weights as stored */
    uint64_t decode_bytes;       /* bytes one decode token must read from weights */
    uint64_t kv_bytes_per_token; /* KV bytes per token of context at f16 */
    const char *weight_dtype;    /* the dominant weight type, e.g. "q8_0" */
    bool tied_embeddings;
} tk_model_info;

void tk_model_get_info(const tk_model *m, tk_model_info *out);

/* ---- Text: the model's tokenizer -------------------------------------------- *
 * Every call fails with TK_ERR_UNSUPPORTED when the model carries no
 * vocabulary. Buffers returned through a pointer are malloc'd by the library;
 * free them with tk_free_buf. All are thread-safe. */

void tk_free_buf(void *p);

/* Text to ids. add_bos: prepend BOS where the vocabulary asks for it (Llama-3
 * yes, Qwen no). parse_special: special tokens written in the text
 * (<|im_start|>, <|endoftext|>, ...: special: true in tokenizer.json, control
 * in GGUF) become their ids; false: they are text, for text from a user.
 * Non-special added tokens (Qwen3's <think>, <tool_call>) become their ids
 * either way, as Hugging Face and llama.cpp encode them. Invalid UTF-8 is
 * encoded as U+FFFD. Free *ids with tk_free_buf (also when *n_ids is 0). */
tk_status tk_tokenize(const tk_model *m, const char *text, size_t len, bool add_bos, bool parse_special,
                      int32_t **ids, size_t *n_ids);

/* Ids to UTF-8 text; show_special: include control tokens' text (non-special
 * added tokens always show). Invalid UTF-8 becomes U+FFFD; an id outside the
 * vocabulary is TK_ERR_RANGE. *text is NUL-terminated, *len excludes the NUL. */
tk_status tk_detokenize(const tk_model *m, const int32_t *ids, size_t n_ids, bool show_special, char **text,
                        size_t *len);

typedef struct tk_chat_message {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content; /* UTF-8, NUL-terminated */
} tk_chat_message;

typedef struct tk_chat_opts {
    bool add_generation_prompt; /* end with the assistant's header (default true) */
    bool enable_thinking;       /* Qwen3: false writes the empty think block (default true) */
} tk_chat_opts;

void tk_chat_opts_default(tk_chat_opts *o);

/* A conversation in the model's chat format (Qwen3, Llama-3, ChatML), encoded
 * to prompt ids: BOS where the vocabulary asks for it, then the turns, ready
 * for tk_request.prompt. Only the format's own markers become control tokens:
 * a special token (special: true in tokenizer.json, control in GGUF) written in
 * any message is encoded as text. Non-special added tokens (Qwen3's <think>,
 * <tool_call>) keep their ids, as Hugging Face encodes them. For messages
 * without special tokens the ids are those of the official template rendered
 * and encoded by Hugging Face. Roles other than system, user, assistant and
 * tool are TK_ERR_INVALID; invalid UTF-8 in content becomes U+FFFD. opts may
 * be NULL (tk_chat_opts_default). Free *ids with tk_free_buf. */
tk_status tk_chat_tokenize(const tk_model *m, const tk_chat_message *msgs, int n_msgs,
                           const tk_chat_opts *opts, int32_t **ids, size_t *n_ids);

/* The chat format the model's template was recognised as: "qwen3", "llama3" or
 * "chatml" (the fallback); NULL without a vocabulary. */
const char *tk_model_chat_format(const tk_model *m);

/* ---- Engine ---------------------------------------------------------------- */

typedef struct tk_engine tk_engine;

typedef enum tk_kv_type { TK_KV_F32, TK_KV_F16, TK_KV_BF16, TK_KV_INT8 } tk_kv_type;
typedef enum tk_kv_scale { TK_KV_SCALE_HEAD, TK_KV_SCALE_TOKEN } tk_kv_scale;

/* Speculative decoding (docs/engine.md, "Speculative decoding"). */
typedef enum tk_spec_mode { TK_SPEC_OFF, TK_SPEC_NGRAM, TK_SPEC_DRAFT } tk_spec_mode;

typedef struct tk_engine_opts {
    int n_threads;           /* 0: one per online core */
    bool pin_threads;        /* pin pool threads to cores */
    const char *cpus;        /* "0-3,8": thread i runs on the list's CPU i (cycling); NULL: see
                              * pin_threads. With n_threads 0, one thread per listed CPU.
                              * Read at create only. */
    bool numa;               /* interleave weights, KV and buffers over the NUMA nodes of the
                              * threads' CPUs (libnuma; says so and does nothing on one node) */
    int ctx;                 /* max context per sequence (default 4096) */
    int max_seqs;            /* sizes the pool when kv_mem is 0 (default max_batch) */
    size_t kv_mem;           /* KV pool bytes (0: max_seqs * ctx) */
    int block_size;          /* 16/32/64/128/256 (default 128) */
    tk_kv_type kv_type;      /* default f16 */
    tk_kv_scale kv_scale;    /* for int8 (default per head) */
    int max_batch;           /* running sequences (default 32) */
    int step_tokens;         /* fixed token budget of one step; 0 = time-based (see docs) */
    double step_ms;          /* target step time in ms for the time-based budget; 0 = automatic
                              * (2 x the step's decode time, at most 1 s). With step_ms > 0 a
                              * non-zero step_tokens is the cap instead of a fixed budget. */
    bool no_chunking;        /* prefill a whole prompt in one step (for comparison) */
    bool unfused;            /* run the unfused reference stages (ablation) */
    bool even_rows;          /* split the output, gate/up, down and vocabulary rows evenly between
                              * the threads, not by their measured speed (for comparison) */
    bool static_batching;    /* a batch starts together and waits for its slowest */
    int max_queue;           /* waiting requests before submit says FULL (default 1024) */
    bool no_prefix_cache;    /* do not share the KV of full blocks by content (the prefix
                              * cache, docs/engine.md; on by default) */
    tk_spec_mode spec;       /* drafter: off (default), n-gram prompt lookup, or the draft model */
    int spec_k;              /* most draft tokens a sequence verifies in a step (0: default 8); the
                              * engine chooses 0..spec_k per sequence and step */
    bool spec_fixed;         /* no controller: every decoding sequence verifies every draft on offer
                              * (spec_k, less where its room ends), each step; a seeded run with a
                              * draft model is then reproducible (the controller's choices follow
                              * measured time) */
    int spec_ngram;          /* n-gram length the drafter matches (0: default 3; shorter down to 2 when
                              * the longest has no match) */
    const char *draft_model; /* a GGUF file or Hugging Face directory of a model with the same
                              * tokenizer, opened at create to draft (spec draft; with spec off
                              * it turns spec draft on). Read at create only. */
} tk_engine_opts;

void tk_engine_opts_default(tk_engine_opts *o);

/* Create an engine over a model (the model must outlive the engine) and start
 * its loop thread. */
tk_status tk_engine_create(const tk_model *m, const tk_engine_opts *opts, tk_engine **out);
/* Stop the loop, finish every live request with TK_FINISH_CANCELLED, free. */
void tk_engine_free(tk_engine *e);

typedef enum tk_finish {
    TK_FINISH_NONE = 0,
    TK_FINISH_STOP,      /* a stop string or stop/EOS token */
    TK_FINISH_LENGTH,    /* max_tokens or the context limit */
    TK_FINISH_CANCELLED, /* tk_engine_cancel or engine shutdown */
    TK_FINISH_ERROR,     /* see the finish event's message */
} tk_finish;

#define TK_MAX_STOP     8
#define TK_MAX_LOGPROBS 20

typedef struct tk_logit_bias {
    int32_t token;
    float bias;
} tk_logit_bias;

typedef struct tk_sampling {
    float temperature;        /* 0: greedy */
    int top_k;                /* 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off (HF semantics) */
    float presence_penalty;   /* 0: off (OpenAI semantics) */
    float frequency_penalty;  /* 0: off */
    uint64_t seed;            /* per-request stream; same seed, same output */
    const tk_logit_bias *logit_bias;
    int n_logit_bias;
    int n_logprobs; /* top-n logprobs per token, 0..TK_MAX_LOGPROBS */
    /* each token's logprob in its event (n_logprobs > 0 implies it); off:
     * the event's logprob is NAN and no softmax over the vocabulary is taken
     * for it (greedy decoding then reads the logits once, for the argmax) */
    bool logprobs;
} tk_sampling;

void tk_sampling_default(tk_sampling *s);

typedef struct tk_token_event {
    uint64_t id; /* request id */
    int32_t token;
    const char *text; /* the new complete UTF-8 text (stop strings withheld) */
    size_t text_len;
    float logprob;
    int n_top;
    int32_t top_tokens[TK_MAX_LOGPROBS];
    float top_logprobs[TK_MAX_LOGPROBS];
    double t; /* tk_now_s() when the token was sampled */
} tk_token_event;

typedef struct tk_request_times {
    double queued, scheduled, first_token, finished; /* tk_now_s(); 0 if never */
    int n_prompt, n_output, n_preempted;
    int n_cached; /* prompt tokens the prefix cache held at the first admission (not prefilled) */
} tk_request_times;

typedef struct tk_finish_event {
    uint64_t id;
    tk_finish reason;
    const char *message; /* for TK_FINISH_ERROR, else NULL */
    const char *text;    /* text held back until the end (flushed), may be "" */
    size_t text_len;
    tk_request_times times;
} tk_finish_event;

/* Callbacks run on the engine loop thread: keep them short, never call back
 * into the engine except tk_engine_cancel. */
typedef void (*tk_on_token)(void *user, const tk_token_event *ev);
typedef void (*tk_on_finish)(void *user, const tk_finish_event *ev);

typedef struct tk_request {
    const int32_t *prompt; /* copied at submit */
    int n_prompt;
    int max_tokens; /* 0: until the context limit */
    tk_sampling sampling;
    const char *stop[TK_MAX_STOP]; /* stop strings (copied); NULL-terminated or full */
    const int32_t *stop_tokens;    /* extra stop ids (copied) */
    int n_stop_tokens;
    bool ignore_eos;
    bool want_text; /* detokenize and fill event text (needs a tokenizer) */
    tk_on_token on_token;
    tk_on_finish on_finish;
    void *user;
} tk_request;

void tk_request_default(tk_request *r);

/* Queue a request; on TK_OK *id is set and exactly one finish callback will
 * follow. On error nothing was queued and no callback fires (a prompt longer
 * than the context gives TK_ERR_RANGE naming both numbers; a full queue
 * TK_ERR_FULL). Thread-safe. */
tk_status tk_engine_submit(tk_engine *e, const tk_request *r, uint64_t *id);
/* Ask the engine to finish request id with TK_FINISH_CANCELLED; its blocks are
 * freed before the next step. TK_ERR_NOT_FOUND if it already finished. */
tk_status tk_engine_cancel(tk_engine *e, uint64_t id);

typedef struct tk_engine_stats {
    uint64_t steps, prompt_tokens, output_tokens, preemptions;
    uint64_t requests_submitted, requests_finished;
    int running, waiting;
    int waiting_no_blocks, waiting_behind_prefill, waiting_preempted;
    int kv_blocks_total, kv_blocks_used, kv_blocks_peak;
    int block_size;
    size_t kv_bytes_per_token;  /* per token of context, all layers */
    uint64_t decode_bytes_last; /* bytes the last step had to read (weights+KV) */
    double step_time_last;      /* seconds */
    /* Since start, the steps that processed no prompt token and gave tokens
     * (pure decode steps): how many, their forward time and the bytes they
     * had to read. A roofline is the difference of two readings. */
    uint64_t decode_steps;
    double decode_seconds, decode_bytes;
    /* The configuration as the engine runs it (benchmarks check these). */
    tk_kv_type kv_type;
    tk_kv_scale kv_scale;
    bool unfused, static_batching, no_chunking;
    int step_tokens, max_batch, n_threads; /* step_tokens: the fixed budget, or the time-based one's cap */
    const char *weight_dtype;
    /* The step budget: time-based or fixed, the target asked for (0: automatic),
     * the last step's budget (tokens, decodes included) and target (ms; 0 when
     * fixed), and the engine's measured step model (0 until measured): a step
     * takes step_fixed_ms + decode_ms_per_token x its decodes +
     * prefill_ms_per_token x its prefill tokens + prefill_ms_per_kpos x the
     * positions its prefill tokens attend to / 1024. */
    bool step_adaptive;
    double step_ms;
    int step_budget_last;
    double step_target_ms_last;
    double step_fixed_ms, decode_ms_per_token, prefill_ms_per_token, prefill_ms_per_kpos;
    /* The prefix cache (docs/engine.md, "Prefix caching"): whether it runs;
     * tokens of admitted sequences looked up (readmissions after preemption
     * included) and those found cached, so not prefilled; full blocks cached
     * now (held by sequences or idle); idle cached blocks evicted for room.
     * kv_blocks_used counts the blocks sequences hold, a shared one once; idle
     * cached blocks are not used (they are evicted before anyone waits). */
    bool prefix_cache;
    uint64_t prefix_cache_query_tokens, prefix_cache_hit_tokens, prefix_cache_evictions;
    int prefix_cache_blocks;
    /* Speculative decoding: the drafter and cap; decodes the controller
     * decided for (with a draft on offer), decodes that verified drafts, draft
     * tokens verified and accepted (acceptance = accepted / drafted), drafts
     * chosen in the last step (all sequences), and the fitted step cost
     * (ms = base + per_token x tokens; 0 until fitted). */
    tk_spec_mode spec;
    int spec_k;
    bool spec_fixed; /* k is spec_k every step (no controller) */
    uint64_t spec_decodes, spec_verifies, spec_drafted, spec_accepted;
    int spec_k_last;
    double spec_step_ms_base, spec_step_ms_per_token;
    /* The draft model (spec draft): seconds its passes took and seconds of the
     * decode turns they ran in (drafting included; the draft's share of a
     * speculating decode is their ratio), and the fitted cost of one draft
     * pass (ms = base + per_seq x sequences drafting; 0 until measured). */
    double spec_draft_seconds, spec_turn_seconds;
    double spec_draft_ms_base, spec_draft_ms_per_seq;
    /* The draft model's prefill of the prompts it follows (the steps the
     * target prefilled them in): seconds and tokens fed. */
    double spec_follow_seconds;
    uint64_t spec_follow_tokens;
    /* KV types whose stores rescale a block's earlier slots (INT8 per head):
     * after a rejected draft, blocks put back from the copy taken before the
     * step, and known positions computed again (the kept ones of the step,
     * or the block's from its first slot where no copy was taken). */
    uint64_t spec_kv_restores, spec_refed_tokens;
} tk_engine_stats;

tk_status tk_engine_stats_get(tk_engine *e, tk_engine_stats *out);

/* A step's floor is the time the machine's limits allow it: the sum over
 * its terms of max(bytes / read bandwidth, ops / the peak its multiply-adds
 * are judged by). The terms are the forward step's stages (tokamak
 * profile's), those that only read merged into one. Peaks: fp32 FMA, int8
 * dot products on quantized activations, BF16 dot products (vdpbf16ps). */
enum { TK_FLOOR_F32, TK_FLOOR_INT8, TK_FLOOR_BF16, TK_FLOOR_PEAKS };
#define TK_STEP_TERMS 8
typedef struct tk_floor_term {
    uint64_t bytes;
    double ops; /* a multiply-add counts 2 */
    int peak;   /* TK_FLOOR_* */
} tk_floor_term;

/* The limits a floor is taken at: read bandwidth in GB/s and each peak in
 * GOP/s (GFLOP/s); a limit <= 0 leaves its part of every term out. */
typedef struct tk_floor_limits {
    double read_gbs;
    double peak_gops[TK_FLOOR_PEAKS];
} tk_floor_limits;

/* One engine step, as tk_engine_step_log returns it. */
typedef struct tk_step_record {
    uint64_t step;     /* its number: tk_engine_stats.steps right after it (1, 2, ...) */
    double seconds;    /* forward time */
    uint64_t bytes;    /* weight + KV bytes it had to read (decode_bytes_last) */
    int n_seqs;        /* sequences in it */
    int n_tokens;      /* tokens it processed */
    int prompt_tokens; /* of which prompt (0: a pure decode step) */
    int out_tokens;    /* tokens it gave */
    /* what its stages read and computed (their bytes add up to `bytes`); all
     * zero where the backend does not say */
    tk_floor_term floor_terms[TK_STEP_TERMS];
} tk_step_record;

/* The floor of a step whose terms are t (TK_STEP_TERMS of them, as in
 * tk_step_record.floor_terms) at the limits lim, in seconds; 0 for terms
 * all zero. */
double tk_step_floor_s(const tk_floor_term *t, const tk_floor_limits *lim);

/* A pure decode step: no prompt token, tokens out, a measured time (the
 * steps tk_engine_stats.decode_* count and a decode roofline reads). */
static inline bool tk_step_is_decode(const tk_step_record *r) {
    return r->prompt_tokens == 0 && r->out_tokens > 0 && r->seconds > 0;
}

/* The engine keeps the records of its last TK_STEP_LOG steps. */
#define TK_STEP_LOG 1024

/* Copy the records of the steps numbered above `after`, oldest first, into
 * out[0, n) (n <= max) and return n; -1 on a NULL argument. A caller that
 * fell more than TK_STEP_LOG steps behind gets the newest ones (a gap in
 * `step` tells it). Thread-safe. */
int tk_engine_step_log(tk_engine *e, uint64_t after, tk_step_record *out, int max);

/* Seconds on the monotonic clock used by every timestamp above. */
double tk_now_s(void);

#ifdef __cplusplus
}
#endif
#endif
