/* tokamak info: a model's shapes, its bytes per weight type, the bytes one
 * decode token must read, KV bytes per token of context, and the TPOT floor
 * those bytes imply at a memory bandwidth (given, or measured here). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/probe.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "core/dtype.h"
#include "kv/kv.h"
#include "model/model.h"
#include "tokamak.h"

typedef struct info_args {
    double bw;
} info_args;

static const cli_opt INFO_ROWS[] = {
    {.name = "--bw",
     .arg = "GBPS",
     .help = "memory bandwidth for the TPOT floor (default: measured now)",
     .kind = CLI_DOUBLE,
     .off = offsetof(info_args, bw),
     .lo = 0,
     .hi = 1e6,
     .flags = CLI_LO_OPEN},
    {0},
};

static const cli_cmd INFO_CMD = {
    "info",
    "usage: tokamak info -m MODEL [--bw GBPS] [--threads N] [--repack TYPE]",
    CLI_G_MODEL | CLI_G_THREADS,
    INFO_ROWS,
    "The weights are read through the file mapping (shapes only, no copy); --repack accounts for the\n"
    "weights repacked at load, --threads sizes the bandwidth probe.",
    0,
    NULL,
};

static void print_bytes(const char *label, uint64_t b) {
    printf("%-22s %llu (%.2f MiB)\n", label, (unsigned long long)b, (double)b / (1024.0 * 1024.0));
}

static size_t kv_token_bytes(const tk_model_info *in, tk_kv_type t) {
    tk_kv_opts o = {.n_layer = in->n_layer,
                    .n_head_kv = in->n_head_kv,
                    .head_dim = in->head_dim,
                    .block_size = 128,
                    .n_blocks = 1,
                    .type = t,
                    .scale = TK_KV_SCALE_HEAD};
    return kv_bytes_per_token(&o);
}

int cmd_info(int argc, char **argv) {
    info_args ia = {0};
    cli_opts o;
    cli_opts_init(&o, &INFO_CMD, &ia);
    o.model.use_mmap = true; /* info reads shapes only: no copy of the weights */
    int rc = cli_opts_parse(&o, argc, argv);
    if (rc != CLI_GO_ON) return rc;
    if (!o.model_path) {
        cli_error(&INFO_CMD, "-m MODEL is required; 'tokamak info --help' lists the options");
        return 2;
    }
    const char *path = o.model_path;
    double bw = ia.bw;
    int threads = o.engine.n_threads;
    tk_model_opts mo = o.model;
    tk_model *m;
    if (tk_model_open(path, &mo, &m) != TK_OK) {
        fprintf(stderr, "tokamak info: %s\n", tk_last_error());
        return 1;
    }
    tk_model_info in;
    tk_model_get_info(m, &in);
    const tk_hparams *hp = model_hparams(m);
    printf("%-22s %s\n", "model", in.name);
    printf("%-22s %s\n", "architecture", in.arch);
    printf("%-22s layers %d, embd %d, heads %d, kv heads %d, head_dim %d, ff %d, vocab %d\n", "shape",
           in.n_layer, in.n_embd, in.n_head, in.n_head_kv, in.head_dim, in.n_ff, in.n_vocab);
    printf("%-22s %d\n", "context (trained)", in.n_ctx_train);
    printf("%-22s theta %g, scaling %s\n", "rope", (double)hp->rope_theta,
           hp->rope_scaling == TK_ROPE_SCALING_LLAMA3   ? "llama3"
           : hp->rope_scaling == TK_ROPE_SCALING_LINEAR ? "linear"
                                                        : "none");
    printf("%-22s %s\n", "tied embeddings", in.tied_embeddings ? "yes" : "no");
    printf("%-22s %lld (%.3f B)\n", "parameters", (long long)in.n_params, (double)in.n_params / 1e9);
    printf("%-22s %s\n", "weight type", in.weight_dtype);
    print_bytes("weight bytes", in.weight_bytes);
    uint64_t by[TK_DTYPE_COUNT];
    model_dtype_bytes(m, by);
    for (int t = 0; t < TK_DTYPE_COUNT; t++)
        if (by[t]) {
            char label[32];
            snprintf(label, sizeof label, "  %s", dtype_name((uint32_t)t));
            printf("%-22s %llu (%.2f MiB, %.1f%%)\n", label, (unsigned long long)by[t],
                   (double)by[t] / (1024.0 * 1024.0), 100.0 * (double)by[t] / (double)in.weight_bytes);
        }
    print_bytes("decode bytes/token", in.decode_bytes);
    printf("%-22s f16 %zu, int8 %zu (bytes per token of context, all layers)\n", "kv bytes/token",
           kv_token_bytes(&in, TK_KV_F16), kv_token_bytes(&in, TK_KV_INT8));
    printf("%-22s %s\n", "tokenizer", model_tokenizer(m) ? "yes" : "none (ids only)");
    char src[96] = "given";
    if (bw <= 0) {
        probe_stats ps;
        probe_read_bw_stats(threads, &ps);
        bw = ps.best;
        snprintf(src, sizeof src, "probed: best of %d passes, min %.1f, median %.1f", ps.n, ps.min,
                 ps.median);
    }
    if (bw > 0) {
        /* The floor holds only as far as the bandwidth does: a run that decodes
         * faster read faster than the probe, which is the probe's shortfall. */
        double floor_ms = (double)in.decode_bytes / (bw * 1e9) * 1e3;
        printf("%-22s %.3f ms at %.1f GB/s (%s), %.1f tok/s at that bandwidth (weights only; a run "
               "decoding faster shows a probe shortfall)\n",
               "TPOT floor", floor_ms, bw, src, 1e3 / floor_ms);
    } else {
        printf("%-22s unknown (bandwidth probe failed)\n", "TPOT floor");
    }
    tk_model_free(m);
    return 0;
}
