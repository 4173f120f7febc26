/* Tensor element types. The ids are GGML's, so GGUF files map one to one. */
#ifndef TK_CORE_DTYPE_H
#define TK_CORE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum tk_dtype {
    TK_DTYPE_F32 = 0,
    TK_DTYPE_F16 = 1,
    TK_DTYPE_Q4_0 = 2,
    TK_DTYPE_Q8_0 = 8,
    TK_DTYPE_Q4_K = 12,
    TK_DTYPE_Q6_K = 14,
    TK_DTYPE_Q8_K = 15, /* activations only (the partner of the K-quants) */
    TK_DTYPE_BF16 = 30,
    TK_DTYPE_COUNT = 40, /* table size; ids >= this are unknown */
} tk_dtype;

/* Block layouts (GGML compatible). QK = elements per block. */
#define TK_QK8_0        32
#define TK_QK4_0        32
#define TK_QK_K         256
#define TK_K_SCALE_SIZE 12

typedef uint16_t tk_f16;  /* IEEE half bits */
typedef uint16_t tk_bf16; /* bfloat16 bits */

typedef struct {
    tk_f16 d;
    int8_t qs[TK_QK8_0];
} tk_block_q8_0; /* 34 B */
typedef struct {
    tk_f16 d;
    uint8_t qs[TK_QK4_0 / 2];
} tk_block_q4_0; /* 18 B */
typedef struct {
    tk_f16 d, dmin;
    uint8_t scales[TK_K_SCALE_SIZE];
    uint8_t qs[TK_QK_K / 2];
} tk_block_q4_k; /* 144 B */
typedef struct {
    uint8_t ql[TK_QK_K / 2];
    uint8_t qh[TK_QK_K / 4];
    int8_t scales[TK_QK_K / 16];
    tk_f16 d;
} tk_block_q6_k; /* 210 B */
typedef struct {
    float d;
    int8_t qs[TK_QK_K];
    int16_t bsums[TK_QK_K / 16];
} tk_block_q8_k; /* 292 B */

/* True for the ids tokamak can load (F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K). */
bool dtype_supported(uint32_t id);
/* Known to GGML at all (for messages: "known but unsupported" vs "unknown"). */
bool dtype_known(uint32_t id);
const char *dtype_name(uint32_t id); /* "q8_0"; "unknown" for others */
/* Parse "f32","f16","bf16","q8_0","q4_0","q4_k","q6_k"; -1 if none. */
int dtype_from_name(const char *s);
int dtype_block_elems(tk_dtype t); /* 1 for float types */
size_t dtype_block_bytes(tk_dtype t);
/* Bytes of a row of n elements; false if n is not a multiple of the block or overflows. */
bool dtype_row_bytes(tk_dtype t, uint64_t n, uint64_t *bytes);

/* Scalar conversions (exact, round-to-nearest-even). */
float tk_f16_to_f32(tk_f16 h);
tk_f16 tk_f32_to_f16(float f);
static inline float tk_bf16_to_f32(tk_bf16 b) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)b << 16};
    return v.f;
}
tk_bf16 tk_f32_to_bf16(float f);

#endif
