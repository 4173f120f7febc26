/* tokamak detokenize: token ids -> text, through the streaming detokenizer
 * (so it prints exactly what a generation stream would). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/alloc.h"
#include "tokenizer/tokenizer.h"

#define DETOKENIZE_MAX_INPUT ((size_t)1 << 30)

static void detokenize_usage(FILE *f) {
    fprintf(f,
            "usage: tokamak detokenize -m MODEL [--special] [--lines] [FILE|-]\n"
            "  -m MODEL    a directory with tokenizer.json, a tokenizer.json file, or a GGUF model\n"
            "  --special   show special tokens (default: hidden)\n"
            "  --lines     each input line is one sequence; print one text line per input line\n"
            "  FILE        ids separated by spaces, tabs, commas or newlines (default: standard input)\n");
}

/* Read all of f into a tk_malloc'd buffer (NUL-terminated); NULL on error or past limit. */
/* Decode the ids in text[0..len) and print them; 1 on a bad id. */
static int decode_span(const tk_tokenizer *t, const char *text, size_t len, bool special, char *out, size_t cap) {
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
        while (i < len && k < sizeof num - 1 && ((text[i] >= '0' && text[i] <= '9') || (k == 0 && text[i] == '-')))
            num[k++] = text[i++];
        num[k] = 0;
        char *end;
        errno = 0;
        long v = k ? strtol(num, &end, 10) : 0;
        if (!k || *end || errno || v < 0 || v >= tok_n_vocab(t)) {
            fprintf(stderr, "tokamak detokenize: '%.*s' is not a token id (0..%d)\n", (int)(k ? k : 1), k ? num : text + i,
                    tok_n_vocab(t) - 1);
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

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    bool special = false, lines = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (++i >= argc) {
                fprintf(stderr, "tokamak detokenize: %s needs a value\n", a);
                return 2;
            }
            model = argv[i];
        } else if (!strcmp(a, "--special")) special = true;
        else if (!strcmp(a, "--lines")) lines = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            detokenize_usage(stdout);
            return 0;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tokamak detokenize: unknown option '%s'\n", a);
            detokenize_usage(stderr);
            return 2;
        } else if (!file) file = a;
        else {
            fprintf(stderr, "tokamak detokenize: more than one input file\n");
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "tokamak detokenize: -m MODEL is required\n");
        detokenize_usage(stderr);
        return 2;
    }
    FILE *in = stdin;
    if (file && strcmp(file, "-") && !(in = fopen(file, "rb"))) {
        fprintf(stderr, "tokamak detokenize: cannot open %s\n", file);
        return 1;
    }
    size_t len = 0;
    char *text = cli_read_all(in, DETOKENIZE_MAX_INPUT, &len);
    if (in != stdin) fclose(in);
    if (!text) {
        fprintf(stderr, "tokamak detokenize: cannot read the input (or it is over 1 GiB)\n");
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
