/* The private layout of tk_model, shared by src/model/ (all of it) and their tests.
 * Weights are tk_tensor views into the mapped file, or owned repacked copies
 * (llama Q/K un-permuted, or every matmul weight converted by tk_model_opts.repack).
 * Shapes below are GGML order written as (rows, row length): a matmul weight
 * (out, in) holds `out` rows of `in` elements each. */
#ifndef TK_MODEL_INTERNAL_H
#define TK_MODEL_INTERNAL_H

#include "core/tensor.h"
#include "format/gguf.h"
#include "model/arch.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

typedef struct tk_layer {
    const float *attn_norm; /* (n_embd) */
    tk_tensor wq;           /* (n_head*head_dim, n_embd) */
    tk_tensor wk, wv;       /* (n_head_kv*head_dim, n_embd) */
    tk_tensor wo;           /* (n_embd, n_head*head_dim) */
    const float *bq;        /* (n_head*head_dim) or NULL */
    const float *bk, *bv;   /* (n_head_kv*head_dim) or NULL */
    const float *q_norm;    /* (head_dim) or NULL (qwen3 only) */
    const float *k_norm;    /* (head_dim) or NULL */
    const float *ffn_norm;  /* (n_embd) */
    tk_tensor w_gate, w_up; /* (n_ff, n_embd) */
    tk_tensor w_down;       /* (n_embd, n_ff) */
} tk_layer;

/* Where weights come from: a lookup by name in one naming scheme. GGUF llama
 * files carry Q/K rows permuted for interleaved RoPE; the loader undoes that
 * when naming is TK_NAMING_GGUF and the architecture is llama. */
typedef const tk_tensor *(*model_find_fn)(void *ctx, const char *name);
typedef struct model_source {
    tk_naming naming;
    model_find_fn find;
    void *ctx;
} model_source;

struct tk_model {
    tk_hparams hp;
    char *name;
    gguf_file *gguf;           /* owned; GGUF weights are views into it (NULL otherwise) */
    void *src_handle;          /* owned source of HF weights (NULL otherwise) */
    void (*src_close)(void *); /* frees src_handle */
    tk_tokenizer *tok;         /* owned; NULL without a vocabulary */
    tk_layer *layers;          /* (n_layer) */
    tk_tensor tok_embd;        /* (n_vocab, n_embd) */
    tk_tensor output;          /* (n_vocab, n_embd): tok_embd itself when tied and not repacked */
    const float *output_norm;  /* (n_embd) */
    float *rope_freqs;         /* (head_dim/2) inverse frequencies, scaling applied */
    void **owned;              /* (n_owned) aligned buffers freed with the model */
    void *resident;            /* huge-page copy of the file-view weights (NULL with use_mmap) */
    size_t resident_size;
    int n_owned, cap_owned;
    bool repacked;
    uint64_t weight_bytes, decode_bytes;
    int64_t n_params;
    const char *weight_dtype;
};

/* Create a model from hyper-parameters and a weight source (the format loaders
 * and the tests call this). hp is validated; every tensor is looked up, shape-
 * and type-checked, converted where needed. On error nothing leaks and *out is
 * NULL. The source must outlive the model unless every weight was copied. */
tk_status model_create(const tk_hparams *hp, const model_source *src, const tk_model_opts *o, tk_model **out);

/* HF directory loader (model_hf.c). */
tk_status model_open_hf(const char *dir, const tk_model_opts *o, tk_model **out);

/* Un-permute the rows of one GGUF llama Q or K matrix: n_head heads of head_dim
 * rows each, row_bytes per row, src -> dst (distinct buffers). Exposed for tests. */
void model_unpermute_rows(const void *src, void *dst, int n_head, int head_dim, size_t row_bytes);

#endif
