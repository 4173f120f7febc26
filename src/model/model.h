/* Internal accessors over a loaded model for the engine, bench and CLI. The
 * struct itself stays in model_internal.h (src/model/ and its tests only).
 * Every accessor is thread-safe: a tk_model is immutable after tk_model_open. */
#ifndef TK_MODEL_MODEL_H
#define TK_MODEL_MODEL_H

#include <stdint.h>

#include "model/arch.h"
#include "tokamak.h"

struct tk_tokenizer;
struct tk_tensor;

const tk_hparams *model_hparams(const tk_model *m);
/* NULL when the model file carries no vocabulary. */
const struct tk_tokenizer *model_tokenizer(const tk_model *m);
/* Bytes of weights one decode token reads: every matmul weight, the norms, the
 * output matrix and one embedding row. */
uint64_t model_decode_bytes(const tk_model *m);
/* The one huge-page copy holding the matmul weights (NULL, 0 when the
 * weights are read through the file mapping): what --numa places. */
void model_resident_region(const tk_model *m, void **p, size_t *n);
/* Bytes of weights held per type (index: tk_dtype id; norms and biases count
 * as f32, the form they are held in). Fills TK_DTYPE_COUNT entries. */
void model_dtype_bytes(const tk_model *m, uint64_t *bytes);
/* The dominant matmul weight type as held in memory (after any repack), e.g. "q8_0". */
const char *model_weight_dtype(const tk_model *m);
/* The matmul weights a decode token reads, as held in memory: each layer's
 * q, k, v, output, gate, up and down projections in order, then the output
 * (vocabulary) matrix; i in [0, model_n_matmuls). */
int model_n_matmuls(const tk_model *m);
const struct tk_tensor *model_matmul(const tk_model *m, int i);

#endif
