/* tokamak detokenize: token ids -> text, through the streaming detokenizer
 * (so it prints exactly what a generation stream would). */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/alloc.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

#define DETOKENIZE_MAX_INPUT ((size_t)1 << 30)

/* Decode the ids in text[0..len) and print them; 1 on a bad id. */
static int decode_span(const tk_tokenizer *t, const char *text, size_t len, bool special, char *out,
                       size_t cap) {
    tok_stream *s;
    if (tok_stream_init(t, special, &s)) {
        fprintf(stderr, "tokamak detokenize: %s\n", tk_last_error());
        return 1;
    }
    int rc = 0;
    size_t i = 0;
    while (i < len) {
        char c = text[i];
        if (c == ' ' || c == '\t' || c == ',' || c == '\n' || c == '\r' || c == '[' || c == ']') {
            i++;
            continue;
        }
        char num[24];
        size_t k = 0;
        while (i < len && k < sizeof num - 1 &&
               ((text[i] >= '0' && text[i] <= '9') || (k == 0 && text[i] == '-')))
            num[k++] = text[i++];
        num[k] = 0;
        char *end;
        errno = 0;
        long v = k ? strtol(num, &end, 10) : 0;
        if (!k || *end || errno || v < 0 || v >= tok_n_vocab(t)) {
            fprintf(stderr, "tokamak detokenize: '%.*s' is not a token id (0..%d)\n", (int)(k ? k : 1),
                    k ? num : text + i, tok_n_vocab(t) - 1);
            rc = 1;
            break;
        }
        size_t n = tok_stream_push(s, (int32_t)v, out, cap);
        fwrite(out, 1, n, stdout);
    }
    size_t n = tok_stream_flush(s, out, cap);
    fwrite(out, 1, n, stdout);
    tok_stream_free(s);
    return rc;
}

typedef struct detokenize_args {
    const char *model;
    bool special, lines;
} detokenize_args;

static const cli_opt DETOKENIZE_ROWS[] = {
    {.name = "-m",
     .alias = "--model",
     .arg = "MODEL",
     .help = "a directory with tokenizer.json, a tokenizer.json file, or a GGUF model",
     .kind = CLI_STR,
     .off = offsetof(detokenize_args, model)},
    {.name = "--special",
     .help = "show special tokens (default: hidden)",
     .kind = CLI_FLAG,
     .off = offsetof(detokenize_args, special)},
    {.name = "--lines",
     .help = "each input line is one sequence; print one text line per input line",
     .kind = CLI_FLAG,
     .off = offsetof(detokenize_args, lines)},
    {0},
};

static const cli_cmd DETOKENIZE_CMD = {
    "detokenize",
    "usage: tokamak detokenize -m MODEL [--special] [--lines] [FILE|-]",
    0,
    DETOKENIZE_ROWS,
    "FILE holds ids separated by spaces, tabs, commas or newlines (default: standard input), 1 GiB at most.",
    1,
    NULL,
};

int cmd_detokenize(int argc, char **argv) {
    detokenize_args a = {0};
    cli_opts o;
    cli_opts_init(&o, &DETOKENIZE_CMD, &a);
    int prc = cli_opts_parse(&o, argc, argv);
    if (prc != CLI_GO_ON) return prc;
    if (!a.model) {
        cli_error(&DETOKENIZE_CMD, "-m MODEL is required; 'tokamak detokenize --help' lists the options");
        return 2;
    }
    const char *model = a.model, *file = o.n_operands ? o.operands[0] : NULL;
    bool special = a.special, lines = a.lines;
    FILE *in = stdin;
    if (file && strcmp(file, "-") && !(in = fopen(file, "rb"))) {
        fprintf(stderr, "tokamak detokenize: cannot open %s\n", file);
        return 1;
    }
    size_t len = 0;
    char *text = NULL;
    tk_status rs = cli_read_all(in, file ? file : "standard input", DETOKENIZE_MAX_INPUT, &text, &len);
    if (in != stdin) fclose(in);
    if (rs != TK_OK) {
        fprintf(stderr, "tokamak detokenize: %s\n", tk_last_error());
        return 1;
    }
    tk_tokenizer *t = NULL;
    if (tok_load_path(model, &t)) {
        fprintf(stderr, "tokamak detokenize: %s\n", tk_last_error());
        tk_free(text);
        return 1;
    }
    size_t cap = tok_stream_bound(t);
    char *out = tk_malloc(cap);
    int rc = out ? 0 : 1;
    if (!lines) {
        if (!rc) rc = decode_span(t, text, len, special, out, cap);
    } else {
        for (size_t pos = 0; !rc && pos < len;) {
            const char *nl = memchr(text + pos, '\n', len - pos);
            size_t end = nl ? (size_t)(nl - text) : len;
            rc = decode_span(t, text + pos, end - pos, special, out, cap);
            putchar('\n');
            pos = end + 1;
        }
    }
    if (fflush(stdout) != 0) rc = 1;
    tk_free(out);
    tk_free(text);
    tok_free(t);
    return rc;
}
