/* The one option parser of the tokamak subcommands.
 *
 * An option is a row: its name (and an alias), the argument it takes, one help
 * line, a kind (flag, integer, number, size, string, name from a table, or a
 * callback), a range, and where the value goes. The shared rows (model, engine
 * and sampling options) are defined once here; a subcommand declares which of
 * their groups it takes plus its own rows, and --help is generated from the
 * rows, so a shared option reads the same in every subcommand's help.
 *
 * A subcommand:
 *
 *     typedef struct my_args { long n; const char *out; } my_args;
 *     static const cli_opt MY_ROWS[] = {
 *         {.kind = CLI_SECTION, .name = "output"},
 *         {.name = "-n", .arg = "N", .help = "tokens to generate", .kind = CLI_INT,
 *          .off = offsetof(my_args, n), .lo = 0, .hi = 1 << 24},
 *         {.name = "-o", .alias = "--output", .arg = "FILE", .help = "where to write", .kind = CLI_STR,
 *          .off = offsetof(my_args, out)},
 *         {0},
 *     };
 *     static const cli_cmd MY_CMD = {.name = "my", .usage = "usage: tokamak my -m MODEL [options]",
 *                                    .groups = CLI_G_MODEL | CLI_G_ENGINE | CLI_G_SAMPLING, .own = MY_ROWS};
 *
 *     my_args a = {.n = 32};
 *     cli_opts o;
 *     cli_opts_init(&o, &MY_CMD, &a);       // defaults of every group
 *     int rc = cli_opts_parse(&o, argc, argv);
 *     if (rc != CLI_GO_ON) return rc;       // 0 after --help, 2 after a usage error (printed)
 *     ... tk_model_open(o.model_path, &o.model, &m) ...
 *     cli_opts_fit_model(&o, m);            // --ctx against the trained context
 *     ... tk_engine_create(m, &o.engine, &e) ...
 *
 * Values are accepted as "--name VALUE" or "--name=VALUE". Numbers must be
 * whole (no trailing text) and inside the row's range; a message names the
 * option, the range or the choices, and the value given. Strings point into
 * argv. Nothing here allocates; a cli_opts is one subcommand's parse, for one
 * thread. Messages go to stderr prefixed "tokamak <command>: ". */
#ifndef TK_CLI_OPTS_H
#define TK_CLI_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "core/names.h"
#include "tokamak.h"

typedef enum cli_kind {
    CLI_SECTION, /* not an option: a heading in --help (name is the heading) */
    CLI_FLAG,    /* no value; sets a bool to true */
    CLI_INT,     /* int in [lo, hi] */
    CLI_LONG,    /* long in [lo, hi] */
    CLI_U64,     /* uint64_t, decimal digits only (no sign) */
    CLI_FLOAT,   /* float in [lo, hi] */
    CLI_DOUBLE,  /* double in [lo, hi] */
    CLI_MIB,     /* size_t bytes: N MiB, or N with a K, M or G suffix; N in [lo, hi] MiB */
    CLI_STR,     /* const char *, pointing into argv */
    CLI_ENUM,    /* int: a name of the row's table */
    CLI_FN,      /* fn(value, field) parses; false rejects the value ("wants <want>") */
} cli_kind;

/* Where a row's value goes: the field at off in that struct. */
typedef enum cli_dest {
    CLI_D_OWN,      /* the subcommand's own struct (cli_opts.own) */
    CLI_D_OPTS,     /* cli_opts itself (model_path) */
    CLI_D_MODEL,    /* cli_opts.model */
    CLI_D_ENGINE,   /* cli_opts.engine */
    CLI_D_SAMPLING, /* cli_opts.sampling */
} cli_dest;

/* Groups of shared rows a subcommand takes. */
enum {
    CLI_G_MODEL = 1 << 0,    /* -m, --repack, --mmap, --row-layout */
    CLI_G_THREADS = 1 << 1,  /* --threads, --pin, --even-rows */
    CLI_G_KV = 1 << 2,       /* --ctx, --kv-type, --kv-scale, --block-size, --kv-mem */
    CLI_G_SCHED = 1 << 3,    /* --max-batch, --max-seqs, --step-tokens, --step-ms, --no-chunking,
                              * --static-batching, --unfused */
    CLI_G_SAMPLING = 1 << 4, /* --temp, --top-k, --top-p, --min-p, the penalties, --seed */
    CLI_G_PLACE = 1 << 5,    /* --cpus, --numa (where the engine's threads and memory go) */
    CLI_G_ENGINE = CLI_G_THREADS | CLI_G_PLACE | CLI_G_KV | CLI_G_SCHED,
};

/* Row flags. */
enum {
    CLI_LO_OPEN = 1 << 0, /* lo itself is out of range: (lo, hi] */
    CLI_POW2 = 1 << 1,    /* CLI_INT: a power of two as well */
};

typedef struct cli_opt {
    const char *name;  /* "--kv-type" or "-m"; for CLI_SECTION the heading; NULL ends a table */
    const char *alias; /* a second spelling ("--model"), or NULL */
    const char *arg;   /* the value as --help shows it ("N"); NULL for flags */
    const char *help;  /* one line; '\n' starts an indented continuation line */
    cli_kind kind;
    cli_dest dest;
    size_t off;     /* offsetof the field in dest's struct */
    double lo, hi;  /* inclusive range of numbers (CLI_INT, CLI_LONG, CLI_FLOAT, CLI_DOUBLE, CLI_MIB) */
    unsigned flags; /* CLI_LO_OPEN, CLI_POW2 */
    const names_table *names;                 /* CLI_ENUM; --help lists its names */
    bool (*fn)(const char *value, void *dst); /* CLI_FN */
    const char *want;                         /* CLI_FN: what a value must be, for messages */
} cli_opt;

typedef struct cli_cmd {
    const char *name;   /* "run": messages read "tokamak run: ..." */
    const char *usage;  /* the usage lines --help prints first (no trailing newline needed) */
    unsigned groups;    /* CLI_G_* taken */
    const cli_opt *own; /* the subcommand's rows, ended by {0}; NULL: none. Listed before the groups. */
    const char *notes;  /* printed after the options; NULL: none */
    int max_operands;   /* words that are not options (a FILE), 0: none accepted */
    const cli_opt *own_shared; /* more rows of the own struct that another subcommand takes too
                                * (bench and loadgen: cli/load.h), listed after own; NULL: none */
} cli_cmd;

#define CLI_MAX_GIVEN    64
#define CLI_MAX_OPERANDS 4

typedef struct cli_opts {
    const cli_cmd *cmd;
    void *own;              /* the subcommand's struct (CLI_D_OWN rows) */
    const char *model_path; /* -m */
    tk_model_opts model;
    tk_engine_opts engine;
    tk_sampling sampling;
    const char *operands[CLI_MAX_OPERANDS];
    int n_operands;
    const cli_opt *given[CLI_MAX_GIVEN]; /* rows given on the command line, in order */
    int n_given;
} cli_opts;

#define CLI_GO_ON (-1)

/* Defaults: tk_model_opts_default, tk_engine_opts_default, tk_sampling_default;
 * own is the subcommand's struct, already holding its defaults (may be NULL
 * without CLI_D_OWN rows). Change a default after this, before parsing. */
void cli_opts_init(cli_opts *o, const cli_cmd *cmd, void *own);

/* Parse argv[1..argc) (argv[0] is the subcommand's name). Returns CLI_GO_ON
 * when the subcommand should run, 0 after printing --help to stdout, 2 after
 * printing a usage error to stderr. Then checks the shared options together:
 * --threads above the online cores is capped to them with a warning;
 * --step-tokens below --max-batch is an error naming both. */
int cli_opts_parse(cli_opts *o, int argc, char **argv);

/* True when the option (by its name or alias) was on the command line. */
bool cli_opts_given(const cli_opts *o, const char *name);

/* Checks the engine options against the model (for subcommands with CLI_G_KV):
 * without --ctx, a default context above the model's trained one becomes the
 * trained one (said on stderr); an explicit --ctx above it is kept with a
 * warning. */
void cli_opts_fit_model(cli_opts *o, const tk_model *m);

/* --help text: usage, the own rows, then each group taken, then the notes. */
void cli_opts_usage(const cli_cmd *cmd, FILE *f);

/* Messages in the subcommand's voice: "tokamak <name>: ..." on stderr. */
void cli_error(const cli_cmd *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parsers for values outside the option table (CLI_FN rows use them too). */
bool cli_parse_long(const char *s, long lo, long hi, long *out);
/* "1,8,32": at most max integers in [lo, hi] (ints; hi fits an int) into
 * out[0, *n); false (out partly written) on an empty list or item, a stray
 * character, a value out of range or more than max. */
bool cli_parse_int_list(const char *s, long lo, long hi, int max, int *out, int *n);
/* The same for positive finite numbers ("0.5,2"). */
bool cli_parse_real_list(const char *s, int max, double *out, int *n);
bool cli_parse_double(const char *s, double lo, double hi, double *out);
bool cli_parse_u64(const char *s, uint64_t *out);
/* "1,2, 3" (commas and/or white space) -> ids in [0, INT32_MAX] (tk_malloc'd,
 * free with tk_free); false on anything else or when empty. */
bool cli_parse_ids(const char *s, int32_t **ids, int *n);

#endif
