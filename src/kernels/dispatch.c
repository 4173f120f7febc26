/* One immutable table of kernels per ISA level, chosen once per process from
 * the CPU (capped by TOKAMAK_ISA). */
#include <pthread.h>
#include <string.h>

#include "kernels/kernels_ref.h"

/* The reference dequantizers for the block types; F16 and BF16 vary per ISA. */
#define DEQUANT_BLOCKS                                                                                       \
    [TK_DTYPE_F32] = kern_dequant_f32_ref, [TK_DTYPE_Q8_0] = kern_dequant_q8_0_ref,                          \
    [TK_DTYPE_Q4_0] = kern_dequant_q4_0_ref, [TK_DTYPE_Q4_K] = kern_dequant_q4_k_ref,                        \
    [TK_DTYPE_Q6_K] = kern_dequant_q6_k_ref, [TK_DTYPE_Q8_K] = kern_dequant_q8_k_ref

static const tk_kernels KERNELS_SCALAR = {
    .isa = TK_ISA_SCALAR,
    .gemv = {[TK_DTYPE_F32] = kern_gemv_f32_ref,
             [TK_DTYPE_F16] = kern_gemv_f16_ref,
             [TK_DTYPE_BF16] = kern_gemv_bf16_ref,
             [TK_DTYPE_Q8_0] = kern_gemv_q8_0_ref,
             [TK_DTYPE_Q4_0] = kern_gemv_q4_0_ref,
             [TK_DTYPE_Q4_K] = kern_gemv_q4_k_ref,
             [TK_DTYPE_Q6_K] = kern_gemv_q6_k_ref},
    .gemv_q8_0_x8 = kern_gemv_q8_0_x8_ref,
    .gemv_bf16_x4 = kern_gemv_bf16_x4_ref,
    .quant_q8_0 = kern_quant_q8_0_ref,
    .quant_q8_k = kern_quant_q8_k_ref,
    .rmsnorm = kern_rmsnorm_ref,
    .add = kern_add_ref,
    .silu_mul = kern_silu_mul_ref,
    .dequant_row =
        {DEQUANT_BLOCKS, [TK_DTYPE_F16] = kern_dequant_f16_ref, [TK_DTYPE_BF16] = kern_dequant_bf16_ref},
};

#if defined(__x86_64__)
static const tk_kernels KERNELS_AVX2 = {
    .isa = TK_ISA_AVX2,
    .gemv = {[TK_DTYPE_F32] = kern_gemv_f32_avx2,
             [TK_DTYPE_F16] = kern_gemv_f16_avx2,
             [TK_DTYPE_BF16] = kern_gemv_bf16_avx2,
             [TK_DTYPE_Q8_0] = kern_gemv_q8_0_avx2,
             [TK_DTYPE_Q4_0] = kern_gemv_q4_0_avx2,
             [TK_DTYPE_Q4_K] = kern_gemv_q4_k_avx2,
             [TK_DTYPE_Q6_K] = kern_gemv_q6_k_avx2},
    .gemv_q8_0_x8 = kern_gemv_q8_0_x8_avx2,
    .gemv_bf16_x4 = kern_gemv_bf16_x4_avx2,
    .quant_q8_0 = kern_quant_q8_0_avx2,
    .quant_q8_k = kern_quant_q8_k_avx2,
    .rmsnorm = kern_rmsnorm_avx2,
    .add = kern_add_avx2,
    .silu_mul = kern_silu_mul_avx2,
    .dequant_row =
        {DEQUANT_BLOCKS, [TK_DTYPE_F16] = kern_dequant_f16_avx2, [TK_DTYPE_BF16] = kern_dequant_bf16_avx2},
};

static const tk_kernels KERNELS_AVX512 = {
    .isa = TK_ISA_AVX512,
    .gemv = {[TK_DTYPE_F32] = kern_gemv_f32_avx512,
             [TK_DTYPE_F16] = kern_gemv_f16_avx512,
             [TK_DTYPE_BF16] = kern_gemv_bf16_avx512,
             [TK_DTYPE_Q8_0] = kern_gemv_q8_0_avx512,
             [TK_DTYPE_Q4_0] = kern_gemv_q4_0_avx512,
             [TK_DTYPE_Q4_K] = kern_gemv_q4_k_avx512,
             [TK_DTYPE_Q6_K] = kern_gemv_q6_k_avx512},
    .gemv_q8_0_x8 = kern_gemv_q8_0_x8_avx512,
    .gemv_bf16_x4 = kern_gemv_bf16_x4_avx512,
    .quant_q8_0 = kern_quant_q8_0_avx512,
    .quant_q8_k = kern_quant_q8_k_avx512,
    .rmsnorm = kern_rmsnorm_avx512,
    .add = kern_add_avx512,
    .silu_mul = kern_silu_mul_avx512,
    .dequant_row = {DEQUANT_BLOCKS, [TK_DTYPE_F16] = kern_dequant_f16_avx512,
                    [TK_DTYPE_BF16] = kern_dequant_bf16_avx512},
};
#endif

const tk_kernels *kernels_get(tk_isa isa) {
#if defined(__x86_64__)
    switch (isa) {
    case TK_ISA_AVX512:
        return &KERNELS_AVX512;
    case TK_ISA_AVX2:
        return &KERNELS_AVX2;
    default:
        return &KERNELS_SCALAR;
    }
#else
    (void)isa;
    return &KERNELS_SCALAR;
#endif
}

/* The once-flag and its result are the only statics: write-once, then read-only. */
static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static const tk_kernels *default_table;

static void default_init(void) {
    tk_cpu c;
    cpu_detect(&c);
    default_table = kernels_get(cpu_isa_from_env(&c));
}

const tk_kernels *kernels_default(void) {
    pthread_once(&default_once, default_init);
    return default_table;
}

tk_dtype kern_act_type(tk_dtype wtype) {
    switch (wtype) {
    case TK_DTYPE_F32:
    case TK_DTYPE_F16:
    case TK_DTYPE_BF16:
        return TK_DTYPE_F32;
    case TK_DTYPE_Q8_0:
    case TK_DTYPE_Q4_0:
        return TK_DTYPE_Q8_0;
    case TK_DTYPE_Q4_K:
    case TK_DTYPE_Q6_K:
        return TK_DTYPE_Q8_K;
    default:
        return TK_DTYPE_COUNT; /* no gemv for this weight type */
    }
}

size_t kern_act_row_bytes(tk_dtype wtype, int64_t k) {
    tk_dtype a = kern_act_type(wtype);
    uint64_t bytes;
    if (a == TK_DTYPE_COUNT || k < 0 || !dtype_row_bytes(a, (uint64_t)k, &bytes) || bytes > SIZE_MAX)
        return 0;
    return (size_t)bytes;
}

void kern_quant_act(const tk_kernels *K, tk_dtype wtype, const float *x, void *xq, int64_t k) {
    switch (kern_act_type(wtype)) {
    case TK_DTYPE_Q8_0:
        K->quant_q8_0(x, xq, k);
        break;
    case TK_DTYPE_Q8_K:
        K->quant_q8_k(x, xq, k);
        break;
    case TK_DTYPE_F32:
        memcpy(xq, x, (size_t)k * sizeof(float));
        break;
    default:
        break;
    }
}
