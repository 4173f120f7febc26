/* `tokamak synth`: write a synthetic model with real shapes and seeded weights,
 * as GGUF (every dtype tokamak runs) or as a Hugging Face directory. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/synth.h"
#include "core/alloc.h"
#include "core/error.h"

typedef struct synth_args {
    const char *preset, *arch, *out, *format;
    synth_quant quant;
    long layers, vocab, shard_mb, n_ctx, embd, heads, kv_heads, head_dim, ff;
    uint64_t seed;
    int outliers;
    bool tied, untied, dry;
} synth_args;

static bool parse_quant(const char *s, void *dst) {
    for (int i = SYNTH_F32; i <= SYNTH_Q4_K_M; i++)
        if (!strcmp(s, synth_quant_name((synth_quant)i))) {
            *(synth_quant *)dst = (synth_quant)i;
            return true;
        }
    return false;
}

static const cli_opt SYNTH_ROWS[] = {
    {.name = "--preset",
     .arg = "NAME",
     .help = "tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-14b, qwen3-32b",
     .kind = CLI_STR,
     .off = offsetof(synth_args, preset)},
    {.name = "--dtype",
     .arg = "T",
     .help = "f32 (default), f16, bf16, q8_0, q4_0, q4_k_m",
     .kind = CLI_FN,
     .off = offsetof(synth_args, quant),
     .fn = parse_quant,
     .want = "one of f32, f16, bf16, q8_0, q4_0, q4_k_m"},
    {.name = "--arch",
     .arg = "A",
     .help = "qwen3 (default), qwen2, llama (preset tiny only)",
     .kind = CLI_STR,
     .off = offsetof(synth_args, arch)},
    {.name = "--layers",
     .arg = "N",
     .help = "override the number of layers",
     .kind = CLI_LONG,
     .off = offsetof(synth_args, layers),
     .lo = 1,
     .hi = 1024},
    {.name = "--embd",
     .arg = "N",
     .help = "override the embedding width (hidden size)",
     .kind = CLI_LONG,
     .off = offsetof(synth_args, embd),
     .lo = 1,
     .hi = 1 << 16},
    {.name = "--heads",
     .arg = "N",
     .help = "override the number of query heads",
     .kind = CLI_LONG,
     .off = offsetof(synth_args, heads),
     .lo = 1,
     .hi = 1024},
    {.name = "--kv-heads",
     .arg = "N",
     .help = "override the number of KV heads (it divides the query heads: GQA)",
     .kind = CLI_LONG,
     .off = offsetof(synth_args, kv_heads),
     .lo = 1,
     .hi = 1024},
    {.name = "--head-dim",
     .arg = "N",
     .help = "override head_dim, the width of each head (even: RoPE rotates pairs)",
     .kind = CLI_LONG,
     .off = offsetof(synth_args, head_dim),
     .lo = 2,
     .hi = 1024},
    {.name = "--ff",
     .arg = "N",
     .help = "override the feed-forward width",
     .kind = CLI_LONG,
     .off = offsetof(synth_args, ff),
     .lo = 1,
     .hi = 1 << 20},
    {.name = "--seed",
     .arg = "S",
     .help = "weight seed (default 0); same seed, same bytes",
     .kind = CLI_U64,
     .off = offsetof(synth_args, seed)},
    {.name = "--outliers",
     .arg = "N",
     .help = "plant N input channels with large activations per layer in q/k/v, gate/up and\n"
             "down (x20), as real models show, for calibration to find (default 0)",
     .kind = CLI_INT,
     .off = offsetof(synth_args, outliers),
     .lo = 0,
     .hi = 64},
    {.name = "--vocab",
     .arg = "N",
     .help = "embedding rows (>= the tokenizer's 151669; default the preset's)",
     .kind = CLI_LONG,
     .off = offsetof(synth_args, vocab),
     .lo = 1,
     .hi = 1 << 24},
    {.name = "--n-ctx",
     .arg = "N",
     .help = "the trained context written to the model (default the preset's)",
     .kind = CLI_LONG,
     .off = offsetof(synth_args, n_ctx),
     .lo = 1,
     .hi = 1 << 24},
    {.name = "--tied",
     .help = "share token_embd as the output matrix (default: the preset's)",
     .kind = CLI_FLAG,
     .off = offsetof(synth_args, tied)},
    {.name = "--untied",
     .help = "a separate output matrix",
     .kind = CLI_FLAG,
     .off = offsetof(synth_args, untied)},
    {.name = "--format",
     .arg = "F",
     .help = "gguf: a GGUF file (default); hf: an HF directory (f32/f16/bf16 only)",
     .kind = CLI_STR,
     .off = offsetof(synth_args, format)},
    {.name = "--shard-mb",
     .arg = "N",
     .help = "hf: shard model.safetensors at N MB (with an index; default 4 GB)",
     .kind = CLI_LONG,
     .off = offsetof(synth_args, shard_mb),
     .lo = 1,
     .hi = 1 << 24},
    {.name = "-o",
     .alias = "--output",
     .arg = "OUT",
     .help = "output file (gguf) or directory (hf)",
     .kind = CLI_STR,
     .off = offsetof(synth_args, out)},
    {.name = "--dry-run",
     .help = "print the shapes and the GGUF tensor plan; write nothing",
     .kind = CLI_FLAG,
     .off = offsetof(synth_args, dry)},
    {0},
};

static const cli_cmd SYNTH_CMD = {
    "synth",
    "usage: tokamak synth --preset NAME [--dtype T] [options] -o OUT",
    0,
    SYNTH_ROWS,
    "The vocabulary comes from $TOKAMAK_TOKENIZER_DIR or the npm Qwen3 tokenizer under .cache\n"
    "(`make deps`). Weights: gaussian std 0.02, norms 1 + 0.1 * gaussian, biases 0.1 * gaussian.",
    0,
    NULL,
};

/* The plan as text (for tests and for sizing a download-free benchmark). */
static int print_plan(const synth_cfg *c) {
    const tk_preset *p = &c->p;
    synth_tensor *ts;
    int n;
    if (synth_plan(c, &ts, &n) != TK_OK) {
        fprintf(stderr, "tokamak synth: %s\n", tk_last_error());
        return 2;
    }
    printf(
        "model %s arch %s layers %d embd %d heads %d kv_heads %d head_dim %d ff %d vocab %d ctx %d tied %d "
        "params %lld\n",
        p->name, p->arch, p->n_layer, p->n_embd, p->n_head, p->n_head_kv, p->head_dim, p->n_ff, p->n_vocab,
        p->n_ctx, p->tied, (long long)preset_n_params(p));
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        uint64_t rb = 0;
        dtype_row_bytes(ts[i].gguf_type, (uint64_t)ts[i].ne[0], &rb);
        total += rb * (uint64_t)ts[i].ne[1];
        printf("tensor %s %s %lld %lld\n", ts[i].gguf_name, dtype_name(ts[i].gguf_type),
               (long long)ts[i].ne[0], ts[i].n_dims > 1 ? (long long)ts[i].ne[1] : 0LL);
    }
    printf("tensor_bytes %llu\n", (unsigned long long)total);
    tk_free(ts);
    return 0;
}

int cmd_synth(int argc, char **argv) {
    synth_args sa = {.format = "gguf", .quant = SYNTH_F32};
    cli_opts o;
    cli_opts_init(&o, &SYNTH_CMD, &sa);
    int rc = cli_opts_parse(&o, argc, argv);
    if (rc != CLI_GO_ON) return rc;
    if (sa.tied && sa.untied) {
        cli_error(&SYNTH_CMD, "give one of --tied or --untied");
        return 2;
    }
    const char *preset = sa.preset, *arch = sa.arch, *outp = sa.out, *format = sa.format;
    synth_quant quant = sa.quant;
    int64_t layers = sa.layers, vocab = sa.vocab, shard_mb = sa.shard_mb;
    uint64_t seed = sa.seed;
    int tied = sa.tied ? 1 : sa.untied ? 0 : -1;
    bool dry = sa.dry;
    if (!preset || (!outp && !dry)) {
        cli_error(&SYNTH_CMD, "%s is required; 'tokamak synth --help' lists the options",
                  !preset ? "--preset" : "-o");
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
    synth_cfg c = {.quant = quant, .seed = seed, .outliers = sa.outliers};
    if (preset_require(preset, arch, &c.p) != TK_OK) {
        fprintf(stderr, "tokamak synth: %s\n", tk_last_error());
        return 2;
    }
    if (layers) c.p.n_layer = (int)layers;
    if (tied >= 0) c.p.tied = tied;
    if (vocab) c.p.n_vocab = (int)vocab;
    if (sa.n_ctx) c.p.n_ctx = (int)sa.n_ctx;
    if (sa.embd) c.p.n_embd = (int)sa.embd;
    if (sa.heads) c.p.n_head = (int)sa.heads;
    if (sa.kv_heads) c.p.n_head_kv = (int)sa.kv_heads;
    if (sa.ff) c.p.n_ff = (int)sa.ff;
    if (sa.head_dim) c.p.head_dim = (int)sa.head_dim;
    if (c.p.n_head % c.p.n_head_kv) {
        cli_error(&SYNTH_CMD, "%d query heads are not a multiple of %d KV heads (--heads, --kv-heads)",
                  c.p.n_head, c.p.n_head_kv);
        return 2;
    }
    if (c.p.head_dim % 2) {
        cli_error(&SYNTH_CMD, "--head-dim %d is odd (RoPE rotates pairs)", c.p.head_dim);
        return 2;
    }
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
