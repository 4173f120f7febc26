/* Machine probes: the read bandwidth and peak compute a benchmark is judged
 * against. Each probe starts its own pinned pthreads (one per requested
 * thread), so call it before creating an engine, never from inside a step.
 * Thread-safe (no shared state); each call takes well under a second. */
#ifndef TK_BENCH_PROBE_H
#define TK_BENCH_PROBE_H

/* Streaming read bandwidth in GB/s (1e9 bytes/s) with n_threads threads
 * (<= 0: one per online core). Thread i is pinned to core i and reads its own
 * buffer (<= 256 MiB each, <= 1 GiB in all, far past any cache) with the widest
 * vector loads the CPU has; the result is the best of several timed passes
 * after a warm-up, total bytes over the wall time from the first thread's
 * start to the last thread's end. Returns 0 if memory or threads run out. */
double probe_read_bw(int n_threads);

/* Peak fp32 multiply-add throughput in GFLOP/s (an FMA counts 2 flops) from
 * independent FMA chains on every thread; 0 on failure. */
double probe_peak_gflops_f32(int n_threads);

/* Peak int8 dot-product throughput in GOP/s (one u8*s8 multiply-add counts 2
 * ops), using vpdpbusd where AVX-512 VNNI exists, else vpmaddubsw+vpmaddwd;
 * 0 on failure. */
double probe_peak_gops_int8(int n_threads);

#endif
