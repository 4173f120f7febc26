/* `tokamak synth`: write a synthetic model with real shapes and seeded weights,
 * as GGUF (every dtype tokamak runs) or as a Hugging Face directory. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/synth.h"
#include "core/alloc.h"
#include "core/error.h"

static void synth_usage(FILE *f) {
    fprintf(f,
            "usage: tokamak synth --preset NAME [--dtype T] [options] -o OUT\n\n"
            "  --preset NAME      tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-14b, qwen3-32b\n"
            "  --dtype T          f32 (default), f16, bf16, q8_0, q4_0, q4_k_m\n"
            "  --arch A           qwen3 (default), qwen2, llama (preset tiny only)\n"
            "  --layers N         override the number of layers\n"
            "  --seed S           weight seed (default 0); same seed, same bytes\n"
            "  --vocab N          embedding rows (>= the tokenizer's 151669; default the preset's)\n"
            "  --tied | --untied  share token_embd as the output matrix or not (default: the preset's)\n"
            "  --format gguf|hf   a GGUF file (default) or an HF directory (f32/f16/bf16 only)\n"
            "  --shard-mb N       hf: shard model.safetensors at N MB (with an index; default 4 GB)\n"
            "  -o OUT             output file (gguf) or directory (hf)\n"
            "  --dry-run          print the shapes and the GGUF tensor plan; write nothing\n\n"
            "The vocabulary comes from $TOKAMAK_TOKENIZER_DIR or the npm Qwen3 tokenizer under .cache\n"
            "(`make deps`). Weights: gaussian std 0.02, norms 1 + 0.1 * gaussian, biases 0.1 * gaussian.\n");
}

static bool parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static int parse_quant(const char *s, synth_quant *q) {
    for (int i = SYNTH_F32; i <= SYNTH_Q4_K_M; i++)
        if (!strcmp(s, synth_quant_name((synth_quant)i))) {
            *q = (synth_quant)i;
            return 1;
        }
    return 0;
}

/* The plan as text (for tests and for sizing a download-free benchmark). */
static int print_plan(const synth_cfg *c) {
    const tk_preset *p = &c->p;
    synth_tensor *ts;
    int n;
    if (synth_plan(c, &ts, &n) != TK_OK) {
        fprintf(stderr, "tokamak synth: %s\n", tk_last_error());
        return 2;
    }
    printf("model %s arch %s layers %d embd %d heads %d kv_heads %d head_dim %d ff %d vocab %d ctx %d tied %d "
           "params %lld\n",
           p->name, p->arch, p->n_layer, p->n_embd, p->n_head, p->n_head_kv, p->head_dim, p->n_ff, p->n_vocab, p->n_ctx,
           p->tied, (long long)preset_n_params(p));
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        uint64_t rb = 0;
        dtype_row_bytes(ts[i].gguf_type, (uint64_t)ts[i].ne[0], &rb);
        total += rb * (uint64_t)ts[i].ne[1];
        printf("tensor %s %s %lld %lld\n", ts[i].gguf_name, dtype_name(ts[i].gguf_type), (long long)ts[i].ne[0],
               ts[i].n_dims > 1 ? (long long)ts[i].ne[1] : 0LL);
    }
    printf("tensor_bytes %llu\n", (unsigned long long)total);
    tk_free(ts);
    return 0;
}

int cmd_synth(int argc, char **argv) {
    const char *preset = NULL, *arch = NULL, *outp = NULL, *format = "gguf";
    synth_quant quant = SYNTH_F32;
    int64_t layers = 0, vocab = 0, shard_mb = 0, seed = 0;
    int tied = -1;
    bool dry = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            synth_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--dry-run")) {
            dry = true;
        } else if (!strcmp(a, "--tied")) {
            tied = 1;
        } else if (!strcmp(a, "--untied")) {
            tied = 0;
        } else if (!has_val && a[0] == '-') {
            fprintf(stderr, "tokamak synth: %s needs a value\n", a);
            return 2;
        } else if (!strcmp(a, "--preset")) {
            preset = argv[++i];
        } else if (!strcmp(a, "--arch")) {
            arch = argv[++i];
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            outp = argv[++i];
        } else if (!strcmp(a, "--format")) {
            format = argv[++i];
        } else if (!strcmp(a, "--dtype")) {
            if (!parse_quant(argv[++i], &quant)) {
                fprintf(stderr, "tokamak synth: --dtype %s: expected f32, f16, bf16, q8_0, q4_0 or q4_k_m\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--layers") || !strcmp(a, "--vocab") || !strcmp(a, "--shard-mb") ||
                   !strcmp(a, "--seed")) {
            int64_t *dst = !strcmp(a, "--layers") ? &layers : !strcmp(a, "--vocab") ? &vocab
                                                          : !strcmp(a, "--seed")    ? &seed
                                                                                    : &shard_mb;
            int64_t hi = dst == &layers ? 1024 : dst == &vocab ? (1 << 24) : dst == &seed ? INT64_MAX : (1 << 24);
            if (!parse_i64(argv[++i], dst == &seed ? 0 : 1, hi, dst)) {
                fprintf(stderr, "tokamak synth: %s %s: expected an integer in [%d, %lld]\n", a, argv[i],
                        dst == &seed ? 0 : 1, (long long)hi);
                return 2;
            }
        } else {
            fprintf(stderr, "tokamak synth: unknown option '%s'\n\n", a);
            synth_usage(stderr);
            return 2;
        }
    }
    if (!preset || (!outp && !dry)) {
        fprintf(stderr, "tokamak synth: %s is required\n\n", !preset ? "--preset" : "-o");
        synth_usage(stderr);
        return 2;
    }
    bool hf = !strcmp(format, "hf");
    if (!hf && strcmp(format, "gguf")) {
        fprintf(stderr, "tokamak synth: --format %s: expected gguf or hf\n", format);
        return 2;
    }
    if (shard_mb && !hf) {
        fprintf(stderr, "tokamak synth: --shard-mb is for --format hf\n");
        return 2;
    }
    synth_cfg c = {.quant = quant, .seed = (uint64_t)seed};
    if (preset_require(preset, arch, &c.p) != TK_OK) {
        fprintf(stderr, "tokamak synth: %s\n", tk_last_error());
        return 2;
    }
    if (layers) c.p.n_layer = (int)layers;
    if (tied >= 0) c.p.tied = tied;
    if (vocab) c.p.n_vocab = (int)vocab;
    if (dry) return print_plan(&c);

    char tok_dir[4096];
    synth_vocab *v = NULL;
    tk_status st = synth_tokenizer_dir(tok_dir, sizeof tok_dir);
    if (st == TK_OK && !hf) st = synth_vocab_load(tok_dir, c.p.n_vocab, &v);
    if (st == TK_OK && hf && vocab) {
        /* the vocabulary check is the same for hf: load it once to validate --vocab */
        st = synth_vocab_load(tok_dir, c.p.n_vocab, &v);
    }
    if (st == TK_OK)
        st = hf ? synth_write_hf(&c, tok_dir, outp, (uint64_t)shard_mb << 20, shard_mb > 0)
                : synth_write_gguf(&c, v, outp);
    synth_vocab_free(v);
    if (st != TK_OK) {
        fprintf(stderr, "tokamak synth: %s\n", tk_last_error());
        return st == TK_ERR_INVALID || st == TK_ERR_NOT_FOUND ? 2 : 1;
    }
    fprintf(stderr, "tokamak synth: wrote %s (%s %s, %d layers, %.3fB parameters, %s, seed %llu)\n", outp,
            c.p.arch, c.p.name, c.p.n_layer, (double)preset_n_params(&c.p) / 1e9, synth_quant_name(quant),
            (unsigned long long)seed);
    return 0;
}
