/* The one place that picks kernels: one immutable tk_kernels table per ISA
 * level, the weight table keyed by (weight type, layout) with a gemv per
 * level, and the attention kernel for a head_dim. The level is chosen once
 * per process from the CPU (capped by TOKAMAK_ISA). docs/kernels.md says
 * which rows a new weight type, layout or ISA level adds. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "kernels/kernels_ref.h"

/* A function per ISA level, by tk_isa; the x86 levels exist on x86-64 only. */
#if defined(__x86_64__)
#define BY_ISA(scalar, avx2, avxvnni, avx512)                                                                \
    { [TK_ISA_SCALAR] = scalar, [TK_ISA_AVX2] = avx2, [TK_ISA_AVXVNNI] = avxvnni, [TK_ISA_AVX512] = avx512 }
#define TOP_ISA TK_ISA_AVX512
#else
#define BY_ISA(scalar, avx2, avxvnni, avx512)                                                                \
    { [TK_ISA_SCALAR] = scalar }
#define TOP_ISA TK_ISA_SCALAR
#endif

/* ---- the weight table ----------------------------------------------------------- */

static const tk_weight_kernels WEIGHTS[TK_DTYPE_COUNT][TK_LAYOUT_COUNT] = {
    [TK_DTYPE_F32][TK_LAYOUT_ROWS] = {.act = TK_DTYPE_F32,
                                      .gemv = BY_ISA(kern_gemv_f32_ref, kern_gemv_f32_avx2,
                                                     kern_gemv_f32_avxvnni, kern_gemv_f32_avx512)},
    [TK_DTYPE_F16][TK_LAYOUT_ROWS] = {.act = TK_DTYPE_F32,
                                      .gemv = BY_ISA(kern_gemv_f16_ref, kern_gemv_f16_avx2,
                                                     kern_gemv_f16_avxvnni, kern_gemv_f16_avx512)},
    [TK_DTYPE_BF16][TK_LAYOUT_ROWS] = {.act = TK_DTYPE_F32,
                                       .gemv = BY_ISA(kern_gemv_bf16_ref, kern_gemv_bf16_avx2,
                                                      kern_gemv_bf16_avxvnni, kern_gemv_bf16_avx512)},
    [TK_DTYPE_BF16][TK_LAYOUT_X4] = {.act = TK_DTYPE_F32,
                                     .pack = kern_pack_bf16_x4,
                                     .dequant_row = kern_dequant_bf16_x4_row,
                                     .gemv = BY_ISA(kern_gemv_bf16_x4_ref, kern_gemv_bf16_x4_avx2,
                                                    kern_gemv_bf16_x4_avxvnni, kern_gemv_bf16_x4_avx512)},
    [TK_DTYPE_BF16][TK_LAYOUT_P16] = {.act = TK_DTYPE_F32,
                                      .pack = kern_pack_bf16_p16,
                                      .dequant_row = kern_dequant_bf16_p16_row,
                                      .gemv = BY_ISA(kern_gemv_bf16_p16_ref, kern_gemv_bf16_p16_avx2,
                                                     kern_gemv_bf16_p16_avxvnni, kern_gemv_bf16_p16_avx512)},
    [TK_DTYPE_BF16][TK_LAYOUT_P16R] = {.act = TK_DTYPE_F32,
                                       .pack = kern_pack_bf16_p16,
                                       .dequant_row = kern_dequant_bf16_p16_row,
                                       .gemv =
                                           BY_ISA(kern_gemv_bf16_p16r_ref, kern_gemv_bf16_p16r_avx2,
                                                  kern_gemv_bf16_p16r_avxvnni, kern_gemv_bf16_p16r_avx512),
                                       .opt_in = true},
    [TK_DTYPE_Q8_0][TK_LAYOUT_ROWS] = {.act = TK_DTYPE_Q8_0,
                                       .gemv = BY_ISA(kern_gemv_q8_0_ref, kern_gemv_q8_0_avx2,
                                                      kern_gemv_q8_0_avxvnni, kern_gemv_q8_0_avx512)},
    [TK_DTYPE_Q8_0][TK_LAYOUT_X16] = {.act = TK_DTYPE_Q8_0,
                                      .pack = kern_pack_q8_0_x16,
                                      .dequant_row = kern_dequant_q8_0_x16_row,
                                      .gemv = BY_ISA(kern_gemv_q8_0_x16_ref, kern_gemv_q8_0_x16_avx2,
                                                     kern_gemv_q8_0_x16_avxvnni, kern_gemv_q8_0_x16_avx512)},
    [TK_DTYPE_Q8_0][TK_LAYOUT_X8] = {.act = TK_DTYPE_Q8_0,
                                     .pack = kern_pack_q8_0_x8,
                                     .dequant_row = kern_dequant_q8_0_x8_row,
                                     .gemv = BY_ISA(kern_gemv_q8_0_x8_ref, kern_gemv_q8_0_x8_avx2,
                                                    kern_gemv_q8_0_x8_avxvnni, kern_gemv_q8_0_x8_avx512)},
    [TK_DTYPE_Q8_0][TK_LAYOUT_X16S] = {.act = TK_DTYPE_Q8_K,
                                       .pack = kern_pack_q8_0_x16s,
                                       .dequant_row = kern_dequant_q8_0_x16s_row,
                                       .packed_bytes = kern_q8_0_x16s_bytes,
                                       .gemv =
                                           BY_ISA(kern_gemv_q8_0_x16s_ref, kern_gemv_q8_0_x16s_avx2,
                                                  kern_gemv_q8_0_x16s_avxvnni, kern_gemv_q8_0_x16s_avx512),
                                       .opt_in = true},
    [TK_DTYPE_Q4_0][TK_LAYOUT_ROWS] = {.act = TK_DTYPE_Q8_0,
                                       .gemv = BY_ISA(kern_gemv_q4_0_ref, kern_gemv_q4_0_avx2,
                                                      kern_gemv_q4_0_avxvnni, kern_gemv_q4_0_avx512)},
    [TK_DTYPE_Q4_0][TK_LAYOUT_X16] = {.act = TK_DTYPE_Q8_0,
                                      .pack = kern_pack_q4_0_x16,
                                      .dequant_row = kern_dequant_q4_0_x16_row,
                                      .gemv = BY_ISA(kern_gemv_q4_0_x16_ref, kern_gemv_q4_0_x16_avx2,
                                                     kern_gemv_q4_0_x16_avxvnni, kern_gemv_q4_0_x16_avx512)},
    [TK_DTYPE_Q4_K][TK_LAYOUT_ROWS] = {.act = TK_DTYPE_Q8_K,
                                       .gemv = BY_ISA(kern_gemv_q4_k_ref, kern_gemv_q4_k_avx2,
                                                      kern_gemv_q4_k_avxvnni, kern_gemv_q4_k_avx512)},
    [TK_DTYPE_Q4_K][TK_LAYOUT_X16] = {.act = TK_DTYPE_Q8_K,
                                      .pack = kern_pack_q4_k_x16,
                                      .dequant_row = kern_dequant_q4_k_x16_row,
                                      .gemv = BY_ISA(kern_gemv_q4_k_x16_ref, kern_gemv_q4_k_x16_avx2,
                                                     kern_gemv_q4_k_x16_avxvnni, kern_gemv_q4_k_x16_avx512)},
    [TK_DTYPE_Q6_K][TK_LAYOUT_ROWS] = {.act = TK_DTYPE_Q8_K,
                                       .gemv = BY_ISA(kern_gemv_q6_k_ref, kern_gemv_q6_k_avx2,
                                                      kern_gemv_q6_k_avxvnni, kern_gemv_q6_k_avx512)},
    [TK_DTYPE_Q6_K][TK_LAYOUT_X16] = {.act = TK_DTYPE_Q8_K,
                                      .pack = kern_pack_q6_k_x16,
                                      .dequant_row = kern_dequant_q6_k_x16_row,
                                      .gemv = BY_ISA(kern_gemv_q6_k_x16_ref, kern_gemv_q6_k_x16_avx2,
                                                     kern_gemv_q6_k_x16_avxvnni, kern_gemv_q6_k_x16_avx512)},
};

const tk_weight_kernels *kern_weight(tk_dtype t, tk_layout layout) {
    if ((unsigned)t >= TK_DTYPE_COUNT || (unsigned)layout >= TK_LAYOUT_COUNT) return NULL;
    const tk_weight_kernels *w = &WEIGHTS[t][layout];
    return w->gemv[TK_ISA_SCALAR] ? w : NULL;
}

/* Whether (t, layout)'s gemv at K's level is P16R's as vdpbf16ps. */
static bool gemv_bf16_dot(const tk_kernels *K, tk_dtype t, tk_layout layout) {
    return t == TK_DTYPE_BF16 && layout == TK_LAYOUT_P16R && K->isa == TK_ISA_AVX512 &&
           kern_bf16_dot_hw(NULL);
}

tk_gemv_fn kern_gemv(const tk_kernels *K, tk_dtype t, tk_layout layout) {
    const tk_weight_kernels *w = kern_weight(t, layout);
#if defined(__x86_64__)
    if (w && gemv_bf16_dot(K, t, layout)) return kern_gemv_bf16_p16r_avx512bf16;
#endif
    return w ? w->gemv[K->isa] : NULL;
}

tk_peak kern_peak(const tk_kernels *K, tk_dtype t, tk_layout layout) {
    const tk_dtype a = kern_act_type(t, layout);
    if (a == TK_DTYPE_Q8_0 || a == TK_DTYPE_Q8_K) return TK_PEAK_INT8;
    return gemv_bf16_dot(K, t, layout) ? TK_PEAK_BF16 : TK_PEAK_F32;
}

const char *kern_peak_name(tk_peak p) {
    return p == TK_PEAK_INT8 ? "int8" : p == TK_PEAK_BF16 ? "bf16" : "fp32";
}

/* ---- vdpbf16ps or two FMAs for P16R ----------------------------------------------------- */

/* P16R's gemv as vdpbf16ps (AVX512-BF16) gives the bits of its FMA form, so
 * which one runs is a matter of speed alone, and the speed differs by CPU:
 * ~0.85x the two FMAs it replaces on a Sapphire Rapids class machine, ~2x
 * on an AMD EPYC (Zen 5) one (docs/kernels.md). So the first P16R call of a
 * process times both over a matrix that stays in L2 and keeps the
 * instruction only where it is clearly faster. Write-once statics. */
static pthread_once_t bf16dot_once = PTHREAD_ONCE_INIT;
static bool bf16dot_hw;
static double bf16dot_ratio; /* the FMA form's time over vdpbf16ps's; 0: not measured */

#if defined(__x86_64__)
enum { BF16DOT_ROWS = 64, BF16DOT_K = 1024, BF16DOT_TOK = 12, BF16DOT_ROUNDS = 7, BF16DOT_CALLS = 3 };

static uint32_t lcg_next(uint32_t s) { return s * 1664525u + 1013904223u; }

static void bf16dot_measure(void) {
    tk_cpu c;
    cpu_detect(&c);
    if (!c.avx512bf16 || !cpu_has_isa(&c, TK_ISA_AVX512)) return;
    const size_t nw = (size_t)BF16DOT_ROWS * BF16DOT_K, nx = (size_t)BF16DOT_TOK * BF16DOT_K;
    uint16_t *rows = malloc(nw * sizeof *rows), *w = aligned_alloc(64, nw * sizeof *w);
    float *x = malloc(nx * sizeof *x), *y = malloc((size_t)BF16DOT_TOK * BF16DOT_ROWS * sizeof *y);
    if (rows && w && x && y) {
        uint32_t s = 12345u;
        /* BF16 of magnitude ~2^-4 (exponent 123), random signs and mantissas */
        for (size_t i = 0; i < nw; i++) {
            s = lcg_next(s);
            rows[i] = (uint16_t)((s >> 16 & 0x8000u) | (123u << 7) | (s >> 9 & 0x7fu));
        }
        for (size_t i = 0; i < nx; i++) x[i] = (float)((s = lcg_next(s)) >> 8) / 16777216.0f - 0.5f;
        kern_pack_bf16_p16(rows, w, BF16DOT_ROWS, BF16DOT_K);
        const tk_gemv_fn fn[2] = {kern_gemv_bf16_p16r_avx512, kern_gemv_bf16_p16r_avx512bf16};
        double best[2] = {1e30, 1e30};
        for (int r = 0; r < BF16DOT_ROUNDS; r++) /* alternating, the best of each */
            for (int v = 0; v < 2; v++) {
                const uint64_t t0 = tk_now_ns();
                for (int i = 0; i < BF16DOT_CALLS; i++)
                    fn[v](BF16DOT_K, w, 0, BF16DOT_ROWS, x, BF16DOT_K * sizeof *x, BF16DOT_TOK, y,
                          BF16DOT_ROWS);
                const double dt = (double)(tk_now_ns() - t0);
                if (dt < best[v]) best[v] = dt;
            }
        bf16dot_ratio = best[1] > 0 ? best[0] / best[1] : 0;
        bf16dot_hw = bf16dot_ratio > 1.1; /* a tie keeps the FMA form */
    }
    free(rows);
    free(w);
    free(x);
    free(y);
}
#else
static void bf16dot_measure(void) {}
#endif

bool kern_bf16_dot_hw(double *ratio) {
    pthread_once(&bf16dot_once, bf16dot_measure);
    if (ratio) *ratio = bf16dot_ratio;
    return bf16dot_hw;
}

tk_layout kern_pack(tk_dtype t, const void *rows_in, void *out, int64_t rows, int64_t k) {
    for (int l = TK_LAYOUT_ROWS + 1; l < TK_LAYOUT_COUNT; l++) {
        const tk_weight_kernels *w = kern_weight(t, (tk_layout)l);
        if (w && w->pack && !w->opt_in && w->pack(rows_in, out, rows, k)) return (tk_layout)l;
    }
    return TK_LAYOUT_ROWS;
}

tk_layout kern_pack_opt_in(tk_dtype t, const void *rows_in, void *out, int64_t rows, int64_t k) {
    for (int l = TK_LAYOUT_ROWS + 1; l < TK_LAYOUT_COUNT; l++) {
        const tk_weight_kernels *w = kern_weight(t, (tk_layout)l);
        if (w && w->pack && w->opt_in && w->pack(rows_in, out, rows, k)) return (tk_layout)l;
    }
    return kern_pack(t, rows_in, out, rows, k);
}

void kern_dequant_tensor_row(const tk_kernels *K, const tk_tensor *t, int64_t row, float *out) {
    const int64_t k = t->ne[0];
    const tk_weight_kernels *w = kern_weight(t->type, t->layout);
    if (w && w->dequant_row) {
        w->dequant_row(t->data, k, row, out);
        return;
    }
    uint64_t rb = 0;
    dtype_row_bytes(t->type, (uint64_t)k, &rb);
    K->dequant_row[t->type]((const uint8_t *)t->data + (size_t)row * rb, out, k);
}

tk_dtype kern_act_type(tk_dtype wtype, tk_layout layout) {
    const tk_weight_kernels *w = kern_weight(wtype, layout);
    return w ? w->act : TK_DTYPE_COUNT; /* no gemv for this weight type */
}

size_t kern_act_row_bytes(tk_dtype wtype, tk_layout layout, int64_t k) {
    tk_dtype a = kern_act_type(wtype, layout);
    uint64_t bytes;
    if (a == TK_DTYPE_COUNT || k < 0 || !dtype_row_bytes(a, (uint64_t)k, &bytes) || bytes > SIZE_MAX)
        return 0;
    return (size_t)bytes;
}

void kern_quant_act(const tk_kernels *K, tk_dtype wtype, tk_layout layout, const float *x, void *xq,
                    int64_t k) {
    switch (kern_act_type(wtype, layout)) {
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

/* ---- the per-ISA tables ------------------------------------------------------------ */

/* The reference dequantizers for the block types; F16 and BF16 vary per ISA. */
#define DEQUANT_BLOCKS                                                                                       \
    [TK_DTYPE_F32] = kern_dequant_f32_ref, [TK_DTYPE_Q8_0] = kern_dequant_q8_0_ref,                          \
    [TK_DTYPE_Q4_0] = kern_dequant_q4_0_ref, [TK_DTYPE_Q4_K] = kern_dequant_q4_k_ref,                        \
    [TK_DTYPE_Q6_K] = kern_dequant_q6_k_ref, [TK_DTYPE_Q8_K] = kern_dequant_q8_k_ref

static const tk_kernels KERNELS_SCALAR = {
    .isa = TK_ISA_SCALAR,
    .quant_q8_0 = kern_quant_q8_0_ref,
    .quant_q8_k = kern_quant_q8_k_ref,
    .rmsnorm = kern_rmsnorm_ref,
    .add = kern_add_ref,
    .silu_mul = kern_silu_mul_ref,
    .dequant_row =
        {DEQUANT_BLOCKS, [TK_DTYPE_F16] = kern_dequant_f16_ref, [TK_DTYPE_BF16] = kern_dequant_bf16_ref},
    .attn = kv_attn_ref,
    .attn_part = kv_attn_part_ref,
    .attn_own = kv_attn_own_ref,
    .attn_lanes = 1,
    .kv_to_f16 = kv_to_f16_ref,
    .kv_quant_token = kv_quant_token_ref,
    .kv_quant_chan = kv_quant_chan_ref,
    .kv_requant_chan = kv_requant_chan_ref,
    .kv_requant_cols = kv_requant_cols_ref,
};

#if defined(__x86_64__)
/* AVX-VNNI's table is AVX2's but for its int8 gemvs (the weight table) and
 * its attention, which dots int8 K against int8 queries. */
#define KERNELS_AVX2_ROWS                                                                                    \
    .quant_q8_0 = kern_quant_q8_0_avx2, .quant_q8_k = kern_quant_q8_k_avx2, .rmsnorm = kern_rmsnorm_avx2,    \
    .add = kern_add_avx2, .silu_mul = kern_silu_mul_avx2,                                                    \
    .dequant_row =                                                                                           \
        {DEQUANT_BLOCKS, [TK_DTYPE_F16] = kern_dequant_f16_avx2, [TK_DTYPE_BF16] = kern_dequant_bf16_avx2},  \
    .attn_lanes = 8, .kv_to_f16 = kv_to_f16_avx2, .kv_quant_token = kv_quant_token_avx2,                     \
    .kv_quant_chan = kv_quant_chan_avx2, .kv_requant_chan = kv_requant_chan_avx2,                            \
    .kv_requant_cols = kv_requant_cols_avx2

static const tk_kernels KERNELS_AVX2 = {
    .isa = TK_ISA_AVX2,
    KERNELS_AVX2_ROWS,
    .attn = kv_attn_avx2,
    .attn_part = kv_attn_part_avx2,
    .attn_own = kv_attn_own_avx2,
};
static const tk_kernels KERNELS_AVXVNNI = {
    .isa = TK_ISA_AVXVNNI,
    KERNELS_AVX2_ROWS,
    .attn = kv_attn_avxvnni,
    .attn_part = kv_attn_part_avxvnni,
    .attn_own = kv_attn_own_avxvnni,
    .attn_q8 = true,
};
#undef KERNELS_AVX2_ROWS

static const tk_kernels KERNELS_AVX512 = {
    .isa = TK_ISA_AVX512,
    .quant_q8_0 = kern_quant_q8_0_avx512,
    .quant_q8_k = kern_quant_q8_k_avx512,
    .rmsnorm = kern_rmsnorm_avx512,
    .add = kern_add_avx512,
    .silu_mul = kern_silu_mul_avx512,
    .dequant_row = {DEQUANT_BLOCKS, [TK_DTYPE_F16] = kern_dequant_f16_avx512,
                    [TK_DTYPE_BF16] = kern_dequant_bf16_avx512},
    .attn = kv_attn_avx512,
    .attn_part = kv_attn_part_avx512,
    .attn_own = kv_attn_own_avx512,
    .attn_lanes = 16,
    .attn_q8 = true,
    .kv_to_f16 = kv_to_f16_avx512,
    .kv_quant_token = kv_quant_token_avx512,
    .kv_quant_chan = kv_quant_chan_avx512,
    .kv_requant_chan = kv_requant_chan_avx512,
    .kv_requant_cols = kv_requant_cols_avx512,
};
#endif

const tk_kernels *kernels_get(tk_isa isa) {
#if defined(__x86_64__)
    switch (isa) {
    case TK_ISA_AVX512:
        return &KERNELS_AVX512;
    case TK_ISA_AVXVNNI:
        return &KERNELS_AVXVNNI;
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

tk_isa kernels_top_isa(void) { return TOP_ISA; }

/* The level whose attention runs where level l's does not take a head_dim:
 * below AVX-512 that is AVX2, since an AVX-512 CPU may lack AVX-VNNI (cpu.h). */
static int attn_below(int l) { return l == TK_ISA_AVX512 ? TK_ISA_AVX2 : l - 1; }

kv_attn_fn kern_attn_for(tk_isa isa, int head_dim, tk_isa *level) {
    int l = (int)isa > (int)TOP_ISA ? (int)TOP_ISA : (int)isa;
    /* down past levels that do not take head_dim, and past those that run the
     * level below's attention, so *level names the kernel */
    while (l > TK_ISA_SCALAR && (head_dim <= 0 || head_dim % kernels_get((tk_isa)l)->attn_lanes ||
                                 kernels_get((tk_isa)l)->attn == kernels_get((tk_isa)attn_below(l))->attn))
        l = attn_below(l);
    if (l < TK_ISA_SCALAR) l = TK_ISA_SCALAR;
    if (level) *level = (tk_isa)l;
    return kernels_get((tk_isa)l)->attn;
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
