/* tokamak tokenize: text -> token ids (or pieces, or a count).
 *
 * -m takes a directory with tokenizer.json, a tokenizer.json path, or a GGUF
 * model. --lines encodes each '\n'-terminated line on its own (the newline is
 * not part of it), which is how the tests compare with Hugging Face line by line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "core/alloc.h"
#include "tokenizer/tokenizer.h"

#define TOKENIZE_MAX_INPUT ((size_t)1 << 30)

static void tokenize_usage(FILE *f) {
    fprintf(f,
            "usage: tokamak tokenize -m MODEL [--ids|--pieces|--count] [--lines] [--no-bos] [--no-special]\n"
            "                        [--time] [FILE|-]\n"
            "  -m MODEL       a directory with tokenizer.json, a tokenizer.json file, or a GGUF model\n"
            "  --ids          print token ids separated by spaces (default)\n"
            "  --pieces       print one token per line: id, a tab, and its text (escaped)\n"
            "  --count        print the number of tokens\n"
            "  --lines        encode each input line separately (one output line per input line)\n"
            "  --no-bos       never add BOS (default: add it when the vocabulary asks for it)\n"
            "  --no-special   treat special tokens in the text as plain text\n"
            "  --time         print encode throughput to stderr (MB per CPU-second of this thread)\n"
            "  FILE           input text (default: standard input)\n");
}

/* Read all of f into a tk_malloc'd buffer (NUL-terminated); NULL on error or past limit. */
static void print_escaped(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\\') fputs("\\\\", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
}

/* CPU time of this thread: the throughput of one core, whatever else the machine runs. */
static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef enum { OUT_IDS, OUT_PIECES, OUT_COUNT } out_mode;

static int emit_ids(const tk_tokenizer *t, const int32_t *ids, size_t n, out_mode mode, char *dec, size_t dec_cap) {
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

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    out_mode mode = OUT_IDS;
    bool lines = false, bos = true, special = true, timing = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (++i >= argc) {
                fprintf(stderr, "tokamak tokenize: %s needs a value\n", a);
                return 2;
            }
            model = argv[i];
        } else if (!strcmp(a, "--ids")) mode = OUT_IDS;
        else if (!strcmp(a, "--pieces")) mode = OUT_PIECES;
        else if (!strcmp(a, "--count")) mode = OUT_COUNT;
        else if (!strcmp(a, "--lines")) lines = true;
        else if (!strcmp(a, "--no-bos")) bos = false;
        else if (!strcmp(a, "--no-special")) special = false;
        else if (!strcmp(a, "--time")) timing = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tokenize_usage(stdout);
            return 0;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tokamak tokenize: unknown option '%s'\n", a);
            tokenize_usage(stderr);
            return 2;
        } else if (!file) file = a;
        else {
            fprintf(stderr, "tokamak tokenize: more than one input file\n");
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "tokamak tokenize: -m MODEL is required\n");
        tokenize_usage(stderr);
        return 2;
    }
    FILE *in = stdin;
    if (file && strcmp(file, "-") && !(in = fopen(file, "rb"))) {
        fprintf(stderr, "tokamak tokenize: cannot open %s\n", file);
        return 1;
    }
    size_t len = 0;
    char *text = cli_read_all(in, TOKENIZE_MAX_INPUT, &len);
    if (in != stdin) fclose(in);
    if (!text) {
        fprintf(stderr, "tokamak tokenize: cannot read the input (or it is over 1 GiB)\n");
        return 1;
    }
    tk_tokenizer *t = NULL;
    if (tok_load_path(model, &t)) {
        fprintf(stderr, "tokamak tokenize: %s\n", tk_last_error());
        tk_free(text);
        return 1;
    }
    int rc = 0;
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
