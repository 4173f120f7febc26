/* tokamak run: its rows, --help, the checks across options, and the prompt. */
#include <stddef.h>
#include <string.h>

#include "cli/run.h"
#include "core/alloc.h"
#include "core/error.h"

static bool add_stop(const char *v, void *dst) {
    run_stops *s = dst;
    if (s->n >= TK_MAX_STOP || !*v) return false;
    s->s[s->n++] = v;
    return true;
}

static const cli_opt RUN_ROWS[] = {
    {.kind = CLI_SECTION, .name = "prompt"},
    {.name = "-p",
     .alias = "--prompt",
     .arg = "TEXT",
     .help = "prompt text (needs the model's tokenizer; BOS added if the vocabulary asks)",
     .kind = CLI_STR,
     .off = offsetof(run_args, prompt)},
    {.name = "--tokens",
     .arg = "IDS",
     .help = "prompt token ids, comma or space separated",
     .kind = CLI_STR,
     .off = offsetof(run_args, tokens)},
    {.name = "--prompts",
     .arg = "FILE",
     .help = "many prompts through the engine: one a line (empty lines skipped)",
     .kind = CLI_STR,
     .off = offsetof(run_args, prompts)},
    {.name = "--parallel",
     .arg = "N",
     .help = "many prompts through the engine: N copies of -p or --tokens",
     .kind = CLI_INT,
     .off = offsetof(run_args, parallel),
     .lo = 1,
     .hi = 100000},
    {.name = "--no-special",
     .help = "special-token text in a prompt (<|im_start|>, ...) is text, not control tokens",
     .kind = CLI_FLAG,
     .off = offsetof(run_args, no_special)},
    {.name = "--chat",
     .help = "the prompt (-p, or each --prompts line) is a user message in the model's chat format;\n"
             "its text is text: special-token text in it is never a control token",
     .kind = CLI_FLAG,
     .off = offsetof(run_args, chat)},
    {.name = "--system",
     .arg = "TEXT",
     .help = "chat: a system message before the user's (text, as the user's)",
     .kind = CLI_STR,
     .off = offsetof(run_args, system)},
    {.name = "--no-think",
     .help = "chat: skip the thinking (Qwen3: the template's empty think block)",
     .kind = CLI_FLAG,
     .off = offsetof(run_args, no_think)},
    {.kind = CLI_SECTION, .name = "generation"},
    {.name = "-n",
     .alias = "--n-predict",
     .arg = "N",
     .help = "tokens to generate at most (default 128; 0: until the context is full)",
     .kind = CLI_INT,
     .off = offsetof(run_args, n),
     .lo = 0,
     .hi = 1 << 24},
    {.name = "--ignore-eos",
     .help = "keep generating past end-of-generation tokens",
     .kind = CLI_FLAG,
     .off = offsetof(run_args, ignore_eos)},
    {.name = "--stop",
     .arg = "STR",
     .help = "stop at this text (repeatable, up to 8; many prompts only)",
     .kind = CLI_FN,
     .off = offsetof(run_args, stop),
     .fn = add_stop,
     .want = "a non-empty string, at most 8 of them"},
    {.name = "--quiet",
     .alias = "-q",
     .help = "many prompts: print only the summary",
     .kind = CLI_FLAG,
     .off = offsetof(run_args, quiet)},
    {.name = "--dump-logits",
     .arg = "FILE",
     .help = "one prompt: raw float32 logits, the last prompt position, then each step",
     .kind = CLI_STR,
     .off = offsetof(run_args, dump)},
    {.name = "--no-probe",
     .help = "one prompt: skip the bandwidth probe (no % of peak in the timing line)",
     .kind = CLI_FLAG,
     .off = offsetof(run_args, no_probe)},
    {.name = "--bw",
     .arg = "GBPS",
     .help = "one prompt: the read bandwidth the timing line's % is of (default: probed now)",
     .kind = CLI_DOUBLE,
     .off = offsetof(run_args, bw),
     .lo = 0,
     .hi = 1e6},
    {0},
};

static const cli_cmd RUN_CMD = {
    "run",
    "usage: tokamak run -m MODEL (-p TEXT | --tokens IDS) [-n N] [options]\n"
    "       tokamak run -m MODEL (--prompts FILE | --parallel N (-p TEXT | --tokens IDS)) [-n N] [options]",
    CLI_G_MODEL | CLI_G_ENGINE | CLI_G_SAMPLING,
    RUN_ROWS,
    "One prompt runs as one sequence and streams its text (ids without a tokenizer) to stdout, then a\n"
    "timing line to stderr; it uses --threads, --pin, --ctx, --kv-type, --kv-scale, --block-size and\n"
    "--unfused, and the other engine options, which schedule many sequences, are refused.\n"
    "Many prompts run together through the engine (continuous batching); text is printed as \"[i] line\"\n"
    "per prompt i and the summary (TTFT, TPOT, throughput) goes to stderr.",
    0,
    NULL,
};

/* Engine rows that only schedule many sequences. */
static const char *const MANY_ONLY[] = {
    "--kv-mem",      "--max-batch", "--max-seqs",   "--step-tokens",     "--step-ms",
    "--no-chunking", "--stop",      "--quiet",      "--no-prefix-cache", "--static-batching",
    "--spec",        "--spec-k",    "--spec-ngram", "--draft-model",     "--spec-fixed"};

int run_parse(int argc, char **argv, cli_opts *o, run_args *a) {
    memset(a, 0, sizeof *a);
    a->n = 128;
    cli_opts_init(o, &RUN_CMD, a);
    int rc = cli_opts_parse(o, argc, argv);
    if (rc != CLI_GO_ON) return rc;
    const cli_cmd *c = &RUN_CMD;
    if (!o->model_path) {
        cli_error(c, "-m MODEL is required; 'tokamak run --help' lists the options");
        return 2;
    }
    if (a->prompts && a->parallel) {
        cli_error(c, "give one of --prompts FILE or --parallel N, not both");
        return 2;
    }
    if (a->prompts && (a->prompt || a->tokens)) {
        cli_error(c, "--prompts takes its prompts from the file, not from -p or --tokens");
        return 2;
    }
    if (!a->prompts && !a->prompt == !a->tokens) {
        cli_error(c, "give exactly one of -p TEXT or --tokens IDS%s", a->parallel ? " with --parallel" : "");
        return 2;
    }
    if ((a->no_special || a->chat) && a->tokens) {
        cli_error(c, "%s is about prompt text; --tokens gives ids", a->chat ? "--chat" : "--no-special");
        return 2;
    }
    if (a->chat && a->no_special) {
        cli_error(c, "--chat encodes message text as text already; drop --no-special");
        return 2;
    }
    if (!a->chat && (a->system || a->no_think)) {
        cli_error(c, "%s needs --chat", a->system ? "--system" : "--no-think");
        return 2;
    }
    if (run_is_many(a)) {
        if (a->dump || a->no_probe || a->bw > 0) {
            cli_error(c, "%s is for one prompt, not --prompts or --parallel",
                      a->dump       ? "--dump-logits"
                      : a->no_probe ? "--no-probe"
                                    : "--bw");
            return 2;
        }
    } else {
        for (size_t i = 0; i < sizeof MANY_ONLY / sizeof MANY_ONLY[0]; i++)
            if (cli_opts_given(o, MANY_ONLY[i])) {
                cli_error(c,
                          "%s is for many prompts (--prompts or --parallel); one prompt runs as one sequence",
                          MANY_ONLY[i]);
                return 2;
            }
    }
    return CLI_GO_ON;
}

tk_status run_encode(const tk_model *m, const run_args *a, const char *text, int32_t **ids, int *n) {
    int32_t *got = NULL;
    size_t n_got = 0;
    tk_status st;
    if (a->chat) {
        tk_chat_message msgs[2];
        int k = 0;
        if (a->system) msgs[k++] = (tk_chat_message){"system", a->system};
        msgs[k++] = (tk_chat_message){"user", text};
        tk_chat_opts co;
        tk_chat_opts_default(&co);
        co.enable_thinking = !a->no_think;
        st = tk_chat_tokenize(m, msgs, k, &co, &got, &n_got);
    } else {
        st = tk_tokenize(m, text, strlen(text), true, !a->no_special, &got, &n_got);
    }
    if (st != TK_OK) return st;
    if (n_got > (size_t)INT32_MAX) {
        tk_free_buf(got);
        return tk_fail(TK_ERR_RANGE, "a prompt of %zu tokens", n_got);
    }
    /* callers free with tk_free, as the ids of --tokens */
    *ids = tk_malloc((n_got ? n_got : 1) * sizeof **ids);
    if (!*ids) {
        tk_free_buf(got);
        return tk_fail(TK_ERR_NOMEM, "out of memory for a prompt of %zu tokens", n_got);
    }
    if (n_got) memcpy(*ids, got, n_got * sizeof *got);
    tk_free_buf(got);
    *n = (int)n_got;
    return TK_OK;
}
