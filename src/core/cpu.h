/* CPU features, read once with cpuid; TOKAMAK_ISA=scalar|avx2|avxvnni|avx512 caps the level. */
#ifndef TK_CORE_CPU_H
#define TK_CORE_CPU_H

#include <stdbool.h>

/* Ordered by capability. AVXVNNI is AVX2 with the VEX-encoded vpdpbusd (Alder
 * Lake and later client cores, Sapphire Rapids, and VMs that hide AVX-512 but
 * pass AVX-VNNI through); an AVX-512 CPU may lack it (Ice Lake, Cascade Lake),
 * so whether a CPU runs a level is cpu_has_isa, not a comparison with the best. */
typedef enum tk_isa { TK_ISA_SCALAR = 0, TK_ISA_AVX2 = 1, TK_ISA_AVXVNNI = 2, TK_ISA_AVX512 = 3 } tk_isa;
#define TK_ISA_COUNT 4 /* levels, for tables indexed by tk_isa */

typedef struct tk_cpu {
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512vnni, avx512bf16;
    bool avxvnni;
    int n_cores; /* online logical CPUs */
    char brand[64];
} tk_cpu;

/* Fill *c from cpuid and the OS (XCR0 must enable the AVX/AVX-512 state). */
void cpu_detect(tk_cpu *c);
/* The best level the CPU supports: avx512 needs F+BW+VL+VNNI, avx2 needs AVX2+FMA+F16C,
 * avxvnni needs avx2's and AVX-VNNI. */
tk_isa cpu_best_isa(const tk_cpu *c);
/* Whether the CPU runs level isa's kernels. */
bool cpu_has_isa(const tk_cpu *c, tk_isa isa);
/* cpu_best_isa capped by TOKAMAK_ISA if set (an unknown or unsupported value is
 * ignored with a warning, never raised above what the CPU has). */
tk_isa cpu_isa_from_env(const tk_cpu *c);
const char *cpu_isa_name(tk_isa isa);
/* "avx2 fma f16c avx512f ..." for reports. */
void cpu_features_str(const tk_cpu *c, char *buf, int n);

#endif
