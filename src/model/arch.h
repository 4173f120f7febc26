/* Architectures tokamak runs (llama, qwen2, qwen3): their hyper-parameters, read
 * from GGUF metadata or a Hugging Face config.json and validated before use, and
 * the tensor name tables of both formats. */
#ifndef TK_MODEL_ARCH_H
#define TK_MODEL_ARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "tokamak.h"

typedef enum tk_arch { TK_ARCH_LLAMA = 0, TK_ARCH_QWEN2, TK_ARCH_QWEN3, TK_ARCH_COUNT } tk_arch;

typedef enum tk_rope_scaling {
    TK_ROPE_SCALING_NONE = 0,
    TK_ROPE_SCALING_LINEAR, /* every frequency divided by factor */
    TK_ROPE_SCALING_LLAMA3, /* per-frequency factors (rope_freqs.weight in GGUF) */
} tk_rope_scaling;

/* Largest values accepted from a file; anything above is a corrupt header, not a model. */
#define TK_MAX_LAYERS    1024
#define TK_MAX_EMBD      (1 << 16)
#define TK_MAX_FF        (1 << 20)
#define TK_MAX_VOCAB     (1 << 22)
#define TK_MAX_HEADS     1024
#define TK_MAX_HEAD_DIM  1024
#define TK_MAX_CTX_TRAIN (1 << 24)

typedef struct tk_hparams {
    tk_arch arch;
    int n_layer;
    int n_ctx_train; /* >= 1; 0 when the file does not say (a stated 0 is an error) */
    int n_embd;      /* hidden size */
    int n_ff;        /* FFN inner size */
    int n_head;      /* query heads */
    int n_head_kv;   /* key/value heads (GQA: divides n_head) */
    int head_dim;    /* independent of n_embd / n_head (qwen3) */
    int n_vocab;
    float rms_eps;
    float rope_theta; /* rope.freq_base */
    tk_rope_scaling rope_scaling;
    float rope_factor;              /* linear and llama3 */
    float rope_low_freq_factor;     /* llama3 */
    float rope_high_freq_factor;    /* llama3 */
    int rope_orig_ctx;              /* llama3 original_max_position_embeddings */
    bool tied;                      /* output matrix is the embedding matrix */
    bool qk_norm;                   /* per-head RMSNorm on q and k before RoPE (qwen3) */
    bool qkv_bias;                  /* q/k/v projections carry a bias (qwen2; optional elsewhere) */
    int32_t bos_id, eos_id, pad_id; /* -1 when absent */
} tk_hparams;

const char *arch_name(tk_arch a); /* "llama", "qwen2", "qwen3" */
/* TK_ERR_UNSUPPORTED naming the architecture when it is not one of ours. */
tk_status arch_from_name(const char *name, size_t len, tk_arch *out);

/* Read and validate hyper-parameters from GGUF metadata. n_vocab comes from
 * {arch}.vocab_size, else the token_embd.weight rows, else the vocabulary.
 * A present context_length must be >= 1; rope.scaling.type linear needs
 * rope.scaling.factor and llama3 needs the rope_freqs.weight tensor. */
tk_status arch_hparams_gguf(const gguf_file *f, tk_hparams *hp);
/* Parse and validate a Hugging Face config.json text (len bytes). Optional
 * keys are checked as written, never replaced by their default when bad:
 * num_key_value_heads, head_dim and max_position_embeddings must be >= 1,
 * tie_word_embeddings and attention_bias booleans, token ids integers, and
 * rope_scaling complete (linear: factor; llama3: factor, low_freq_factor,
 * high_freq_factor, original_max_position_embeddings). */
tk_status arch_hparams_hf_json(const char *json, size_t len, tk_hparams *hp);
/* The checks every loader runs (also after filling hp by hand in tests):
 * ranges, divisibility, even head_dim, token ids inside the vocabulary. */
tk_status arch_hparams_validate(const tk_hparams *hp);

/* Tensor roles and their names in both formats. */
typedef enum tk_role {
    /* per layer */
    TK_ROLE_ATTN_NORM = 0,
    TK_ROLE_Q,
    TK_ROLE_K,
    TK_ROLE_V,
    TK_ROLE_O,
    TK_ROLE_Q_BIAS,
    TK_ROLE_K_BIAS,
    TK_ROLE_V_BIAS,
    TK_ROLE_Q_NORM,
    TK_ROLE_K_NORM,
    TK_ROLE_FFN_NORM,
    TK_ROLE_GATE,
    TK_ROLE_UP,
    TK_ROLE_DOWN,
    TK_ROLE_LAYER_COUNT,
    /* global */
    TK_ROLE_TOK_EMBD = TK_ROLE_LAYER_COUNT,
    TK_ROLE_OUTPUT_NORM,
    TK_ROLE_OUTPUT,
    TK_ROLE_ROPE_FREQS,
    TK_ROLE_COUNT
} tk_role;

typedef enum tk_naming { TK_NAMING_GGUF = 0, TK_NAMING_HF = 1 } tk_naming;

/* The tensor name of a role (layer ignored for global roles) into buf;
 * false when it does not fit. */
bool arch_tensor_name(tk_naming naming, tk_role role, int layer, char *buf, size_t n);
/* Expected GGML-order shape (ne[0] contiguous, unused dims 1) of a role. */
void arch_tensor_shape(const tk_hparams *hp, tk_role role, int64_t ne[4]);
/* True for the 2-D matmul weights (q k v o gate up down output). */
bool arch_role_is_matmul(tk_role role);

#endif
