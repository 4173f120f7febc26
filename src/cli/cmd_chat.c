/* tokamak chat: a conversation in the terminal. Each line of stdin is a user
 * message (a line ending in '\' goes on with the next); the reply streams to
 * stdout, and a line of timings goes to stderr. Every turn renders the whole
 * conversation in the model's chat format (the template decides what the
 * model sees of earlier replies: Qwen3 drops their thinking), and the runner
 * keeps the KV of the longest prefix it already holds (runner_truncate), so a
 * turn computes only what is new. Lines starting with '/' are commands:
 * /help, /reset (forget the conversation), /quit or /exit. End of input ends
 * the chat; Ctrl-C stops a reply where it is (kept as far as it got), and at
 * the prompt ends the chat. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/runner.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/run.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "tokamak.h"
#include "tokenizer/tokenizer.h"

#define CHAT_MSG_MAX (1 << 20) /* bytes of one message */

typedef struct chat_args {
    const char *system; /* --system */
    int n;              /* -n: reply tokens at most; 0: until the context is full */
    bool no_think, quiet;
} chat_args;

static const cli_opt CHAT_ROWS[] = {
    {.kind = CLI_SECTION, .name = "conversation"},
    {.name = "--system",
     .arg = "TEXT",
     .help = "a system message before the first turn (kept by /reset)",
     .kind = CLI_STR,
     .off = offsetof(chat_args, system)},
    {.name = "--no-think",
     .help = "skip the thinking (Qwen3: the template's empty think block)",
     .kind = CLI_FLAG,
     .off = offsetof(chat_args, no_think)},
    {.name = "-n",
     .alias = "--n-predict",
     .arg = "N",
     .help = "tokens a reply takes at most (default 0: until it ends or the context is full)",
     .kind = CLI_INT,
     .off = offsetof(chat_args, n),
     .lo = 0,
     .hi = 1 << 24},
    {.name = "--quiet",
     .alias = "-q",
     .help = "no banner, prompt marker or timing lines on stderr",
     .kind = CLI_FLAG,
     .off = offsetof(chat_args, quiet)},
    {0},
};

static const cli_cmd CHAT_CMD = {
    "chat",
    "usage: tokamak chat -m MODEL [--system TEXT] [-n N] [options]",
    CLI_G_MODEL | CLI_G_THREADS | CLI_G_PLACE | CLI_G_KV | CLI_G_SAMPLING,
    CHAT_ROWS,
    "Reads user messages from stdin, one a line (a line ending in '\\' goes on with the next), and streams\n"
    "each reply to stdout. Commands: /help, /reset (forget the conversation, keep --system), /quit or\n"
    "/exit. End of input ends the chat; Ctrl-C stops a reply, and at the prompt ends the chat. The model\n"
    "needs a vocabulary; its chat template (Qwen3, Llama-3 or ChatML) formats the conversation.",
    0,
    NULL,
};

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

/* The conversation: messages whose text it owns. */
typedef struct chat_log {
    tk_chat_message *msg;
    int n, cap;
} chat_log;

static bool log_add(chat_log *c, const char *role, const char *text, size_t len) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        tk_chat_message *m = tk_realloc(c->msg, (size_t)cap * sizeof *m);
        if (!m) return false;
        c->msg = m, c->cap = cap;
    }
    char *t = tk_strndup(text, len);
    if (!t) return false;
    c->msg[c->n++] = (tk_chat_message){role, t};
    return true;
}
/* Drops the messages past the first keep. */
static void log_cut(chat_log *c, int keep) {
    while (c->n > keep) tk_free((char *)c->msg[--c->n].content);
}

/* Everything a chat holds, freed in one place. */
typedef struct chat_state {
    tk_model *m;
    backend be;
    runner *r;
    tk_sampler *smp;
    tok_stream *ts;
    float *logits; /* (n_vocab) */
    char *text;    /* (tok_stream_bound + 1) */
    int32_t *seq;  /* (ctx + 1): the rendered conversation, then the reply's tokens */
    char *line;
    size_t line_cap;
    chat_log log;
} chat_state;

static void chat_free(chat_state *s) {
    log_cut(&s->log, 0);
    tk_free(s->log.msg);
    tk_free(s->line);
    tk_free(s->seq);
    tk_free(s->text);
    tk_free(s->logits);
    tok_stream_free(s->ts);
    sampler_free(s->smp);
    runner_free(s->r);
    backend_free(&s->be);
    tk_model_free(s->m);
}

static int fail(chat_state *s, const char *what) {
    fprintf(stderr, "tokamak chat: %s%s%s\n", what, *tk_last_error() ? ": " : "", tk_last_error());
    chat_free(s);
    return 1;
}

/* The next message from stdin into s->line (lines ending in '\' joined with a
 * newline), read through a fixed buffer so that no line takes more memory
 * than CHAT_MSG_MAX: its length (0 for a message past that, which is named
 * and skipped), or -1 at the end of input or on Ctrl-C. */
static long read_message(chat_state *s, bool prompt) {
    size_t len = 0;
    bool over = false, more = true;
    char buf[1 << 14];
    if (prompt) fputs("> ", stderr);
    while (more) {
        if (!fgets(buf, sizeof buf, stdin)) {
            if (interrupted || (!len && !over)) return -1;
            break; /* the end of input ends the message */
        }
        size_t n = strlen(buf);
        const bool eol = n > 0 && buf[n - 1] == '\n';
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
        more = !eol;
        if (eol && n > 0 && buf[n - 1] == '\\') { /* goes on with the next line */
            buf[n - 1] = '\n';
            more = true;
            if (prompt) fputs("... ", stderr);
        }
        if (over || len + n > CHAT_MSG_MAX) {
            over = true;
            continue;
        }
        if (len + n + 1 > s->line_cap) {
            const size_t c = 2 * (len + n + 1);
            char *l = tk_realloc(s->line, c);
            if (!l) return -1;
            s->line = l, s->line_cap = c;
        }
        memcpy(s->line + len, buf, n);
        len += n;
    }
    if (over) {
        fprintf(stderr, "tokamak chat: a message of more than %d bytes is skipped\n", CHAT_MSG_MAX);
        return 0;
    }
    if (!s->line && !(s->line = tk_malloc(s->line_cap = 1))) return -1;
    s->line[len] = '\0';
    return (long)len;
}

static bool is_eog(const chat_state *s, int32_t tok) { return tok_is_eog(model_tokenizer(s->m), tok); }

/* One turn: the conversation rendered, what the runner does not hold yet
 * fed, the reply streamed and kept in the log. Returns 0, 1 on an engine
 * failure (the chat ends), or 2 when the turn cannot run (the chat goes on
 * without it). */
static int chat_turn(chat_state *s, const chat_args *a, int ctx) {
    const tk_tokenizer *tok = model_tokenizer(s->m);
    tk_chat_opts co;
    tk_chat_opts_default(&co);
    co.enable_thinking = !a->no_think;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (tk_chat_tokenize(s->m, s->log.msg, s->log.n, &co, &ids, &n_ids) != TK_OK) {
        fprintf(stderr, "tokamak chat: cannot format the conversation: %s\n", tk_last_error());
        return 2;
    }
    if (n_ids == 0 || n_ids > (size_t)ctx) {
        fprintf(stderr, "tokamak chat: the conversation is %zu tokens, past --ctx %d: /reset starts over\n",
                n_ids, ctx);
        tk_free_buf(ids);
        return 2;
    }
    const int n_prompt = (int)n_ids;
    memcpy(s->seq, ids, n_ids * sizeof *ids);
    tk_free_buf(ids);

    /* keep the longest prefix the runner holds; at least the last token is fed again */
    const int held = runner_len(s->r);
    const int32_t *had = runner_tokens(s->r);
    int keep = 0;
    while (keep < held && keep < n_prompt - 1 && had[keep] == s->seq[keep]) keep++;
    if (keep < held && runner_truncate(s->r, keep) != TK_OK) return 1;

    const double t0 = tk_now_s();
    if (runner_feed(s->r, s->seq + keep, n_prompt - keep, s->logits) != TK_OK) return 1;
    const double t_prompt = tk_now_s() - t0;

    /* the reply: until an end-of-generation token, -n, a full context or Ctrl-C */
    const long room = (long)ctx - n_prompt + 1, n_max = a->n == 0 || a->n > room ? room : a->n;
    sampler_set_n_prompt(s->smp, n_prompt);
    int n_gen = 0;
    bool full = false; /* a Ctrl-C during the prompt stops the reply at its first token */
    const double t1 = tk_now_s();
    for (;;) {
        tk_token_event ev;
        memset(&ev, 0, sizeof ev);
        const int32_t t = sampler_sample(s->smp, s->logits, s->seq, n_prompt + n_gen, &ev);
        if (t < 0) return 1;
        if (is_eog(s, t)) break;
        s->seq[n_prompt + n_gen++] = t;
        const size_t n = tok_stream_push(s->ts, t, s->text, tok_stream_bound(tok));
        fwrite(s->text, 1, n, stdout);
        fflush(stdout);
        if (interrupted || n_gen >= n_max) {
            full = !interrupted && n_gen >= room;
            break;
        }
        if (runner_step(s->r, &s->seq[n_prompt + n_gen - 1], 1, 1, s->logits) != TK_OK) return 1;
    }
    const size_t n = tok_stream_flush(s->ts, s->text, tok_stream_bound(tok));
    fwrite(s->text, 1, n, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    const double t_reply = tk_now_s() - t1;
    /* the reply's text as streamed (tk_detokenize pushes and flushes the same way) */
    char *reply = NULL;
    size_t reply_len = 0;
    const bool kept =
        tk_detokenize(s->m, s->seq + n_prompt, (size_t)n_gen, false, &reply, &reply_len) == TK_OK &&
        log_add(&s->log, "assistant", reply, reply_len);
    tk_free_buf(reply);
    if (!kept) return 1;
    if (interrupted) fprintf(stderr, "[stopped]\n");
    if (full) fprintf(stderr, "[the context of %d tokens is full: /reset starts over]\n", ctx);
    if (!a->quiet)
        fprintf(stderr, "[%d new of %d prompt tokens in %.2f s | reply %d tokens in %.2f s, %.1f tok/s]\n",
                n_prompt - keep, n_prompt, t_prompt, n_gen, t_reply, t_reply > 0 ? n_gen / t_reply : 0.0);
    interrupted = 0;
    return 0;
}

int cmd_chat(int argc, char **argv) {
    chat_args a = {0};
    cli_opts o;
    cli_opts_init(&o, &CHAT_CMD, &a);
    int rc = cli_opts_parse(&o, argc, argv);
    if (rc != CLI_GO_ON) return rc;
    if (!o.model_path) {
        cli_error(&CHAT_CMD, "-m MODEL is required; 'tokamak chat --help' lists the options");
        return 2;
    }
    if (cli_opts_given(&o, "--kv-mem")) {
        cli_error(&CHAT_CMD, "--kv-mem sizes the engine's pool; a chat is one sequence of --ctx tokens");
        return 2;
    }
    chat_state s;
    memset(&s, 0, sizeof s);
    if (tk_model_open(o.model_path, &o.model, &s.m) != TK_OK) return fail(&s, "cannot load the model");
    cli_opts_fit_model(&o, s.m);
    const tk_tokenizer *tok = model_tokenizer(s.m);
    if (!tok || !tk_model_chat_format(s.m)) {
        fprintf(stderr, "tokamak chat: %s has no vocabulary: a chat needs its tokenizer\n", o.model_path);
        chat_free(&s);
        return 2;
    }
    const int ctx = o.engine.ctx;
    if (run_one_sequence(&o, s.m, ctx, ctx < RUN_CHUNK ? ctx : RUN_CHUNK, &s.be, &s.r) != TK_OK)
        return fail(&s, "cannot set up the backend");
    const tk_hparams *hp = model_hparams(s.m);
    if (sampler_init(&o.sampling, hp->n_vocab, &s.smp) != TK_OK) return fail(&s, "bad sampling parameters");
    s.logits = tk_calloc((size_t)hp->n_vocab, sizeof *s.logits);
    s.seq = tk_calloc((size_t)ctx + 1, sizeof *s.seq);
    s.text = tk_malloc(tok_stream_bound(tok) + 1);
    if (!s.logits || !s.seq || !s.text) return fail(&s, "out of memory");
    if (tok_stream_init(tok, false, &s.ts) != TK_OK) return fail(&s, "cannot start the detokenizer");
    const int n_system = a.system ? 1 : 0;
    if (a.system && !log_add(&s.log, "system", a.system, strlen(a.system))) return fail(&s, "out of memory");

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint; /* no SA_RESTART: a read at the prompt returns */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);

    const bool prompt = !a.quiet && isatty(STDIN_FILENO);
    if (!a.quiet)
        fprintf(stderr, "tokamak chat: %s (%s format), ctx %d, %d threads, kv %s; /help for commands\n",
                o.model_path, tk_model_chat_format(s.m), ctx, s.be.n_threads,
                names_str(&NAMES_KV_TYPE, (int)o.engine.kv_type));
    rc = 0;
    for (;;) {
        interrupted = 0;
        const long len = read_message(&s, prompt);
        if (len < 0) {
            rc = interrupted ? 130 : 0;
            if (interrupted) fputc('\n', stderr);
            break;
        }
        const char *line = s.line;
        if (len == 0) continue;
        if (line[0] == '/') {
            if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
            if (!strcmp(line, "/reset")) {
                log_cut(&s.log, n_system);
                if (!a.quiet) fprintf(stderr, "[the conversation starts over]\n");
            } else if (!strcmp(line, "/help")) {
                fprintf(stderr, "/reset  forget the conversation (--system stays)\n"
                                "/quit   end the chat (also /exit, end of input, Ctrl-C at the prompt)\n"
                                "a line ending in '\\' goes on with the next; Ctrl-C stops a reply\n");
            } else {
                fprintf(stderr, "tokamak chat: unknown command '%s' (/help lists them)\n", line);
            }
            continue;
        }
        if (!log_add(&s.log, "user", line, (size_t)len)) return fail(&s, "out of memory");
        const int turn = chat_turn(&s, &a, ctx);
        if (turn == 1) return fail(&s, "the reply failed");
        if (turn == 2) log_cut(&s.log, s.log.n - 1); /* the message that did not fit */
    }
    chat_free(&s);
    return rc;
}
