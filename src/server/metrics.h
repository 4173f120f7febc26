/* Server metrics: request counters and latency histograms, rendered with the
 * engine's stats in the Prometheus text format (docs/server.md lists them).
 * Thread-safe: one mutex, held only to add a finished request or render. */
#ifndef TK_SERVER_METRICS_H
#define TK_SERVER_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "tokamak.h"

#define SRV_HIST_MAX 24

typedef struct srv_hist {
    const double *bounds; /* (n) upper bounds in seconds, ascending; +Inf is implicit */
    int n;
    uint64_t counts[SRV_HIST_MAX + 1]; /* per bucket, not cumulative; [n] is +Inf */
    double sum;
    uint64_t count;
} srv_hist;

enum { SRV_FIN_STOP, SRV_FIN_LENGTH, SRV_FIN_ABORT, SRV_FIN_ERROR, SRV_FIN_N };
enum { SRV_REJ_QUEUE_FULL, SRV_REJ_DRAINING, SRV_REJ_N };

typedef struct srv_metrics {
    pthread_mutex_t mu;
    srv_hist ttft, tpot, itl, e2e, queue;
    uint64_t finished[SRV_FIN_N];
    uint64_t rejected[SRV_REJ_N];
    uint64_t prompt_tokens, generation_tokens;
    uint64_t responses[6];   /* by status class: [2] 2xx ... [5] 5xx */
    double finish_times[64]; /* ring of recent finish times, for Retry-After */
    int n_finish, finish_at;
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_destroy(srv_metrics *m);
/* A request's end: its times and its inter-token gaps (seconds, n_itl of them). */
void srv_metrics_finish(srv_metrics *m, tk_finish reason, const tk_request_times *t, const double *itl,
                        int n_itl);
void srv_metrics_reject(srv_metrics *m, int why);
void srv_metrics_response(srv_metrics *m, int status);
/* Seconds until a queued request is likely to start: (waiting + 1) over the
 * recent finish rate, clamped to [1, 60]. */
int srv_metrics_retry_after(srv_metrics *m, int waiting, double now);
/* The exposition text (malloc'd, NUL-terminated); st may be NULL (no engine yet).
 * live: requests the server holds (HTTP side). */
char *srv_metrics_render(srv_metrics *m, const tk_engine_stats *st, int live, size_t *len);

#endif
