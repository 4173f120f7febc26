/* tokamak info: a model's shapes, its bytes per weight type, the bytes one
 * decode token must read, KV bytes per token of context, and the TPOT floor
 * those bytes imply at a memory bandwidth (given, or measured here). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/probe.h"
#include "cli/cli.h"
#include "core/dtype.h"
#include "kv/kv.h"
#include "model/model.h"
#include "tokamak.h"

static void info_usage(FILE *f) {
    fprintf(f,
            "usage: tokamak info -m MODEL [--bw GBPS] [--threads N] [--repack TYPE]\n"
            "  -m MODEL      a GGUF file or a Hugging Face directory\n"
            "  --bw GBPS     memory bandwidth for the TPOT floor (default: measured now)\n"
            "  --threads N   threads for the bandwidth probe (default: every core)\n"
            "  --repack TYPE account for the weights repacked at load (e.g. q8_0)\n");
}

static void print_bytes(const char *label, uint64_t b) {
    printf("%-22s %llu (%.2f MiB)\n", label, (unsigned long long)b, (double)b / (1024.0 * 1024.0));
}

static size_t kv_token_bytes(const tk_model_info *in, tk_kv_type t) {
    tk_kv_opts o = {.n_layer = in->n_layer, .n_head_kv = in->n_head_kv, .head_dim = in->head_dim,
                    .block_size = 128, .n_blocks = 1, .type = t, .scale = TK_KV_SCALE_HEAD};
    return kv_bytes_per_token(&o);
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL;
    double bw = 0;
    int threads = 0;
    tk_model_opts mo;
    tk_model_opts_default(&mo);
    mo.use_mmap = true; /* info reads shapes only: no copy of the weights */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            info_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && has) {
            path = argv[++i];
        } else if (!strcmp(a, "--bw") && has) {
            char *end;
            errno = 0;
            bw = strtod(argv[++i], &end);
            if (errno || *end || !(bw > 0 && bw < 1e6)) {
                fprintf(stderr, "tokamak info: --bw '%s' is not a bandwidth in GB/s (0, 1e6)\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--threads") && has) {
            threads = atoi(argv[++i]);
            if (threads < 1 || threads > 4096) {
                fprintf(stderr, "tokamak info: --threads '%s' must be in [1, 4096]\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--repack") && has) {
            if (!tk_weight_type_from_name(argv[++i], &mo.repack)) {
                fprintf(stderr, "tokamak info: --repack '%s' is not a weight type (f32 f16 bf16 q8_0 q4_0 q4_k q6_k)\n",
                        argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "tokamak info: unknown or incomplete option '%s'\n", a);
            info_usage(stderr);
            return 2;
        }
    }
    if (!path) {
        info_usage(stderr);
        return 2;
    }
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
    printf("%-22s layers %d, embd %d, heads %d, kv heads %d, head_dim %d, ff %d, vocab %d\n", "shape", in.n_layer,
           in.n_embd, in.n_head, in.n_head_kv, in.head_dim, in.n_ff, in.n_vocab);
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
    const char *src = "given";
    if (bw <= 0) {
        bw = probe_read_bw(threads);
        src = "measured";
    }
    if (bw > 0) {
        double floor_ms = (double)in.decode_bytes / (bw * 1e9) * 1e3;
        printf("%-22s %.3f ms at %.1f GB/s (%s), %.1f tok/s at most (weights only)\n", "TPOT floor", floor_ms, bw, src,
               1e3 / floor_ms);
    } else {
        printf("%-22s unknown (bandwidth probe failed)\n", "TPOT floor");
    }
    tk_model_free(m);
    return 0;
}
