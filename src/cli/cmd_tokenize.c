/* tokamak tokenize: text -> token ids (or pieces, or a count).
 *
 * -m takes a directory with tokenizer.json, a tokenizer.json path, or a GGUF
 * model. --lines encodes each '\n'-terminated line on its own (the newline is
 * not part of it), which is how the tests compare with Hugging Face line by line. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/alloc.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

#define TOKENIZE_MAX_INPUT ((size_t)1 << 30)

static void print_escaped(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\r')
            fputs("\\r", stdout);
        else if (c == '\\')
            fputs("\\\\", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}

/* CPU time of this thread: the throughput of one core, whatever else the machine runs. */
static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef enum { OUT_IDS, OUT_PIECES, OUT_COUNT } out_mode;

static int emit_ids(const tk_tokenizer *t, const int32_t *ids, size_t n, out_mode mode, char *dec,
                    size_t dec_cap) {
    if (mode == OUT_COUNT) {
        printf("%zu\n", n);
        return 0;
    }
    if (mode == OUT_IDS) {
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
        putchar('\n');
        return 0;
    }
    /* pieces: each token's own text, as a stream that shows special tokens would print it */
    for (size_t i = 0; i < n; i++) {
        tok_stream *s;
        if (tok_stream_init(t, true, &s)) return 1;
        size_t k = tok_stream_push(s, ids[i], dec, dec_cap);
        k += tok_stream_flush(s, dec + k, dec_cap - k);
        tok_stream_free(s);
        printf("%d\t", (int)ids[i]);
        print_escaped(dec, k);
        putchar('\n');
    }
    return 0;
}

typedef struct tokenize_args {
    const char *model;
    bool ids, pieces, count, lines, no_bos, no_special, timing;
} tokenize_args;

static const cli_opt TOKENIZE_ROWS[] = {
    {.name = "-m",
     .alias = "--model",
     .arg = "MODEL",
     .help = "a directory with tokenizer.json, a tokenizer.json file, or a GGUF model",
     .kind = CLI_STR,
     .off = offsetof(tokenize_args, model)},
    {.name = "--ids",
     .help = "print token ids separated by spaces (default)",
     .kind = CLI_FLAG,
     .off = offsetof(tokenize_args, ids)},
    {.name = "--pieces",
     .help = "print one token per line: id, a tab, and its text (escaped)",
     .kind = CLI_FLAG,
     .off = offsetof(tokenize_args, pieces)},
    {.name = "--count",
     .help = "print the number of tokens",
     .kind = CLI_FLAG,
     .off = offsetof(tokenize_args, count)},
    {.name = "--lines",
     .help = "encode each input line separately (one output line per input line)",
     .kind = CLI_FLAG,
     .off = offsetof(tokenize_args, lines)},
    {.name = "--no-bos",
     .help = "never add BOS (default: add it when the vocabulary asks for it)",
     .kind = CLI_FLAG,
     .off = offsetof(tokenize_args, no_bos)},
    {.name = "--no-special",
     .help = "treat special tokens in the text as plain text",
     .kind = CLI_FLAG,
     .off = offsetof(tokenize_args, no_special)},
    {.name = "--time",
     .help = "print encode throughput to stderr (MB per CPU-second of this thread)",
     .kind = CLI_FLAG,
     .off = offsetof(tokenize_args, timing)},
    {0},
};

static const cli_cmd TOKENIZE_CMD = {
    "tokenize",
    "usage: tokamak tokenize -m MODEL [--ids|--pieces|--count] [--lines] [--no-bos] [--no-special]\n"
    "                        [--time] [FILE|-]",
    0,
    TOKENIZE_ROWS,
    "FILE is the input text (default: standard input), 1 GiB at most.",
    1,
    NULL,
};

int cmd_tokenize(int argc, char **argv) {
    tokenize_args a = {0};
    cli_opts o;
    cli_opts_init(&o, &TOKENIZE_CMD, &a);
    int rc = cli_opts_parse(&o, argc, argv);
    if (rc != CLI_GO_ON) return rc;
    if (a.ids + a.pieces + a.count > 1) {
        cli_error(&TOKENIZE_CMD, "give one of --ids, --pieces or --count");
        return 2;
    }
    if (!a.model) {
        cli_error(&TOKENIZE_CMD, "-m MODEL is required; 'tokamak tokenize --help' lists the options");
        return 2;
    }
    out_mode mode = a.pieces ? OUT_PIECES : a.count ? OUT_COUNT : OUT_IDS;
    bool lines = a.lines, bos = !a.no_bos, special = !a.no_special, timing = a.timing;
    const char *file = o.n_operands ? o.operands[0] : NULL;
    FILE *in = stdin;
    if (file && strcmp(file, "-") && !(in = fopen(file, "rb"))) {
        fprintf(stderr, "tokamak tokenize: cannot open %s\n", file);
        return 1;
    }
    size_t len = 0;
    char *text = NULL;
    tk_status rs = cli_read_all(in, file ? file : "standard input", TOKENIZE_MAX_INPUT, &text, &len);
    if (in != stdin) fclose(in);
    if (rs != TK_OK) {
        fprintf(stderr, "tokamak tokenize: %s\n", tk_last_error());
        return 1;
    }
    tk_tokenizer *t = NULL;
    if (tok_load_path(a.model, &t)) {
        fprintf(stderr, "tokamak tokenize: %s\n", tk_last_error());
        tk_free(text);
        return 1;
    }
    rc = 0;
    size_t cap = tok_encode_bound(t, len), dec_cap = tok_stream_bound(t) * 2;
    int32_t *ids = cap < SIZE_MAX / sizeof(int32_t) ? tk_malloc(cap * sizeof *ids + 1) : NULL;
    char *dec = tk_malloc(dec_cap);
    uint64_t ns = 0, n_tok = 0;
    if (!ids || !dec) {
        fprintf(stderr, "tokamak tokenize: out of memory\n");
        rc = 1;
        goto done;
    }
    for (size_t pos = 0; pos < len || (!lines && pos == 0);) {
        size_t end = len;
        if (lines) {
            const char *nl = memchr(text + pos, '\n', len - pos);
            end = nl ? (size_t)(nl - text) : len;
        }
        size_t n = 0;
        uint64_t t0 = cpu_ns();
        if (tok_encode(t, text + pos, end - pos, bos, special, ids, cap, &n)) {
            fprintf(stderr, "tokamak tokenize: %s\n", tk_last_error());
            rc = 1;
            goto done;
        }
        ns += cpu_ns() - t0;
        n_tok += n;
        if ((rc = emit_ids(t, ids, n, mode, dec, dec_cap))) goto done;
        pos = end + 1;
        if (!lines) break;
    }
    if (timing) {
        double s = (double)ns * 1e-9;
        fprintf(stderr, "tokamak tokenize: %zu bytes, %llu tokens in %.3f CPU s = %.2f MB/s\n", len,
                (unsigned long long)n_tok, s, s > 0 ? (double)len / 1e6 / s : 0.0);
    }
done:
    if (fflush(stdout) != 0) rc = 1;
    tk_free(ids);
    tk_free(dec);
    tk_free(text);
    tok_free(t);
    return rc;
}
