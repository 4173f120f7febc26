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

#endif
