#include "cli/opts.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/pool.h"

/* The shared rows, one table per group, in --help order. */
static const cli_opt MODEL_ROWS[] = {
    {.name = "-m",
     .alias = "--model",
     .arg = "MODEL",
     .help = "a GGUF file or a Hugging Face directory",
     .kind = CLI_STR,
     .dest = CLI_D_OPTS,
     .off = offsetof(cli_opts, model_path)},
    {.name = "--repack",
     .arg = "TYPE",
     .help = "convert the matmul weights at load (default keep: the file's types)",
     .kind = CLI_ENUM,
     .dest = CLI_D_MODEL,
     .off = offsetof(tk_model_opts, repack),
     .names = &NAMES_WEIGHTS},
    {.name = "--repack-output",
     .arg = "TYPE",
     .help = "the output matrix's type at load (default keep: as --repack)",
     .kind = CLI_ENUM,
     .dest = CLI_D_MODEL,
     .off = offsetof(tk_model_opts, repack_output),
     .names = &NAMES_WEIGHTS},
    {.name = "--mmap",
     .help = "read weights through the file mapping (default: a huge-page copy)",
     .kind = CLI_FLAG,
     .dest = CLI_D_MODEL,
     .off = offsetof(tk_model_opts, use_mmap)},
    {.name = "--row-layout",
     .help = "keep Q8_0/Q4_0/Q4_K/BF16 weights in file row order (default: interleaved)",
     .kind = CLI_FLAG,
     .dest = CLI_D_MODEL,
     .off = offsetof(tk_model_opts, row_layout)},
    {.name = "--bf16-dot",
     .help = "BF16 weights: round activations to BF16 and run vdpbf16ps where it is faster (dots within\n"
             "2^-8 of sum |w x|; ~2x batched on AMD Zen 5; default: f32 activations, the same on every CPU)",
     .kind = CLI_FLAG,
     .dest = CLI_D_MODEL,
     .off = offsetof(tk_model_opts, bf16_dot)},
    {.name = "--q8-coarse",
     .help = "Q8_0 weights: requantize to one scale per 256 values, read with per-256 activations\n"
             "(fewer scale steps: faster at batch and in prefill; costs quality, see tokamak eval)",
     .kind = CLI_FLAG,
     .dest = CLI_D_MODEL,
     .off = offsetof(tk_model_opts, q8_coarse)},
    {0},
};

static const cli_opt THREAD_ROWS[] = {
    {.name = "--threads",
     .alias = "-t",
     .arg = "N",
     .help = "worker threads (default 0: one per online core; more are capped to them)",
     .kind = CLI_INT,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, n_threads),
     .lo = 0,
     .hi = 1024},
    {.name = "--pin",
     .help = "pin the threads to cores",
     .kind = CLI_FLAG,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, pin_threads)},
    {.name = "--even-rows",
     .help = "split the output, gate/up, down and vocabulary rows evenly between the threads, not by "
             "their measured speed (for comparison)",
     .kind = CLI_FLAG,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, even_rows)},
    {0},
};

static const cli_opt PLACE_ROWS[] = {
    {.name = "--cpus",
     .arg = "LIST",
     .help = "run thread i on the list's i-th CPU, e.g. 0-3,8 (default threads: one per listed CPU)",
     .kind = CLI_STR,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, cpus)},
    {.name = "--numa",
     .help = "interleave weights and KV over the threads' NUMA nodes (libnuma; one node: no-op)",
     .kind = CLI_FLAG,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, numa)},
    {0},
};

static const cli_opt KV_ROWS[] = {
    {.name = "--ctx",
     .arg = "N",
     .help = "context per sequence, prompt included (default 4096, or the model's trained context\n"
             "when that is smaller; a larger --ctx than the trained one is kept, with a warning)",
     .kind = CLI_INT,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, ctx),
     .lo = 1,
     .hi = 1 << 24},
    {.name = "--kv-type",
     .arg = "T",
     .help = "KV cache type (default f16)",
     .kind = CLI_ENUM,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, kv_type),
     .names = &NAMES_KV_TYPE},
    {.name = "--kv-scale",
     .arg = "S",
     .help = "int8 KV scales per head or per token (default head)",
     .kind = CLI_ENUM,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, kv_scale),
     .names = &NAMES_KV_SCALE},
    {.name = "--block-size",
     .arg = "N",
     .help = "KV block tokens: 16, 32, 64, 128 or 256 (default 128)",
     .kind = CLI_INT,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, block_size),
     .lo = 16,
     .hi = 256,
     .flags = CLI_POW2},
    {.name = "--kv-mem",
     .arg = "SIZE",
     .help = "KV pool size in MiB, or with a K, M or G suffix (default max-seqs x ctx)",
     .kind = CLI_MIB,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, kv_mem),
     .lo = 0,
     .hi = 1 << 22,
     .flags = CLI_LO_OPEN},
    {0},
};

static const cli_opt SCHED_ROWS[] = {
    {.name = "--max-batch",
     .arg = "N",
     .help = "running sequences (default 32)",
     .kind = CLI_INT,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, max_batch),
     .lo = 1,
     .hi = 4096},
    {.name = "--max-seqs",
     .arg = "N",
     .help = "sequences the KV pool is sized for without --kv-mem (default max-batch)",
     .kind = CLI_INT,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, max_seqs),
     .lo = 1,
     .hi = 1 << 20},
    {.name = "--step-tokens",
     .arg = "N",
     .help = "a fixed budget of N tokens a step, at least --max-batch (0: the time-based default);\n"
             "with --step-ms, the cap of the time-based budget (default 1024)",
     .kind = CLI_INT,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, step_tokens),
     .lo = 0,
     .hi = 1 << 20},
    {.name = "--step-ms",
     .arg = "MS",
     .help = "target step time; prefill chunks are sized from measured costs to fit it\n"
             "(default: automatic, 2 x the step's decode time, at most 1000 ms)",
     .kind = CLI_DOUBLE,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, step_ms),
     .lo = 0,
     .hi = 3600e3,
     .flags = CLI_LO_OPEN},
    {.name = "--no-chunking",
     .help = "prefill a whole prompt in one step",
     .kind = CLI_FLAG,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, no_chunking)},
    {.name = "--no-prefix-cache",
     .help = "do not reuse the KV of cached prompt prefixes (full blocks shared by content)",
     .kind = CLI_FLAG,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, no_prefix_cache)},
    {.name = "--spec",
     .arg = "MODE",
     .help = "speculative decoding: ngram (prompt lookup drafts, verified in the decode step; the\n"
             "engine picks 0..--spec-k drafts per sequence and step from measured acceptance and\n"
             "step cost), draft (a draft model's drafts: --draft-model, which implies it) or off\n"
             "(default)",
     .kind = CLI_ENUM,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, spec),
     .names = &NAMES_SPEC},
    {.name = "--draft-model",
     .arg = "MODEL",
     .help = "a smaller model with the same tokenizer that drafts for --spec draft (GGUF or\n"
             "Hugging Face directory; its own KV cache, the same threads)",
     .kind = CLI_STR,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, draft_model)},
    {.name = "--spec-k",
     .arg = "N",
     .help = "most draft tokens a sequence verifies in one step (default 8)",
     .kind = CLI_INT,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, spec_k),
     .lo = 1,
     .hi = 32},
    {.name = "--spec-fixed",
     .help = "no controller: every decoding sequence verifies --spec-k drafts (all on offer) each\n"
             "step, so a seeded run with a draft model is reproducible (the controller's choices\n"
             "follow measured time); for measuring speculation at a fixed k",
     .kind = CLI_FLAG,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, spec_fixed)},
    {.name = "--spec-ngram",
     .arg = "N",
     .help = "n-gram the drafter matches, then shorter ones down to 2 (default 3)",
     .kind = CLI_INT,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, spec_ngram),
     .lo = 1,
     .hi = 16},
    {.name = "--static-batching",
     .alias = "--static",
     .help = "static batching: a batch starts together and waits for its slowest",
     .kind = CLI_FLAG,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, static_batching)},
    {.name = "--unfused",
     .help = "run the unfused reference stages (ablation)",
     .kind = CLI_FLAG,
     .dest = CLI_D_ENGINE,
     .off = offsetof(tk_engine_opts, unfused)},
    {0},
};

static const cli_opt SAMPLING_ROWS[] = {
    {.name = "--temp",
     .arg = "T",
     .help = "temperature (default 0: greedy)",
     .kind = CLI_FLOAT,
     .dest = CLI_D_SAMPLING,
     .off = offsetof(tk_sampling, temperature),
     .lo = 0,
     .hi = 100},
    {.name = "--top-k",
     .arg = "K",
     .help = "keep the K most likely tokens (default 0: off)",
     .kind = CLI_INT,
     .dest = CLI_D_SAMPLING,
     .off = offsetof(tk_sampling, top_k),
     .lo = 0,
     .hi = 1 << 24},
    {.name = "--top-p",
     .arg = "P",
     .help = "nucleus: the most likely tokens up to probability P (default 1: off)",
     .kind = CLI_FLOAT,
     .dest = CLI_D_SAMPLING,
     .off = offsetof(tk_sampling, top_p),
     .lo = 0,
     .hi = 1,
     .flags = CLI_LO_OPEN},
    {.name = "--min-p",
     .arg = "P",
     .help = "drop tokens below P x the top probability (default 0: off)",
     .kind = CLI_FLOAT,
     .dest = CLI_D_SAMPLING,
     .off = offsetof(tk_sampling, min_p),
     .lo = 0,
     .hi = 1},
    {.name = "--repeat-penalty",
     .arg = "R",
     .help = "Hugging Face repetition penalty (default 1: off)",
     .kind = CLI_FLOAT,
     .dest = CLI_D_SAMPLING,
     .off = offsetof(tk_sampling, repetition_penalty),
     .lo = 0,
     .hi = 100,
     .flags = CLI_LO_OPEN},
    {.name = "--presence-penalty",
     .arg = "R",
     .help = "OpenAI presence penalty (default 0: off)",
     .kind = CLI_FLOAT,
     .dest = CLI_D_SAMPLING,
     .off = offsetof(tk_sampling, presence_penalty),
     .lo = -2,
     .hi = 2},
    {.name = "--frequency-penalty",
     .arg = "R",
     .help = "OpenAI frequency penalty (default 0: off)",
     .kind = CLI_FLOAT,
     .dest = CLI_D_SAMPLING,
     .off = offsetof(tk_sampling, frequency_penalty),
     .lo = -2,
     .hi = 2},
    {.name = "--seed",
     .arg = "S",
     .help = "random stream, 0..2^64-1 (default 0); same seed, same tokens",
     .kind = CLI_U64,
     .dest = CLI_D_SAMPLING,
     .off = offsetof(tk_sampling, seed)},
    {0},
};

typedef struct cli_group {
    unsigned bit;
    const char *heading; /* groups with the same heading are listed together */
    const cli_opt *rows;
} cli_group;

static const cli_group GROUPS[] = {
    {CLI_G_MODEL, "model", MODEL_ROWS},  {CLI_G_THREADS, "engine", THREAD_ROWS},
    {CLI_G_PLACE, "engine", PLACE_ROWS}, {CLI_G_KV, "engine", KV_ROWS},
    {CLI_G_SCHED, "engine", SCHED_ROWS}, {CLI_G_SAMPLING, "sampling", SAMPLING_ROWS},
};
enum { N_GROUPS = sizeof GROUPS / sizeof GROUPS[0] };

void cli_error(const cli_cmd *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tokamak %s: ", cmd->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---- value parsers ------------------------------------------------------------ */

bool cli_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* "a,b,c": item(p, &end, k) parses item k at p and says where it ends; a
 * comma must be followed by another item. false on a bad item, a stray
 * character, an empty list or more than max items. */
typedef bool (*list_item_fn)(const char *p, char **end, int k, void *ctx);
static bool parse_list(const char *s, int max, list_item_fn item, void *ctx, int *n) {
    int k = 0;
    const char *p = s;
    while (*p) {
        if (k == max) return false;
        char *end;
        errno = 0;
        if (!item(p, &end, k, ctx) || errno || end == p) return false;
        k++;
        if (*end == ',' && end[1])
            p = end + 1;
        else if (*end == 0)
            p = end;
        else
            return false;
    }
    *n = k;
    return k > 0;
}

typedef struct int_list {
    long lo, hi;
    int *out;
} int_list;

static bool int_item(const char *p, char **end, int k, void *ctx) {
    const int_list *l = ctx;
    long v = strtol(p, end, 10);
    if (v < l->lo || v > l->hi) return false;
    l->out[k] = (int)v;
    return true;
}

bool cli_parse_int_list(const char *s, long lo, long hi, int max, int *out, int *n) {
    int_list l = {lo, hi, out};
    return parse_list(s, max, int_item, &l, n);
}

static bool real_item(const char *p, char **end, int k, void *ctx) {
    double v = strtod(p, end);
    if (!(v > 0) || !isfinite(v)) return false;
    ((double *)ctx)[k] = v;
    return true;
}

bool cli_parse_real_list(const char *s, int max, double *out, int *n) {
    return parse_list(s, max, real_item, out, n);
}

bool cli_parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

bool cli_parse_u64(const char *s, uint64_t *out) {
    if (*s < '0' || *s > '9') return false; /* strtoull would take "-1" as 2^64 - 1 */
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = (uint64_t)v;
    return true;
}

static bool is_sep(char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool cli_parse_ids(const char *s, int32_t **ids_out, int *n_out) {
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += is_sep(*p);
    if (cap > INT32_MAX) return false;
    int32_t *ids = tk_calloc(cap, sizeof *ids);
    if (!ids) return false;
    int n = 0;
    const char *p = s;
    for (;;) {
        while (is_sep(*p)) p++;
        if (!*p) break;
        if (*p < '0' || *p > '9') goto bad;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || v > INT32_MAX || (*end && !is_sep(*end))) goto bad;
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (n == 0) goto bad;
    *ids_out = ids;
    *n_out = n;
    return true;
bad:
    tk_free(ids);
    return false;
}

/* N MiB, or N with a K/M/G suffix, in bytes. */
static bool parse_mib(const char *s, size_t *out) {
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9') return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return false;
    int shift = 20;
    if (*end == 'K' || *end == 'k')
        shift = 10, end++;
    else if (*end == 'M' || *end == 'm')
        shift = 20, end++;
    else if (*end == 'G' || *end == 'g')
        shift = 30, end++;
    if (*end || v > (SIZE_MAX >> shift)) return false;
    *out = (size_t)v << shift;
    return true;
}

/* ---- the table ------------------------------------------------------------------ */

static bool row_matches(const cli_opt *r, const char *name, size_t len) {
    if (r->kind == CLI_SECTION) return false;
    return (strlen(r->name) == len && !strncmp(r->name, name, len)) ||
           (r->alias && strlen(r->alias) == len && !strncmp(r->alias, name, len));
}

static const cli_opt *find_row(const cli_cmd *cmd, const char *name, size_t len) {
    for (const cli_opt *r = cmd->own; r && r->name; r++)
        if (row_matches(r, name, len)) return r;
    for (const cli_opt *r = cmd->own_shared; r && r->name; r++)
        if (row_matches(r, name, len)) return r;
    for (int g = 0; g < N_GROUPS; g++) {
        if (!(cmd->groups & GROUPS[g].bit)) continue;
        for (const cli_opt *r = GROUPS[g].rows; r->name; r++)
            if (row_matches(r, name, len)) return r;
    }
    return NULL;
}

static void *field(cli_opts *o, const cli_opt *r) {
    char *base = NULL;
    switch (r->dest) {
    case CLI_D_OWN:
        base = o->own;
        break;
    case CLI_D_OPTS:
        base = (char *)o;
        break;
    case CLI_D_MODEL:
        base = (char *)&o->model;
        break;
    case CLI_D_ENGINE:
        base = (char *)&o->engine;
        break;
    case CLI_D_SAMPLING:
        base = (char *)&o->sampling;
        break;
    }
    return base ? base + r->off : NULL;
}

static const char *range_open(const cli_opt *r) { return r->flags & CLI_LO_OPEN ? "(" : "["; }

/* "an integer in [1, 4096]" etc. for a row, into buf. */
static const char *row_want(const cli_opt *r, char *buf, size_t n) {
    char list[256];
    switch (r->kind) {
    case CLI_INT:
    case CLI_LONG:
        snprintf(buf, n, "%s in %s%.0f, %.0f]", r->flags & CLI_POW2 ? "a power of two" : "an integer",
                 range_open(r), r->lo, r->hi);
        break;
    case CLI_U64:
        snprintf(buf, n, "an integer in [0, %llu]", (unsigned long long)UINT64_MAX);
        break;
    case CLI_FLOAT:
    case CLI_DOUBLE:
        snprintf(buf, n, "a number in %s%.10g, %.10g]", range_open(r), r->lo, r->hi);
        break;
    case CLI_MIB:
        snprintf(buf, n, "MiB in %s%.10g, %.10g], or a size with a K, M or G suffix", range_open(r), r->lo,
                 r->hi);
        break;
    case CLI_ENUM:
        snprintf(buf, n, "one of %s", names_list(r->names, ", ", list, sizeof list));
        break;
    case CLI_FN:
        snprintf(buf, n, "%s", r->want ? r->want : "a valid value");
        break;
    default:
        snprintf(buf, n, "a value");
        break;
    }
    return buf;
}

static bool in_range(const cli_opt *r, double v) {
    if (!(v >= r->lo && v <= r->hi)) return false;
    return !(r->flags & CLI_LO_OPEN) || v > r->lo;
}

/* Store value into r's field; false when it is not a value of r's kind and range. */
static bool set_value(cli_opts *o, const cli_opt *r, const char *v) {
    void *f = field(o, r);
    long l;
    double d;
    switch (r->kind) {
    case CLI_INT:
    case CLI_LONG:
        if (!cli_parse_long(v, (long)r->lo, (long)r->hi, &l) || !in_range(r, (double)l)) return false;
        if ((r->flags & CLI_POW2) && (l & (l - 1))) return false;
        if (r->kind == CLI_INT)
            *(int *)f = (int)l;
        else
            *(long *)f = l;
        return true;
    case CLI_U64:
        return cli_parse_u64(v, (uint64_t *)f);
    case CLI_FLOAT:
    case CLI_DOUBLE:
        if (!cli_parse_double(v, r->lo, r->hi, &d) || !in_range(r, d)) return false;
        if (r->kind == CLI_FLOAT)
            *(float *)f = (float)d;
        else
            *(double *)f = d;
        return true;
    case CLI_MIB: {
        size_t b;
        if (!parse_mib(v, &b) || !in_range(r, (double)b / (1 << 20))) return false;
        *(size_t *)f = b;
        return true;
    }
    case CLI_STR:
        *(const char **)f = v;
        return true;
    case CLI_ENUM: {
        int e;
        if (!names_find(r->names, v, &e)) return false;
        *(int *)f = e;
        return true;
    }
    case CLI_FN:
        return r->fn(v, f);
    default:
        return false;
    }
}

void cli_opts_init(cli_opts *o, const cli_cmd *cmd, void *own) {
    memset(o, 0, sizeof *o);
    o->cmd = cmd;
    o->own = own;
    tk_model_opts_default(&o->model);
    tk_engine_opts_default(&o->engine);
    tk_sampling_default(&o->sampling);
}

bool cli_opts_given(const cli_opts *o, const char *name) {
    size_t len = strlen(name);
    for (int i = 0; i < o->n_given; i++)
        if (row_matches(o->given[i], name, len)) return true;
    return false;
}

static int online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The shared options checked together, after every value is in. */
static int check_groups(cli_opts *o) {
    const cli_cmd *c = o->cmd;
    tk_engine_opts *e = &o->engine;
    if (c->groups & CLI_G_THREADS) {
        int cores = online_cores();
        if (e->n_threads > cores) {
            fprintf(stderr, "tokamak %s: warning: --threads %d is more than the %d online cores; using %d\n",
                    c->name, e->n_threads, cores, cores);
            e->n_threads = cores;
        }
    }
    if ((c->groups & CLI_G_PLACE) && e->cpus) {
        int cpus[1024], n;
        if (pool_parse_cpus(e->cpus, cpus, 1024, &n) != TK_OK) {
            fprintf(stderr, "tokamak %s: --cpus: %s\n", c->name, tk_last_error());
            return 2;
        }
    }
    if ((c->groups & CLI_G_SCHED) && e->step_tokens > 0 && e->step_tokens < e->max_batch) {
        cli_error(c,
                  "--step-tokens %d is below --max-batch %d: a step holds one decode token of every running "
                  "sequence; give --step-tokens %d or more, or a smaller --max-batch",
                  e->step_tokens, e->max_batch, e->max_batch);
        return 2;
    }
    return CLI_GO_ON;
}

int cli_opts_parse(cli_opts *o, int argc, char **argv) {
    const cli_cmd *c = o->cmd;
    bool options_end = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options_end || a[0] != '-' || !a[1]) {
            if (o->n_operands >= c->max_operands) {
                if (c->max_operands == 0)
                    cli_error(c, "unexpected argument '%s'", a);
                else
                    cli_error(c, "too many arguments ('%s'); at most %d", a, c->max_operands);
                return 2;
            }
            o->operands[o->n_operands++] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            options_end = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cli_opts_usage(c, stdout);
            return 0;
        }
        const char *eq = strncmp(a, "--", 2) ? NULL : strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const cli_opt *r = find_row(c, a, len);
        if (!r) {
            cli_error(c, "unknown option '%.*s'; 'tokamak %s --help' lists the options", (int)len, a,
                      c->name);
            return 2;
        }
        const char *v = NULL;
        if (r->kind == CLI_FLAG) {
            if (eq) {
                cli_error(c, "%s takes no value", r->name);
                return 2;
            }
            *(bool *)field(o, r) = true;
        } else {
            if (eq)
                v = eq + 1;
            else if (i + 1 < argc)
                v = argv[++i];
            else {
                cli_error(c, "%s needs a value (%s)", r->name, r->arg ? r->arg : "?");
                return 2;
            }
            if (!set_value(o, r, v)) {
                char want[320];
                cli_error(c, "%s wants %s, got '%s'", r->name, row_want(r, want, sizeof want), v);
                return 2;
            }
        }
        if (o->n_given < CLI_MAX_GIVEN) o->given[o->n_given++] = r;
    }
    return check_groups(o);
}

void cli_opts_fit_model(cli_opts *o, const tk_model *m) {
    if (!(o->cmd->groups & CLI_G_KV)) return;
    tk_model_info in;
    tk_model_get_info(m, &in);
    if (in.n_ctx_train <= 0 || o->engine.ctx <= in.n_ctx_train) return;
    if (!cli_opts_given(o, "--ctx")) {
        fprintf(stderr,
                "tokamak %s: the model's trained context is %d tokens; using --ctx %d (the default is %d)\n",
                o->cmd->name, in.n_ctx_train, in.n_ctx_train, o->engine.ctx);
        o->engine.ctx = in.n_ctx_train;
    } else {
        fprintf(stderr, "tokamak %s: warning: --ctx %d is above the model's trained context of %d tokens\n",
                o->cmd->name, o->engine.ctx, in.n_ctx_train);
    }
}

/* ---- --help ------------------------------------------------------------------------ */

static void print_row(const cli_opt *r, FILE *f) {
    char left[64], list[256];
    if (r->kind == CLI_SECTION) {
        fprintf(f, "%s:\n", r->name);
        return;
    }
    snprintf(left, sizeof left, "%s%s%s%s%s", r->name, r->alias ? ", " : "", r->alias ? r->alias : "",
             r->arg ? " " : "", r->arg ? r->arg : "");
    const char *h = r->help ? r->help : "";
    const char *nl = strchr(h, '\n');
    int w = nl ? (int)(nl - h) : (int)strlen(h);
    if (strlen(left) > 22)
        fprintf(f, "  %s\n  %-22s %.*s", left, "", w, h);
    else
        fprintf(f, "  %-22s %.*s", left, w, h);
    while (nl) {
        h = nl + 1;
        nl = strchr(h, '\n');
        w = nl ? (int)(nl - h) : (int)strlen(h);
        fprintf(f, "\n  %-22s %.*s", "", w, h);
    }
    if (r->kind == CLI_ENUM) fprintf(f, ": %s", names_list(r->names, ", ", list, sizeof list));
    fputc('\n', f);
}

void cli_opts_usage(const cli_cmd *c, FILE *f) {
    fprintf(f, "%s\n", c->usage);
    bool headed = false;
    for (int t = 0; t < 2; t++)
        for (const cli_opt *r = t ? c->own_shared : c->own; r && r->name; r++) {
            if (!headed && r->kind != CLI_SECTION) fputc('\n', f);
            if (r->kind == CLI_SECTION) fputc('\n', f);
            headed = true;
            print_row(r, f);
        }
    const char *heading = NULL;
    for (int g = 0; g < N_GROUPS; g++) {
        if (!(c->groups & GROUPS[g].bit)) continue;
        if (!heading || strcmp(heading, GROUPS[g].heading)) fprintf(f, "\n%s:\n", GROUPS[g].heading);
        heading = GROUPS[g].heading;
        for (const cli_opt *r = GROUPS[g].rows; r->name; r++) print_row(r, f);
    }
    if (c->notes) fprintf(f, "\n%s\n", c->notes);
}
