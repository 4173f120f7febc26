#include "model/presets.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"

/* Qwen3 rows are the published config.json values (hidden, layers, heads, kv
 * heads, head_dim, intermediate, tie_word_embeddings). The tiny models keep the
 * real 151936-token vocabulary so the real tokenizer works with them; their
 * matmul widths are multiples of 256 so every K-quant block type is exercised.
 * They are untied by default: with tied embeddings and weights this small the
 * greedy continuation mostly repeats a token (norm(x) . E[t] favours the token
 * just read), which makes a weak test; --tied still selects the tied layout. */
#define QWEN3(nm, L, E, H, KV, FF, TIED)                                                                     \
    {                                                                                                        \
        .name = nm, .arch = "qwen3", .n_layer = L, .n_embd = E, .n_head = H, .n_head_kv = KV,                \
        .head_dim = 128, .n_ff = FF, .n_vocab = 151936, .n_ctx = 40960, .rope_theta = 1e6, .rms_eps = 1e-6,  \
        .tied = TIED, .qk_norm = true                                                                        \
    }

static const tk_preset PRESETS[] = {
    /* tiny qwen3: head_dim 128 != n_embd / n_head (= 64), as Qwen3 allows */
    {.name = "tiny",
     .arch = "qwen3",
     .n_layer = 2,
     .n_embd = 256,
     .n_head = 4,
     .n_head_kv = 2,
     .head_dim = 128,
     .n_ff = 768,
     .n_vocab = 151936,
     .n_ctx = 40960,
     .rope_theta = 1e6,
     .rms_eps = 1e-6,
     .tied = false,
     .qk_norm = true},
    QWEN3("qwen3-0.6b", 28, 1024, 16, 8, 3072, true),
    QWEN3("qwen3-1.7b", 28, 2048, 16, 8, 6144, true),
    QWEN3("qwen3-4b", 36, 2560, 32, 8, 9728, true),
    QWEN3("qwen3-8b", 36, 4096, 32, 8, 12288, false),
    QWEN3("qwen3-14b", 40, 5120, 40, 8, 17408, false),
    QWEN3("qwen3-32b", 64, 5120, 64, 8, 25600, false),
};

/* Tiny variants of the other architectures: qwen2 and llama have
 * head_dim = n_embd / n_head, as their HF configs imply. */
static const tk_preset TINY_QWEN2 = {.name = "tiny",
                                     .arch = "qwen2",
                                     .n_layer = 2,
                                     .n_embd = 256,
                                     .n_head = 4,
                                     .n_head_kv = 2,
                                     .head_dim = 64,
                                     .n_ff = 768,
                                     .n_vocab = 151936,
                                     .n_ctx = 32768,
                                     .rope_theta = 1e6,
                                     .rms_eps = 1e-6,
                                     .tied = false,
                                     .qkv_bias = true};
/* Llama-3 style: theta 5e5 and the llama3 RoPE scaling (factor 8, original
 * context 8192), which with head_dim 64 rescales most frequencies. */
static const tk_preset TINY_LLAMA = {.name = "tiny",
                                     .arch = "llama",
                                     .n_layer = 2,
                                     .n_embd = 256,
                                     .n_head = 4,
                                     .n_head_kv = 2,
                                     .head_dim = 64,
                                     .n_ff = 768,
                                     .n_vocab = 151936,
                                     .n_ctx = 131072,
                                     .rope_theta = 5e5,
                                     .rms_eps = 1e-5,
                                     .tied = false,
                                     .rope_factor = 8.0,
                                     .rope_low_freq = 1.0,
                                     .rope_high_freq = 4.0,
                                     .rope_orig_ctx = 8192};

int preset_count(void) { return (int)(sizeof PRESETS / sizeof PRESETS[0]); }

const tk_preset *preset_at(int i) { return i >= 0 && i < preset_count() ? &PRESETS[i] : NULL; }

const tk_preset *preset_find(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < preset_count(); i++)
        if (!strcmp(PRESETS[i].name, name)) return &PRESETS[i];
    return NULL;
}

tk_status preset_require(const char *name, const char *arch, tk_preset *out) {
    const tk_preset *p = preset_find(name);
    if (!p) {
        char list[256] = "";
        for (int i = 0; i < preset_count(); i++) {
            size_t n = strlen(list);
            snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", PRESETS[i].name);
        }
        return tk_fail(TK_ERR_NOT_FOUND, "preset '%s' does not exist (expected one of: %s)",
                       name ? name : "(null)", list);
    }
    if (arch && strcmp(arch, p->arch)) {
        if (strcmp(p->name, "tiny"))
            return tk_fail(TK_ERR_INVALID, "preset '%s' is %s; --arch %s is only for preset tiny", p->name,
                           p->arch, arch);
        if (!strcmp(arch, "qwen2"))
            p = &TINY_QWEN2;
        else if (!strcmp(arch, "llama"))
            p = &TINY_LLAMA;
        else
            return tk_fail(TK_ERR_INVALID, "arch '%s' is not supported (expected qwen3, qwen2 or llama)",
                           arch);
    }
    *out = *p;
    return TK_OK;
}

int64_t preset_n_params(const tk_preset *p) {
    int64_t e = p->n_embd, q = (int64_t)p->n_head * p->head_dim, kv = (int64_t)p->n_head_kv * p->head_dim;
    int64_t layer = e * q + 2 * e * kv + q * e + 3 * e * p->n_ff + 2 * e;
    if (p->qk_norm) layer += 2 * p->head_dim;
    if (p->qkv_bias) layer += q + 2 * kv;
    int64_t emb = (int64_t)p->n_vocab * e;
    return layer * p->n_layer + emb * (p->tied ? 1 : 2) + e;
}
