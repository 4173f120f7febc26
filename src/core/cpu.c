#include "cpu.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

void cpu_detect(tk_cpu *c) {
    memset(c, 0, sizeof *c);
    unsigned a, b, cx, d;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    c->n_cores = n > 0 ? (int)n : 1;
    if (!__get_cpuid(1, &a, &b, &cx, &d)) return;
    bool osxsave = cx & (1u << 27), avx = cx & (1u << 28);
    c->fma = cx & (1u << 12);
    c->f16c = cx & (1u << 29);
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm_ok = avx && (xcr0 & 0x6) == 0x6;
    bool zmm_ok = ymm_ok && (xcr0 & 0xe0) == 0xe0;
    if (!ymm_ok) c->fma = c->f16c = false;
    if ((unsigned)__get_cpuid_max(0, NULL) >= 7u) {
        __cpuid_count(7, 0, a, b, cx, d);
        c->avx2 = ymm_ok && (b & (1u << 5));
        c->avx512f = zmm_ok && (b & (1u << 16));
        c->avx512bw = zmm_ok && (b & (1u << 30));
        c->avx512vl = zmm_ok && (b & (1u << 31));
        c->avx512vnni = zmm_ok && (cx & (1u << 11));
        __cpuid_count(7, 1, a, b, cx, d);
        c->avx512bf16 = zmm_ok && (a & (1u << 5));
        c->avxvnni = ymm_ok && (a & (1u << 4));
    }
    unsigned regs[12];
    if ((unsigned)__get_cpuid_max(0x80000000, NULL) >= 0x80000004u) {
        __get_cpuid(0x80000002, &regs[0], &regs[1], &regs[2], &regs[3]);
        __get_cpuid(0x80000003, &regs[4], &regs[5], &regs[6], &regs[7]);
        __get_cpuid(0x80000004, &regs[8], &regs[9], &regs[10], &regs[11]);
        memcpy(c->brand, regs, 48);
        c->brand[48] = 0;
        /* trim leading spaces */
        char *s = c->brand;
        while (*s == ' ') s++;
        memmove(c->brand, s, strlen(s) + 1);
    }
}
#else
void cpu_detect(tk_cpu *c) {
    memset(c, 0, sizeof *c);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    c->n_cores = n > 0 ? (int)n : 1;
}
#endif

bool cpu_has_isa(const tk_cpu *c, tk_isa isa) {
    bool avx2 = c->avx2 && c->fma && c->f16c;
    switch (isa) {
    case TK_ISA_SCALAR:
        return true;
    case TK_ISA_AVX2:
        return avx2;
    case TK_ISA_AVXVNNI:
        return avx2 && c->avxvnni;
    case TK_ISA_AVX512:
        return avx2 && c->avx512f && c->avx512bw && c->avx512vl && c->avx512vnni;
    default:
        return false;
    }
}

tk_isa cpu_best_isa(const tk_cpu *c) {
    int l = TK_ISA_COUNT - 1;
    while (l > TK_ISA_SCALAR && !cpu_has_isa(c, (tk_isa)l)) l--;
    return (tk_isa)l;
}

tk_isa cpu_isa_from_env(const tk_cpu *c) {
    tk_isa best = cpu_best_isa(c);
    const char *s = getenv("TOKAMAK_ISA");
    if (!s || !*s) return best;
    tk_isa want;
    if (!strcmp(s, "scalar"))
        want = TK_ISA_SCALAR;
    else if (!strcmp(s, "avx2"))
        want = TK_ISA_AVX2;
    else if (!strcmp(s, "avxvnni"))
        want = TK_ISA_AVXVNNI;
    else if (!strcmp(s, "avx512"))
        want = TK_ISA_AVX512;
    else {
        tk_log_warn("TOKAMAK_ISA=%s is not scalar|avx2|avxvnni|avx512; using %s", s, cpu_isa_name(best));
        return best;
    }
    if (!cpu_has_isa(c, want)) {
        tk_log_warn("TOKAMAK_ISA=%s is not supported by this CPU; using %s", s, cpu_isa_name(best));
        return best;
    }
    return want;
}

const char *cpu_isa_name(tk_isa isa) {
    switch (isa) {
    case TK_ISA_AVX512:
        return "avx512";
    case TK_ISA_AVXVNNI:
        return "avxvnni";
    case TK_ISA_AVX2:
        return "avx2";
    default:
        return "scalar";
    }
}

void cpu_features_str(const tk_cpu *c, char *buf, int n) {
    snprintf(buf, (size_t)n, "%s%s%s%s%s%s%s%s%s", c->avx2 ? "avx2 " : "", c->fma ? "fma " : "",
             c->f16c ? "f16c " : "", c->avx512f ? "avx512f " : "", c->avx512bw ? "avx512bw " : "",
             c->avx512vl ? "avx512vl " : "", c->avx512vnni ? "avx512vnni " : "",
             c->avx512bf16 ? "avx512bf16 " : "", c->avxvnni ? "avxvnni " : "");
    size_t l = strlen(buf);
    if (l && buf[l - 1] == ' ') buf[l - 1] = 0;
}
