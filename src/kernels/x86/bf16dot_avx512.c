/* The BF16 pair-layout gemv with vdpbf16ps (AVX512-BF16), compiled with the
 * AVX-512 flags; dispatch.c runs it at the avx512 level on CPUs that have
 * AVX512-BF16 (kern_gemv_bf16_p16_avx512, the FMA form, elsewhere: the same
 * bits). */
#include "kernels/kernels_ref.h"

#define P16_HW    1
#define KFN(name) kern_##name##_avx512bf16

#include "kernels/x86/bf16p_body.h"
