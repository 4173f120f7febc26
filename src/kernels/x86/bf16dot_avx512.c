/* The BF16 rounded-activation pair gemv (P16R) with vdpbf16ps (AVX512-BF16),
 * compiled with the AVX-512 flags: the same bits as kern_gemv_bf16_p16r_avx512
 * (two FMAs per pair step), which dispatch.c runs because it measured faster
 * on the machines here; kernels_test_simd holds both to the reference. */
#include "kernels/kernels_ref.h"

#define P16_HW    1
#define KFN(name) kern_##name##_avx512bf16

#include "kernels/x86/bf16p_body.h"
