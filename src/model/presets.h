/* Shape presets for synthetic models: the published Qwen3 configurations and a
 * tiny test model per architecture. The table is constant; lookups copy. */
#ifndef TK_MODEL_PRESETS_H
#define TK_MODEL_PRESETS_H

#include <stdbool.h>
#include <stdint.h>

#include "tokamak.h"

typedef struct tk_preset {
    const char *name; /* "qwen3-0.6b", "tiny" */
    const char *arch; /* "qwen3", "qwen2", "llama" */
    int n_layer;
    int n_embd; /* hidden size */
    int n_head;
    int n_head_kv;
    int head_dim; /* independent of n_embd / n_head (Qwen3) */
    int n_ff;     /* feed-forward (intermediate) size */
    int n_vocab;  /* rows of the embedding and output matrices */
    int n_ctx;    /* context_length / max_position_embeddings */
    double rope_theta;
    double rms_eps;
    bool tied;     /* output shares token_embd */
    bool qkv_bias; /* qwen2: biases on q, k, v */
    bool qk_norm;  /* qwen3: RMSNorm per head on q and k */
    /* Llama-3 RoPE scaling; rope_factor 0 means none. */
    double rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_ctx;
} tk_preset;

int preset_count(void);
const tk_preset *preset_at(int i);
/* NULL on a miss. For "tiny" this is the qwen3 variant. */
const tk_preset *preset_find(const char *name);
/* Copy preset `name` to *out; arch (NULL: the preset's own) selects the tiny
 * variant ("qwen3", "qwen2", "llama") and is refused for the real presets.
 * TK_ERR_NOT_FOUND / TK_ERR_INVALID with a message listing what exists. */
tk_status preset_require(const char *name, const char *arch, tk_preset *out);
/* Matmul parameters + embeddings (+ output if untied) + norms + biases. */
int64_t preset_n_params(const tk_preset *p);

#endif
