/* The weight kernels alone, by token count: what a matmul of n tokens reads
 * and computes per second with the model's own matrices, streamed from
 * memory the way a decode step reads them (every matrix of a kind once, its
 * rows split between the threads, a barrier after each), and over one small
 * matrix held in cache (the kernel's arithmetic ceiling at that count). The
 * point where the streamed rate falls below the cached one's is where a
 * kernel stops being bound by memory: the reason decode (few tokens) and
 * prefill (many) behave so differently. tokamak profile --kernels. */
#ifndef TK_BENCH_KBENCH_H
#define TK_BENCH_KBENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/pool.h"
#include "core/tensor.h"
#include "kernels/kernels.h"
#include "tokamak.h"

#define KB_MAX_TOKENS 256 /* the largest token count a row may ask for */
#define KB_MAX_COUNTS 16  /* token counts per run */

/* One (kernel, token count) row: medians over the rounds. */
typedef struct kb_row {
    tk_dtype type;
    tk_layout layout;
    tk_peak peak; /* the peak its multiply-adds are judged by (kern_peak) */
    int n_tok;
    int n_mat;          /* matrices of this kind in the model */
    uint64_t bytes;     /* one streamed pass: every matrix of the kind once */
    double ops;         /* one streamed pass (a multiply-add counts 2) */
    double gbs, gops;   /* streamed */
    double x_first;     /* the streamed rate over the first count's, per round (median) */
    uint64_t hot_bytes; /* the cached matrix's bytes (split between the threads) */
    double hot_gbs, hot_gops;
} kb_row;

/* Times every kind of matmul weight in m at the counts tok[0..n_counts)
 * (each 1..KB_MAX_TOKENS, n_counts 1..KB_MAX_COUNTS) on n_threads threads
 * (pinned to cores 0.. with pin, or to the CPU list cpus, as the engine's),
 * rounds times (the counts in turn within a round, in reverse order every
 * other round, so a machine whose speed drifts is spread over all of them),
 * and returns the rows, kinds in the order the model first uses them and
 * counts as given, in *rows (tk_free) and their number in *n_rows. */
tk_status kbench_run(const tk_model *m, int n_threads, bool pin, const char *cpus, const int *tok,
                     int n_counts, int rounds, kb_row **rows, int *n_rows);

/* Shared by the two sweeps (kbench.c, kbench_attn.c): the median of v[0,
 * n) (0 when out of memory); the sweep's thread pool, its threads pinned as
 * the engine's (to the CPU list cpus, else to cores 0.. with pin); n seeded
 * values in [-1, 1) from the state *s, which moves on. */
double kbench_median(const double *v, int n);
tk_status kbench_pool(int n_threads, bool pin, const char *cpus, tk_pool **out);
void kbench_fill(float *x, int64_t n, uint64_t *s);

/* The attention kernel alone, by the number of sequences decoding: one
 * query token each at context ctx over the paged KV (the model's layers,
 * heads and head_dim; the given KV type, scales and block size), as the
 * decode step's attention stage reads it: each thread takes its share of
 * the (sequence, kv head) units of a layer, a barrier after each layer, and
 * INT8 per-head KV reads up to the own block (its record folded last, taken
 * once at setup). Streamed: passes over sequences that take turns through a
 * pool of at least KB_ATTN_POOL bytes, so each pass reads memory, not the
 * cache; cached: one sequence's first layer at the context whose KV fits
 * KB_ATTN_HOT bytes a thread, again and again (the kernel's arithmetic at
 * that KV type). Their ratio says what binds attention on this machine. */
#define KB_ATTN_POOL ((uint64_t)512 << 20)
#define KB_ATTN_HOT  ((uint64_t)512 << 10)
#define KB_ATTN_MAX  ((uint64_t)4 << 30) /* a count whose sequences need more is left out */

typedef struct ka_row {
    int n_seq;          /* sequences decoding, one query token each */
    int end;            /* positions each query reads from the pool */
    uint64_t bytes;     /* one streamed pass: every layer's KV of n_seq sequences up to end */
    double ops;         /* one streamed pass (q.k and p.v, a multiply-add counts 2) */
    double gbs, gops;   /* streamed */
    double ns_pos;      /* streamed: ns per (position, kv head, layer) on one thread */
    int hot_end;        /* the cached pass's positions per query */
    uint64_t hot_bytes; /* the cached pass's KV, all threads */
    double hot_gbs, hot_ns_pos;
} ka_row;

/* Times the attention of m's geometry at each count seq[0..n_counts) (1..
 * KB_MAX_TOKENS sequences; a count whose sequences' KV would pass
 * KB_ATTN_MAX is left out) at context ctx (1..65536), rounds times (the
 * counts alternating direction as kbench_run's), on n_threads threads
 * pinned as kbench_run's. Rows in *rows (tk_free), their number in *n_rows. */
tk_status kbench_attn_run(const tk_model *m, int n_threads, bool pin, const char *cpus, tk_kv_type type,
                          tk_kv_scale scale, int block_size, int ctx, const int *seq, int n_counts,
                          int rounds, ka_row **rows, int *n_rows);
/* The cached pass alone (the row's hot_ fields; the streamed ones 0): the
 * attention kernel's own rate at these options with memory out of the way,
 * over a pool of just the positions that pass reads. */
tk_status kbench_attn_cached(const tk_model *m, int n_threads, bool pin, const char *cpus, tk_kv_type type,
                             tk_kv_scale scale, int block_size, int ctx, int rounds, ka_row *row);

#endif
