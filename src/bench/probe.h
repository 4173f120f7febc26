/* Machine probes: the read bandwidth and peak compute a benchmark is judged
 * against. Each probe starts its own pinned pthreads (one per requested
 * thread), so call it before creating an engine, never from inside a step.
 * Thread-safe (no shared state); each call takes well under a second. */
#ifndef TK_BENCH_PROBE_H
#define TK_BENCH_PROBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/cpu.h"

/* Streaming read bandwidth in GB/s (1e9 bytes/s) with n_threads threads
 * (<= 0: one per online core). Thread i is pinned to core i and reads its own
 * buffer (<= 256 MiB each, <= 1 GiB in all, far past any cache) with the widest
 * vector loads the CPU has; the result is the best of several timed passes
 * after a warm-up, total bytes over the wall time from the first thread's
 * start to the last thread's end. Returns 0 if memory or threads run out. */
double probe_read_bw(int n_threads);

/* The same probe's spread: the best, median and slowest of its n timed
 * passes in GB/s (all 0 on failure). Half the passes use the kernels'
 * software prefetch, half plain loads; best is what probe_read_bw returns. */
typedef struct probe_stats {
    double best, median, min;
    int n;
} probe_stats;
void probe_read_bw_stats(int n_threads, probe_stats *out);

/* The read probe over runs of run_bytes each (what attention reads of one
 * kv head's adjacent blocks in the paged cache) read in a shuffled order, each run whole while
 * the next is asked for line by line in step, as the attention kernels read
 * a context's blocks: the rate scattered runs allow, against the streaming
 * probe's one long read per thread. Same buffers and passes as
 * probe_read_bw_stats; all 0 on failure or when run_bytes is not a multiple
 * of 256 in [PROBE_RUN_MIN, PROBE_RUN_MAX]. */
#define PROBE_RUN_MIN ((size_t)4 << 10)
#define PROBE_RUN_MAX ((size_t)4 << 20)
void probe_read_runs_stats(int n_threads, size_t run_bytes, probe_stats *out);

/* A rate a run achieved against its probe: the percentage, capped so a
 * roofline never reads above 100%. *shortfall is true when the run was
 * faster than the probe (the probe under-read the machine; report it as a
 * probe shortfall, not as a roofline above 100%). */
double probe_roofline_pct(double achieved_gbs, double probe_gbs, bool *shortfall);

/* Whether the calling thread runs in a real-time class (SCHED_FIFO or
 * SCHED_RR, e.g. under `chrt -f 1`) while the kernel throttles real-time
 * threads: then threads that keep every core busy (a decode's pool) stop for
 * the rest of each period once they have run *runtime_us of its *period_us
 * microseconds (by default 950,000 of 1,000,000: a ~50 ms stall each
 * second), which a run's means and tail latencies count. Reads
 * /proc/sys/kernel/sched_rt_{runtime,period}_us; false (and 0s) outside a
 * real-time class, with throttling off (runtime -1) or unreadable. */
bool probe_rt_throttled(int *runtime_us, int *period_us);

/* Peak fp32 multiply-add throughput in GFLOP/s (an FMA counts 2 flops) from
 * independent FMA chains on every thread; 0 on failure. */
double probe_peak_gflops_f32(int n_threads);

/* Peak BF16 dot-product throughput in GFLOP/s (a multiply-add counts 2)
 * from independent vdpbf16ps chains (two multiply-adds per lane) on every
 * thread: the peak of P16R's gemv where it runs the instruction
 * (kern_bf16_dot_hw). 0 where the kernels' level is not avx512 or the CPU
 * lacks AVX512-BF16, and on failure. */
double probe_peak_gflops_bf16(int n_threads);

/* Peak int8 dot-product throughput in GOP/s (one u8*s8 multiply-add counts 2
 * ops), using vpdpbusd where AVX-512 VNNI exists, else vpmaddubsw+vpmaddwd;
 * 0 on failure. */
double probe_peak_gops_int8(int n_threads);

/* Every probe runs the loops of cpu_isa_from_env: the level the kernels use
 * (TOKAMAK_ISA caps it), so a roofline compares like with like. */

/* The int8 loops' lane reduction: the sum of n int32 lanes modulo 2^32. The
 * accumulator lanes wrap on a long run by design, so the fold is unsigned and
 * defined for any lane values (a signed fold would overflow). */
uint32_t probe_lanes_sum(const int32_t *lanes, int n);

/* One pass of the int8 peak loop of isa (the CPU must have it) on the calling
 * thread: the wrapped sum of all its accumulator lanes after iters iterations.
 * The loops' operands are fixed, so probe_int8_expect gives the same number
 * from scalar arithmetic: the test of each level's loop and reduction. */
uint32_t probe_int8_pass(tk_isa isa, long iters);
uint32_t probe_int8_expect(tk_isa isa, long iters);

#endif
