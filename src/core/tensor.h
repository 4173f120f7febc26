/* A view of one weight tensor, as every loader (GGUF, safetensors) exposes it. */
#ifndef TK_CORE_TENSOR_H
#define TK_CORE_TENSOR_H

#include <stdint.h>

#include "dtype.h"

typedef struct tk_tensor {
    const char *name;   /* NUL-terminated, owned by the file object */
    tk_dtype type;
    int n_dims;         /* 1..4 */
    int64_t ne[4];      /* GGML order: ne[0] is the contiguous (row) length; unused dims are 1 */
    const void *data;   /* into the read-only mapping (or a repacked buffer) */
    uint64_t nbytes;    /* exactly rows * row bytes, checked at load */
} tk_tensor;

#endif
