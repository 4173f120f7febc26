/* Speculation with a draft model over the tiny synthetic qwen3: the paths of
 * the tiny model and of one made with other weights (synth --seed), and an
 * engine run that records every request's tokens. Include after cmocka.h. */
#ifndef TK_TEST_TINY_DRAFT_H
#define TK_TEST_TINY_DRAFT_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine_wait.h"
#include "tokamak.h"

/* The tiny model with weight seed `seed` (0: the one open_tiny opens), made
 * once into $TK_TMP; false (the caller skips) without $TK_TMP and $TK_CLI. */
static inline bool tiny_path(int seed, char *path, size_t cap) {
    const char *tmp = getenv("TK_TMP"), *cli = getenv("TK_CLI");
    if (!tmp || !cli) return false;
    if (seed == 0)
        snprintf(path, cap, "%s/engine_tiny_f32.gguf", tmp);
    else
        snprintf(path, cap, "%s/engine_tiny_f32_seed%d.gguf", tmp, seed);
    struct stat sb;
    if (stat(path, &sb) == 0) return true;
    char part[600], cmd[4096];
    snprintf(part, sizeof part, "%s.%d", path, (int)getpid());
    snprintf(cmd, sizeof cmd,
             "'%s' synth --preset tiny --dtype f32 --seed %d -o '%s' 2>/dev/null && mv '%s' '%s'", cli, seed,
             part, part, path);
    if (system(cmd) != 0) fail_msg("synth failed: %s", cmd);
    return true;
}

#define TD_MAXOUT 64

typedef struct td_rec {
    pthread_mutex_t mu;
    int32_t out[TD_MAXOUT];
    int n_out, n_finish;
} td_rec;

static inline void td_on_tok(void *u, const tk_token_event *ev) {
    td_rec *r = u;
    pthread_mutex_lock(&r->mu);
    if (r->n_out < TD_MAXOUT) r->out[r->n_out] = ev->token;
    r->n_out++;
    pthread_mutex_unlock(&r->mu);
}
static inline void td_on_fin(void *u, const tk_finish_event *ev) {
    td_rec *r = u;
    (void)ev;
    pthread_mutex_lock(&r->mu);
    r->n_finish++;
    pthread_mutex_unlock(&r->mu);
}

/* Run nr requests (prompt i: prompts + i * n_prompt) through an engine over m
 * with options o (every draft on offer verified when force), n_out tokens
 * each, temperature temp (seed 5 + i); tokens into rec[i]. Returns the stats. */
static inline tk_engine_stats td_run(tk_model *m, const tk_engine_opts *o, bool force, const int32_t *prompts,
                                     int n_prompt, int nr, int n_out, float temp, td_rec *rec) {
    tk_engine *e = NULL;
    tk_engine_opts oo = *o;
    oo.spec_fixed = force;
    if (tk_engine_create(m, &oo, &e) != TK_OK) fail_msg("%s", tk_last_error());
    for (int i = 0; i < nr; i++) {
        memset(&rec[i], 0, sizeof rec[i]);
        pthread_mutex_init(&rec[i].mu, NULL);
        tk_request q;
        tk_request_default(&q);
        q.prompt = prompts + (size_t)i * (size_t)n_prompt;
        q.n_prompt = n_prompt;
        q.max_tokens = n_out;
        q.ignore_eos = true;
        q.sampling.temperature = temp;
        q.sampling.seed = 5 + (uint64_t)i;
        q.on_token = td_on_tok;
        q.on_finish = td_on_fin;
        q.user = &rec[i];
        uint64_t id;
        if (tk_engine_submit(e, &q, &id) != TK_OK) fail_msg("%s", tk_last_error());
    }
    wait_finished(e, (uint64_t)nr);
    tk_engine_stats st;
    tk_engine_stats_get(e, &st);
    tk_engine_free(e);
    for (int i = 0; i < nr; i++) {
        assert_int_equal(rec[i].n_finish, 1);
        assert_int_equal(rec[i].n_out, n_out);
    }
    return st;
}

#endif
