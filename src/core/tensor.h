/* A view of one weight tensor, as every loader (GGUF, safetensors) exposes it. */
#ifndef TK_CORE_TENSOR_H
#define TK_CORE_TENSOR_H

#include <stdint.h>

#include "dtype.h"

/* How a matmul weight's rows sit in memory. ROWS is the file's order (row r
 * at r * row bytes); X16 and X8 are Q8_0 interleaved by 16 and 8 rows (the
 * loader takes X16 where rows % 16 == 0, X8 where only rows % 8 == 0), P16
 * BF16 pairs interleaved by 16 rows (where rows % 16 == 0 and k % 32 == 0),
 * X4 BF16 interleaved by 4 rows (other shapes), X16S Q8_0 requantized to one
 * scale per 256 values and interleaved by 16 rows (opt-in: it rounds the
 * weights and takes coarser activations), for the decode kernels (the layout rows of
 * src/kernels/dispatch.c, docs/kernels.md), made when the weights are copied at load. */
typedef enum tk_layout {
    TK_LAYOUT_ROWS = 0,
    TK_LAYOUT_X16 = 1,
    TK_LAYOUT_X8 = 2,
    TK_LAYOUT_P16 = 3, /* BF16 pairs by 16 rows, f32 activations (before X4: the loader's first pick) */
    TK_LAYOUT_X4 = 4,
    TK_LAYOUT_P16R = 5, /* the P16 bytes, activations rounded to BF16 (vdpbf16ps); opt-in (bf16_dot) */
    TK_LAYOUT_X16S = 6, /* Q8_0 requantized to a scale per 256 values by 16 rows, Q8_K activations;
                         * opt-in (q8_coarse) */
    TK_LAYOUT_COUNT
} tk_layout;

typedef struct tk_tensor {
    const char *name; /* NUL-terminated, owned by the file object */
    tk_dtype type;
    int n_dims;       /* 1..4 */
    int64_t ne[4];    /* GGML order: ne[0] is the contiguous (row) length; unused dims are 1 */
    const void *data; /* into the read-only mapping (or a repacked buffer) */
    uint64_t nbytes;  /* rows * row bytes, checked at load; the same in every layout but X16S (fewer) */
    tk_layout layout; /* TK_LAYOUT_ROWS unless the model repacked it */
} tk_tensor;

#endif
