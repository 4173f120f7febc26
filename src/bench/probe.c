/* Machine probes. The SIMD loops use per-function target attributes rather
 * than per-file ISA flags, so this file builds with the library's plain flags
 * and each loop runs only when cpu_detect says the CPU has it. */
#include "bench/probe.h"
#include "bench/stats.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define PROBE_X86 1
#else
#define PROBE_X86 0
#endif

/* Rep 0 is the warm-up (page walks, frequency ramp); the best of the rest wins
 * because interference (other processes, the hypervisor) only ever slows a
 * pass down. The read probe alternates two loops, plain loads and loads with
 * the kernels' software prefetch one distance ahead, and keeps the best pass
 * of either: the engine's weight stream may get either benefit. */
#define PROBE_REPS 10
/* The 8-row Q8_0 kernel's software prefetch distance (simd_body.h). */
#define PROBE_PREFETCH         2048
#define PROBE_MAX_THREADS      256
#define PROBE_BYTES_PER_THREAD ((size_t)256 << 20)
#define PROBE_BYTES_TOTAL      ((size_t)1 << 30)

typedef enum { PROBE_READ, PROBE_RUNS, PROBE_FMA, PROBE_INT8, PROBE_BF16 } probe_kind;

typedef struct probe_shared {
    probe_kind kind;
    tk_isa isa;
    int nth;
    size_t bytes; /* per thread, for PROBE_READ and PROBE_RUNS */
    size_t run;   /* bytes of a run, for PROBE_RUNS */
    long iters;   /* per thread, for the compute probes */
    pthread_barrier_t bar;
    atomic_int state; /* 0: wait, 1: go, 2: abort (a thread could not start) */
    atomic_int failed;
} probe_shared;

typedef struct probe_thread {
    probe_shared *sh;
    int ith;
    double t0[PROBE_REPS], t1[PROBE_REPS]; /* seconds, per rep */
    double work;                           /* bytes or ops of one rep */
    uint64_t sink;                         /* keeps the loops' results alive */
} probe_thread;

/* ---- read loops ---------------------------------------------------------- */

typedef uint64_t u64x2 __attribute__((vector_size(16)));

static uint64_t read_plain(const unsigned char *p, size_t n) {
    u64x2 a = {0, 0}, b = a, c = a, d = a;
    for (size_t i = 0; i + 64 <= n; i += 64) {
        const u64x2 *v = (const u64x2 *)(const void *)(p + i);
        a ^= v[0];
        b ^= v[1];
        c ^= v[2];
        d ^= v[3];
    }
    u64x2 s = a ^ b ^ c ^ d;
    return s[0] ^ s[1];
}

#if PROBE_X86
/* pf: NULL, or what to ask for line by line in step with the reads (the
 * line at pf + i while reading p + i). */
__attribute__((target("avx2"))) static uint64_t read_avx2(const unsigned char *p, size_t n,
                                                          const unsigned char *pf) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        if (pf)
            for (int o = 0; o < 128; o += 64)
                _mm_prefetch((const char *)((uintptr_t)pf + i + o), _MM_HINT_T0);
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(const void *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(const void *)(p + i + 32)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(const void *)(p + i + 64)));
        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(const void *)(p + i + 96)));
    }
    __m256i s = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return (uint64_t)_mm256_extract_epi64(s, 0) ^ (uint64_t)_mm256_extract_epi64(s, 3);
}

__attribute__((target("avx512f"))) static uint64_t read_avx512(const unsigned char *p, size_t n,
                                                               const unsigned char *pf) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        if (pf)
            for (int o = 0; o < 256; o += 64)
                _mm_prefetch((const char *)((uintptr_t)pf + i + o), _MM_HINT_T0);
        a = _mm512_xor_si512(a, _mm512_load_si512((const void *)(p + i)));
        b = _mm512_xor_si512(b, _mm512_load_si512((const void *)(p + i + 64)));
        c = _mm512_xor_si512(c, _mm512_load_si512((const void *)(p + i + 128)));
        d = _mm512_xor_si512(d, _mm512_load_si512((const void *)(p + i + 192)));
    }
    __m512i s = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    uint64_t lanes[8], x = 0;
    _mm512_storeu_si512((void *)lanes, s);
    for (int k = 0; k < 8; k++) x ^= lanes[k];
    return x;
}
#endif

static uint64_t read_once(tk_isa isa, const unsigned char *p, size_t n, const unsigned char *pf) {
#if PROBE_X86
    if (isa == TK_ISA_AVX512) return read_avx512(p, n, pf);
    if (isa >= TK_ISA_AVX2) return read_avx2(p, n, pf); /* avxvnni too */
#endif
    (void)isa;
    (void)pf;
    return read_plain(p, n);
}

/* The runs of p (run bytes each) in the order given, each read whole while
 * the next one is asked for line by line in step (as the attention kernels
 * read a context's scattered KV blocks). */
static uint64_t read_runs(tk_isa isa, const unsigned char *p, const uint32_t *order, size_t n_runs,
                          size_t run) {
    uint64_t x = 0;
    for (size_t k = 0; k < n_runs; k++) {
        const unsigned char *next = k + 1 < n_runs ? p + (size_t)order[k + 1] * run : NULL;
        x ^= read_once(isa, p + (size_t)order[k] * run, run, next);
    }
    return x;
}

/* ---- compute loops --------------------------------------------------------- */

/* The int8 loops' operands: every u8 is PROBE_U8 and every s8 PROBE_S8. */
#define PROBE_U8          3
#define PROBE_S8          (-2)
#define PROBE_AVX2_ACC    8  /* accumulators of int8_avx2, 8 lanes each */
#define PROBE_VNNI_ACC    12 /* accumulators of int8_avxvnni (8 lanes) and int8_avx512 (16) */
#define PROBE_PLAIN_LANES 16

uint32_t probe_lanes_sum(const int32_t *lanes, int n) {
    uint32_t s = 0;
    for (int k = 0; k < n; k++) s += (uint32_t)lanes[k];
    return s;
}
/* Twelve independent chains hide the FMA latency (4-5 cycles) on two ports. */

typedef float f32x4 __attribute__((vector_size(16)));

/* Named accumulators rather than an array: at -O2 GCC keeps an array in
 * memory, and the store-load chain would be timed instead of the FMA units. */
static uint64_t fma_plain(long iters) {
    f32x4 a0 = {1, 1, 1, 1}, a1 = a0 + 1, a2 = a1 + 1, a3 = a2 + 1, a4 = a3 + 1, a5 = a4 + 1, a6 = a5 + 1,
          a7 = a6 + 1;
    const f32x4 m = {0.999f, 0.999f, 0.999f, 0.999f}, c = {0.001f, 0.001f, 0.001f, 0.001f};
    for (long i = 0; i < iters; i++) {
        a0 = a0 * m + c, a1 = a1 * m + c, a2 = a2 * m + c, a3 = a3 * m + c;
        a4 = a4 * m + c, a5 = a5 * m + c, a6 = a6 * m + c, a7 = a7 * m + c;
    }
    f32x4 s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    return (uint64_t)(s[0] * 1000.0f);
}

#if PROBE_X86
__attribute__((target("avx2,fma"))) static uint64_t fma_avx2(long iters) {
    __m256 a0 = _mm256_set1_ps(1), a1 = _mm256_set1_ps(2), a2 = _mm256_set1_ps(3), a3 = _mm256_set1_ps(4);
    __m256 a4 = _mm256_set1_ps(5), a5 = _mm256_set1_ps(6), a6 = _mm256_set1_ps(7), a7 = _mm256_set1_ps(8);
    __m256 a8 = _mm256_set1_ps(9), a9 = _mm256_set1_ps(10), a10 = _mm256_set1_ps(11),
           a11 = _mm256_set1_ps(12);
    const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
    for (long i = 0; i < iters; i++) {
        a0 = _mm256_fmadd_ps(a0, m, c), a1 = _mm256_fmadd_ps(a1, m, c), a2 = _mm256_fmadd_ps(a2, m, c);
        a3 = _mm256_fmadd_ps(a3, m, c), a4 = _mm256_fmadd_ps(a4, m, c), a5 = _mm256_fmadd_ps(a5, m, c);
        a6 = _mm256_fmadd_ps(a6, m, c), a7 = _mm256_fmadd_ps(a7, m, c), a8 = _mm256_fmadd_ps(a8, m, c);
        a9 = _mm256_fmadd_ps(a9, m, c), a10 = _mm256_fmadd_ps(a10, m, c), a11 = _mm256_fmadd_ps(a11, m, c);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    return (uint64_t)(_mm256_cvtss_f32(s) * 1000.0f);
}

__attribute__((target("avx512f"))) static uint64_t fma_avx512(long iters) {
    __m512 a0 = _mm512_set1_ps(1), a1 = _mm512_set1_ps(2), a2 = _mm512_set1_ps(3), a3 = _mm512_set1_ps(4);
    __m512 a4 = _mm512_set1_ps(5), a5 = _mm512_set1_ps(6), a6 = _mm512_set1_ps(7), a7 = _mm512_set1_ps(8);
    __m512 a8 = _mm512_set1_ps(9), a9 = _mm512_set1_ps(10), a10 = _mm512_set1_ps(11),
           a11 = _mm512_set1_ps(12);
    const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
    for (long i = 0; i < iters; i++) {
        a0 = _mm512_fmadd_ps(a0, m, c), a1 = _mm512_fmadd_ps(a1, m, c), a2 = _mm512_fmadd_ps(a2, m, c);
        a3 = _mm512_fmadd_ps(a3, m, c), a4 = _mm512_fmadd_ps(a4, m, c), a5 = _mm512_fmadd_ps(a5, m, c);
        a6 = _mm512_fmadd_ps(a6, m, c), a7 = _mm512_fmadd_ps(a7, m, c), a8 = _mm512_fmadd_ps(a8, m, c);
        a9 = _mm512_fmadd_ps(a9, m, c), a10 = _mm512_fmadd_ps(a10, m, c), a11 = _mm512_fmadd_ps(a11, m, c);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return (uint64_t)(_mm512_reduce_add_ps(s) * 1000.0f);
}

/* vdpbf16ps (AVX512-BF16), as P16R's gemv runs it where it pays
 * (kern_bf16_dot_hw): 12 independent chains, each step 16 lanes of two
 * multiply-adds. The pairs are 2^-10 (BF16 0x3a80), so the sums stay small
 * normal numbers (2^-19 a step). */
__attribute__((target("avx512f,avx512bf16"))) static uint64_t bf16dot_avx512(long iters) {
    const __m512bh w = (__m512bh)_mm512_set1_epi32(0x3a803a80);
    __m512 a[12];
    for (int k = 0; k < 12; k++) a[k] = _mm512_set1_ps((float)k);
    for (long i = 0; i < iters; i++) {
        a[0] = _mm512_dpbf16_ps(a[0], w, w), a[1] = _mm512_dpbf16_ps(a[1], w, w);
        a[2] = _mm512_dpbf16_ps(a[2], w, w), a[3] = _mm512_dpbf16_ps(a[3], w, w);
        a[4] = _mm512_dpbf16_ps(a[4], w, w), a[5] = _mm512_dpbf16_ps(a[5], w, w);
        a[6] = _mm512_dpbf16_ps(a[6], w, w), a[7] = _mm512_dpbf16_ps(a[7], w, w);
        a[8] = _mm512_dpbf16_ps(a[8], w, w), a[9] = _mm512_dpbf16_ps(a[9], w, w);
        a[10] = _mm512_dpbf16_ps(a[10], w, w), a[11] = _mm512_dpbf16_ps(a[11], w, w);
    }
    __m512 s = a[0];
    for (int k = 1; k < 12; k++) s = _mm512_add_ps(s, a[k]);
    return (uint64_t)(_mm512_reduce_add_ps(s) * 1000.0f);
}

/* The int8 loops are written in asm: their accumulators start equal and take
 * equal operands, so a compiler may prove the chains equal and keep one
 * (timing one instruction's latency), and barriers that stop it (empty asms
 * that may change each accumulator) made GCC 12 shuffle the chains through
 * register moves and stack stores every iteration: the AVX-VNNI loop ran at
 * half the rate of `vpdpbusd` (8 of them beside 15 moves and 2 stores). In asm
 * each iteration is exactly its dot instructions, one per chain. iters >= 1.
 * AT&T order: `vpdpbusd b, a, acc` adds the u8 x s8 products of a and b. */
#define PROBE_DOT(ins, k) ins " %[b], %[a], %[a" #k "]\n\t"
#define PROBE_DOT12(ins)                                                                                     \
    "1:\n\t" PROBE_DOT(ins, 0) PROBE_DOT(ins, 1) PROBE_DOT(ins, 2) PROBE_DOT(ins, 3) PROBE_DOT(ins, 4)       \
        PROBE_DOT(ins, 5) PROBE_DOT(ins, 6) PROBE_DOT(ins, 7) PROBE_DOT(ins, 8) PROBE_DOT(ins, 9)            \
            PROBE_DOT(ins, 10) PROBE_DOT(ins, 11) "dec %[n]\n\tjnz 1b"
#define PROBE_ACC12(c)                                                                                       \
    [a0] c(a0), [a1] c(a1), [a2] c(a2), [a3] c(a3), [a4] c(a4), [a5] c(a5), [a6] c(a6), [a7] c(a7),          \
        [a8] c(a8), [a9] c(a9), [a10] c(a10), [a11] c(a11)

/* u8 x s8 pairs summed to i16 (vpmaddubsw), then to i32 (vpmaddwd with
 * ones), then added into the accumulator: the three operations per 32
 * products of AVX2's int8 dot (the kernels' signed weights add a `vpsignb`
 * per token and vector, docs/kernels.md). Eight chains through four
 * temporaries: 15 of the 16 registers. */
#define PROBE_MADD(t, k)                                                                                     \
    "vpmaddubsw %[b], %[a], %[t" #t "]\n\tvpmaddwd %[ones], %[t" #t "], %[t" #t "]\n\tvpaddd %[t" #t         \
    "], %[a" #k "], %[a" #k "]\n\t"
__attribute__((target("avx2"))) static uint32_t int8_avx2(long iters) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m256i t0, t1, t2, t3;
    const __m256i a = _mm256_set1_epi8(PROBE_U8), b = _mm256_set1_epi8(PROBE_S8), ones = _mm256_set1_epi16(1);
    if (iters > 0)
        __asm__ volatile("1:\n\t" PROBE_MADD(0, 0) PROBE_MADD(1, 1) PROBE_MADD(2, 2) PROBE_MADD(3, 3)
                             PROBE_MADD(0, 4) PROBE_MADD(1, 5) PROBE_MADD(2, 6)
                                 PROBE_MADD(3, 7) "dec %[n]\n\tjnz 1b"
                         : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4),
                           [a5] "+x"(a5), [a6] "+x"(a6), [a7] "+x"(a7), [t0] "=&x"(t0), [t1] "=&x"(t1),
                           [t2] "=&x"(t2), [t3] "=&x"(t3), [n] "+r"(iters)
                         : [a] "x"(a), [b] "x"(b), [ones] "x"(ones)
                         : "cc");
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                 _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)));
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i *)(void *)lanes, s);
    return probe_lanes_sum(lanes, 8);
}

/* The AVX-VNNI dot: one VEX `vpdpbusd` per 32 pairs, twelve chains (two
 * issue per cycle at a latency of ~4 cycles on recent cores). */
__attribute__((target("avx2,avxvnni"))) static uint32_t int8_avxvnni(long iters) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m256i a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    const __m256i a = _mm256_set1_epi8(PROBE_U8), b = _mm256_set1_epi8(PROBE_S8);
    if (iters > 0)
        __asm__ volatile(PROBE_DOT12("%{vex%} vpdpbusd")
                         : PROBE_ACC12("+x"), [n] "+r"(iters)
                         : [a] "x"(a), [b] "x"(b)
                         : "cc");
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                 _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)));
    s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_add_epi32(a8, a9), _mm256_add_epi32(a10, a11)));
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i *)(void *)lanes, s);
    return probe_lanes_sum(lanes, 8);
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static uint32_t int8_avx512(long iters) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m512i a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    const __m512i a = _mm512_set1_epi8(PROBE_U8), b = _mm512_set1_epi8(PROBE_S8);
    if (iters > 0)
        __asm__ volatile(PROBE_DOT12("vpdpbusd")
                         : PROBE_ACC12("+v"), [n] "+r"(iters)
                         : [a] "v"(a), [b] "v"(b)
                         : "cc");
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                 _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
    int32_t lanes[16];
    _mm512_storeu_si512((void *)lanes, s);
    return probe_lanes_sum(lanes, 16);
}
#endif

/* The lanes wrap as the SIMD ones do (unsigned arithmetic: defined in C). */
static uint32_t int8_plain(long iters) {
    uint32_t acc[PROBE_PLAIN_LANES] = {0};
    int8_t a[PROBE_PLAIN_LANES], b[PROBE_PLAIN_LANES];
    for (int k = 0; k < PROBE_PLAIN_LANES; k++) a[k] = (int8_t)(k + 1), b[k] = (int8_t)(3 - k);
    for (long i = 0; i < iters; i++) {
        __asm__ volatile("" : : "r"(a), "r"(b) : "memory");
        for (int k = 0; k < PROBE_PLAIN_LANES; k++) acc[k] += (uint32_t)(a[k] * b[k]);
    }
    uint32_t s = 0;
    for (int k = 0; k < PROBE_PLAIN_LANES; k++) s += acc[k];
    return s;
}

uint32_t probe_int8_pass(tk_isa isa, long iters) {
#if PROBE_X86
    if (isa == TK_ISA_AVX512) return int8_avx512(iters);
    if (isa == TK_ISA_AVXVNNI) return int8_avxvnni(iters);
    if (isa == TK_ISA_AVX2) return int8_avx2(iters);
#endif
    (void)isa;
    return int8_plain(iters);
}

uint32_t probe_int8_expect(tk_isa isa, long iters) {
    int64_t per_iter = 0; /* summed over every lane of every accumulator */
    if (PROBE_X86 && isa == TK_ISA_AVX512)
        per_iter = (int64_t)PROBE_VNNI_ACC * 16 * 4 * PROBE_U8 * PROBE_S8;
    else if (PROBE_X86 && isa == TK_ISA_AVXVNNI)
        per_iter = (int64_t)PROBE_VNNI_ACC * 8 * 4 * PROBE_U8 * PROBE_S8;
    else if (PROBE_X86 && isa == TK_ISA_AVX2)
        per_iter = (int64_t)PROBE_AVX2_ACC * 8 * 4 * PROBE_U8 * PROBE_S8;
    else
        for (int k = 0; k < PROBE_PLAIN_LANES; k++) per_iter += (int64_t)(k + 1) * (3 - k);
    return (uint32_t)((uint64_t)per_iter * (uint64_t)iters);
}

/* Ops (multiply-add = 2) one iteration of each loop performs. */
static double compute_ops_per_iter(probe_kind kind, tk_isa isa) {
    if (kind == PROBE_BF16) return 12 * 16 * 2 * 2;
    if (kind == PROBE_FMA)
        return isa == TK_ISA_AVX512 ? 12 * 16 * 2 : isa >= TK_ISA_AVX2 ? 12 * 8 * 2 : 8 * 4 * 2;
    return isa == TK_ISA_AVX512    ? PROBE_VNNI_ACC * 64 * 2
           : isa == TK_ISA_AVXVNNI ? PROBE_VNNI_ACC * 32 * 2
           : isa == TK_ISA_AVX2    ? PROBE_AVX2_ACC * 32 * 2
                                   : 16 * 2;
}

static uint64_t compute_once(probe_kind kind, tk_isa isa, long iters) {
#if PROBE_X86
    if (kind == PROBE_BF16) return bf16dot_avx512(iters); /* probe_peak_gflops_bf16 checked the CPU */
    if (kind == PROBE_FMA && isa == TK_ISA_AVX512) return fma_avx512(iters);
    if (kind == PROBE_FMA && isa >= TK_ISA_AVX2) return fma_avx2(iters);
#endif
    return kind == PROBE_FMA ? fma_plain(iters) : probe_int8_pass(isa, iters);
}

/* ---- threads --------------------------------------------------------------- */

static double now_s(void) { return (double)tk_now_ns() * 1e-9; }

static void *probe_main(void *arg) {
    probe_thread *t = arg;
    probe_shared *sh = t->sh;
    unsigned char *buf = NULL;
    int st;
    while ((st = atomic_load(&sh->state)) == 0) sched_yield();
    if (st == 2) return NULL;
    uint32_t *order = NULL;
    size_t n_runs = 0;
    if (sh->kind == PROBE_READ || sh->kind == PROBE_RUNS) {
        /* Allocated and written by the thread that reads it, so its pages are
         * local to that core's NUMA node; non-zero so no page is the shared
         * zero page. */
        /* Huge-page backed, as the model's weights are (model_make_resident),
         * so the roofline compares like with like. */
        buf = tk_alloc_huge(sh->bytes, 0);
        if (buf)
            memset(buf, 0x5a + t->ith, sh->bytes);
        else
            atomic_store(&sh->failed, 1);
        t->work = (double)sh->bytes;
        if (sh->kind == PROBE_RUNS) {
            /* the thread's runs in a shuffled order (its own seed) */
            n_runs = sh->bytes / sh->run;
            t->work = (double)(n_runs * sh->run);
            order = tk_malloc(n_runs * sizeof *order);
            if (order) {
                uint64_t z = 0x9e3779b97f4a7c15ull * (uint64_t)(t->ith + 1);
                for (size_t k = 0; k < n_runs; k++) order[k] = (uint32_t)k;
                for (size_t k = n_runs - 1; k > 0; k--) {
                    z ^= z << 13, z ^= z >> 7, z ^= z << 17;
                    const size_t j = (size_t)(z % (k + 1));
                    const uint32_t tmp = order[k];
                    order[k] = order[j], order[j] = tmp;
                }
            } else {
                atomic_store(&sh->failed, 1);
            }
        }
    } else {
        t->work = (double)sh->iters * compute_ops_per_iter(sh->kind, sh->isa);
    }
    pthread_barrier_wait(&sh->bar);
    bool run = atomic_load(&sh->failed) == 0;
    for (int r = 0; r < PROBE_REPS; r++) {
        pthread_barrier_wait(&sh->bar);
        t->t0[r] = now_s();
        if (run)
            t->sink ^= sh->kind == PROBE_READ
                           ? read_once(sh->isa, buf, sh->bytes, r % 2 == 0 ? buf + PROBE_PREFETCH : NULL)
                       : sh->kind == PROBE_RUNS ? read_runs(sh->isa, buf, order, n_runs, sh->run)
                                                : compute_once(sh->kind, sh->isa, sh->iters);
        t->t1[r] = now_s();
    }
    tk_free_huge(buf, sh->bytes);
    tk_free(order);
    return NULL;
}

/* Runs the probe on nth pinned threads; returns work per second of the best rep.
 * rates (may be NULL): each timed rep's work per second, PROBE_REPS - 1 of them. */
static double probe_run(probe_kind kind, int n_threads, size_t bytes, size_t run, long iters, double *rates) {
    tk_cpu cpu;
    cpu_detect(&cpu);
    int nth = n_threads > 0 ? n_threads : cpu.n_cores;
    if (nth > PROBE_MAX_THREADS) nth = PROBE_MAX_THREADS;
    probe_shared sh = {
        .kind = kind, .isa = cpu_isa_from_env(&cpu), .nth = nth, .bytes = bytes, .run = run, .iters = iters};
    atomic_init(&sh.failed, 0);
    atomic_init(&sh.state, 0);
    if (pthread_barrier_init(&sh.bar, NULL, (unsigned)nth) != 0) return 0;
    probe_thread *ts = tk_calloc((size_t)nth, sizeof *ts);
    pthread_t *tids = tk_calloc((size_t)nth, sizeof *tids);
    double best = 0;
    if (!ts || !tids) goto out;
    int started = 0;
    for (int i = 0; i < nth; i++) {
        ts[i].sh = &sh;
        ts[i].ith = i;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(i % cpu.n_cores, &set);
        pthread_attr_setaffinity_np(&attr, sizeof set, &set);
        int rc = pthread_create(&tids[i], &attr, probe_main, &ts[i]);
        if (rc != 0) /* pinning can be refused by a cpuset: try unpinned */
            rc = pthread_create(&tids[i], NULL, probe_main, &ts[i]);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        started++;
    }
    /* The barrier counts nth threads, so the started ones only pass the gate
     * once all of them exist; otherwise they leave without waiting on it. */
    atomic_store(&sh.state, started == nth ? 1 : 2);
    for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
    if (started < nth) goto out;
    if (atomic_load(&sh.failed)) goto out;
    double total = 0;
    for (int i = 0; i < nth; i++) total += ts[i].work;
    for (int r = 1; r < PROBE_REPS; r++) {
        double t0 = ts[0].t0[r], t1 = ts[0].t1[r];
        for (int i = 1; i < nth; i++) {
            if (ts[i].t0[r] < t0) t0 = ts[i].t0[r];
            if (ts[i].t1[r] > t1) t1 = ts[i].t1[r];
        }
        double rate = t1 > t0 ? total / (t1 - t0) : 0;
        if (rates) rates[r - 1] = rate;
        if (rate > best) best = rate;
    }
out:
    pthread_barrier_destroy(&sh.bar);
    tk_free(ts);
    tk_free(tids);
    return best;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The read probes' statistics over their timed passes. */
static void read_stats(probe_kind kind, int n_threads, size_t run, probe_stats *out) {
    tk_cpu cpu;
    cpu_detect(&cpu);
    int nth = n_threads > 0 ? n_threads : cpu.n_cores;
    if (nth > PROBE_MAX_THREADS) nth = PROBE_MAX_THREADS;
    size_t per = PROBE_BYTES_TOTAL / (size_t)nth;
    if (per > PROBE_BYTES_PER_THREAD) per = PROBE_BYTES_PER_THREAD;
    per &= ~(size_t)4095;
    double rates[PROBE_REPS - 1] = {0};
    int n = PROBE_REPS - 1;
    memset(out, 0, sizeof *out);
    if (probe_run(kind, nth, per, run, 0, rates) <= 0) return;
    qsort(rates, (size_t)n, sizeof rates[0], cmp_double);
    out->n = n;
    out->min = rates[0] * 1e-9;
    out->best = rates[n - 1] * 1e-9;
    out->median = stats_percentile_sorted(rates, (size_t)n, 50) * 1e-9;
}

void probe_read_bw_stats(int n_threads, probe_stats *out) { read_stats(PROBE_READ, n_threads, 0, out); }

void probe_read_runs_stats(int n_threads, size_t run_bytes, probe_stats *out) {
    memset(out, 0, sizeof *out);
    if (run_bytes < PROBE_RUN_MIN || run_bytes > PROBE_RUN_MAX || run_bytes % 256) return;
    read_stats(PROBE_RUNS, n_threads, run_bytes, out);
}

double probe_read_bw(int n_threads) {
    probe_stats s;
    probe_read_bw_stats(n_threads, &s);
    return s.best;
}

/* About 10-40 ms per rep on a 3 GHz core: long enough to time, short enough
 * that the whole probe stays well under a second. */
double probe_peak_gflops_f32(int n_threads) {
    return probe_run(PROBE_FMA, n_threads, 0, 0, 16000000, NULL) * 1e-9;
}

double probe_peak_gflops_bf16(int n_threads) {
#if PROBE_X86
    tk_cpu cpu;
    cpu_detect(&cpu);
    if (cpu.avx512bf16 && cpu_isa_from_env(&cpu) == TK_ISA_AVX512)
        return probe_run(PROBE_BF16, n_threads, 0, 0, 16000000, NULL) * 1e-9;
#else
    (void)n_threads;
#endif
    return 0;
}

double probe_peak_gops_int8(int n_threads) {
    return probe_run(PROBE_INT8, n_threads, 0, 0, 16000000, NULL) * 1e-9;
}

/* The integer in a /proc file, or fallback when it cannot be read. */
static long proc_long(const char *path, long fallback) {
    FILE *f = fopen(path, "r");
    if (!f) return fallback;
    long v;
    const bool ok = fscanf(f, "%ld", &v) == 1;
    fclose(f);
    return ok ? v : fallback;
}

bool probe_rt_throttled(int *runtime_us, int *period_us) {
    *runtime_us = *period_us = 0;
#if defined(__linux__)
    const int pol = sched_getscheduler(0);
    if (pol != SCHED_FIFO && pol != SCHED_RR) return false;
    const long rt = proc_long("/proc/sys/kernel/sched_rt_runtime_us", -1);
    const long per = proc_long("/proc/sys/kernel/sched_rt_period_us", -1);
    if (rt < 0 || per <= 0 || rt >= per || per > INT32_MAX) return false;
    *runtime_us = (int)rt;
    *period_us = (int)per;
    return true;
#else
    return false;
#endif
}

double probe_roofline_pct(double achieved_gbs, double probe_gbs, bool *shortfall) {
    bool over = probe_gbs > 0 && achieved_gbs > probe_gbs;
    if (shortfall) *shortfall = over;
    if (probe_gbs <= 0) return 0;
    return over ? 100.0 : 100.0 * achieved_gbs / probe_gbs;
}
