/* Stage timing of a forward step, for `tokamak profile`. The forward pass
 * marks the end of each piece of work on every thread; time since the
 * thread's previous mark goes to the stage the mark names. With no profile
 * attached (the default) a mark is one NULL check per stage, never per token.
 *
 * Each thread owns one cache-line aligned row, so marks never share a line.
 * The caller reads the rows between steps (pool_run has returned). */
#ifndef TK_MODEL_FWD_PROF_H
#define TK_MODEL_FWD_PROF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "core/clock.h"
#include "kernels/kernels.h"

typedef enum fwd_stage {
    FWD_ST_PLAN = 0, /* the step's token tables and checks, before the pool runs */
    FWD_ST_EMBED,    /* embedding rows of the step's tokens */
    FWD_ST_NORM,     /* RMSNorm and the activation quantization after it */
    FWD_ST_QKV,      /* q, k, v projections */
    FWD_ST_ROPE,     /* bias, QK-norm, RoPE */
    FWD_ST_KV_STORE, /* new K and V into the paged cache */
    FWD_ST_ATTN,     /* attention over the paged KV (and its output quantization) */
    FWD_ST_O,        /* output projection */
    FWD_ST_RESID,    /* residual adds */
    FWD_ST_GATE_UP,  /* gate and up projections */
    FWD_ST_ACT,      /* silu(gate) * up and its quantization */
    FWD_ST_DOWN,     /* down projection */
    FWD_ST_LM_HEAD,  /* the output (vocabulary) projection */
    FWD_ST_WAIT,     /* inside barriers, and the end of the run */
    FWD_ST_COUNT
} fwd_stage;

typedef struct fwd_prof_thread {
    uint64_t last, last_cpu;       /* the thread's previous mark: wall and own CPU time, ns */
    uint64_t start, start_cpu;     /* the start of its part of the step: wall and CPU time, ns */
    uint64_t ns[FWD_ST_COUNT];     /* wall time accumulated since the caller last cleared */
    uint64_t cpu_ns[FWD_ST_COUNT]; /* with stage_cpu, the thread's CPU time in the same spans:
                                    * less than ns when it was descheduled (a loaded machine) */
    uint64_t part_ns, part_cpu_ns; /* its parts of the steps (start to end), wall and CPU time */
} __attribute__((aligned(64))) fwd_prof_thread;

/* rows: one per pool thread (pool_size). The thread's CPU clock
 * (CLOCK_THREAD_CPUTIME_ID) is a system call, ~1.3 us on a VM measured
 * here, against ~25 ns for the wall clock (vDSO): read at every mark, it
 * added ~0.6 ms to a 12-25 ms decode step (~500 marks per thread), so it is
 * read at the start and end of each thread's part of a step, and at every
 * mark only with stage_cpu. */
typedef struct fwd_prof {
    int n_threads;
    bool stage_cpu; /* each stage's CPU time too (cpu_ns) */
    fwd_prof_thread *rows;
    uint64_t steps;    /* steps run with this profile attached */
    uint64_t barriers; /* pool barriers passed in those steps */
} fwd_prof;

/* What a stage reads (weights and KV) and computes in one step, for its floor:
 * max(bytes / bandwidth, ops / peak), with the int8 peak where the stage's
 * multiply-adds run on quantized activations, the BF16 dot peak where they
 * run as vdpbf16ps, else the fp32 one (kern_peak). */
typedef struct fwd_stage_cost {
    uint64_t bytes;
    double ops; /* a multiply-add counts 2 */
    tk_peak peak;
} fwd_stage_cost;

/* The shape of a step: n_tok tokens, n_out of them wanted (their logits; the
 * last layer's attention, output projection and FFN run for those alone),
 * kv_tokens positions of context read (the sum over sequences of pos0 + n),
 * attn_pairs (query, position) pairs of one layer's attention (the sum over
 * tokens of their position + 1) and attn_pairs_out those of the wanted
 * tokens. With own-block records (kv_attn_own_block) the kv_store stage
 * reads own_tokens of those positions (a sequence's, from the start of its
 * first token's block: its records reach them first) and does own_pairs of
 * every layer's pairs (a query's, from the start of its own block), and the
 * attention stage the rest; 0 without records. untrimmed: the last layer
 * runs for every token (the unfused plan, or an observer). */
typedef struct fwd_step_shape {
    int n_tok, n_out;
    uint64_t kv_tokens, attn_pairs, attn_pairs_out;
    uint64_t own_tokens, own_pairs, own_pairs_out;
    bool untrimmed;
} fwd_step_shape;

/* Adds to *sh one sequence of n tokens from position pos0, its last
 * n_logits wanted; block: the KV block size when queries read their own
 * block through records, else 0. */
void fwd_step_shape_add(fwd_step_shape *sh, int n, int pos0, int n_logits, int block);

struct tk_model;
/* Costs of every stage of the fused plan; the bytes add up to what
 * fwd_last_bytes reports for the step. kv_bytes_tok: KV bytes per token of
 * context (all layers); kv_int8: INT8 KV (its dot products run in int8). */
void fwd_prof_costs(const struct tk_model *m, size_t kv_bytes_tok, bool kv_int8, const fwd_step_shape *sh,
                    fwd_stage_cost out[FWD_ST_COUNT]);

/* A stage's floor in seconds: max(bytes / (gbs GB/s), ops / its peak in
 * GOP/s, peak[c->peak]); a limit <= 0 leaves its part out. */
double fwd_stage_floor_s(const fwd_stage_cost *c, double gbs, const double peak[TK_PEAK_COUNT]);

/* "qkv", "attention", ... (stable: the JSON keys of tokamak profile). */
const char *fwd_stage_name(fwd_stage s);

/* The calling thread's CPU time, ns. */
static inline uint64_t fwd_prof_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Start thread ith's timeline (the beginning of its part of a step). The
 * CPU clock is read first, so its cost falls before the wall clock starts. */
static inline void fwd_prof_start(fwd_prof *p, int ith) {
    fwd_prof_thread *r = &p->rows[ith];
    r->start_cpu = r->last_cpu = fwd_prof_cpu_ns();
    r->start = r->last = tk_now_ns();
}

static inline void fwd_prof_mark(fwd_prof *p, int ith, fwd_stage s) {
    fwd_prof_thread *r = &p->rows[ith];
    const uint64_t now = tk_now_ns();
    r->ns[s] += now - r->last;
    r->last = now;
    if (p->stage_cpu) {
        const uint64_t cpu = fwd_prof_cpu_ns();
        r->cpu_ns[s] += cpu - r->last_cpu;
        r->last_cpu = cpu;
    }
}

/* End thread ith's part of the step (after its last mark). */
static inline void fwd_prof_end(fwd_prof *p, int ith) {
    fwd_prof_thread *r = &p->rows[ith];
    const uint64_t now = tk_now_ns();
    r->part_ns += now - r->start;
    r->part_cpu_ns += fwd_prof_cpu_ns() - r->start_cpu;
}

#endif
