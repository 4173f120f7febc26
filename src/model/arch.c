#include "arch.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

static const char *const ARCH_NAMES[TK_ARCH_COUNT] = {"llama", "qwen2", "qwen3"};

const char *arch_name(tk_arch a) { return (unsigned)a < TK_ARCH_COUNT ? ARCH_NAMES[a] : "unknown"; }

tk_status arch_from_name(const char *name, size_t len, tk_arch *out) {
    for (int a = 0; a < TK_ARCH_COUNT; a++)
        if (strlen(ARCH_NAMES[a]) == len && !memcmp(ARCH_NAMES[a], name, len)) {
            *out = (tk_arch)a;
            return TK_OK;
        }
    return tk_fail(TK_ERR_UNSUPPORTED,
                   "model: unsupported architecture '%.*s' (supported: llama, qwen2, qwen3)",
                   (int)(len > 64 ? 64 : len), name);
}

/* ---- validation ------------------------------------------------------------ */

static tk_status check_range(const char *field, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
        return tk_fail(TK_ERR_FORMAT, "model: %s %lld out of range [%lld, %lld]", field, (long long)v,
                       (long long)lo, (long long)hi);
    return TK_OK;
}

static tk_status check_token(const char *field, int32_t id, int n_vocab) {
    if (id < -1 || id >= n_vocab)
        return tk_fail(TK_ERR_RANGE, "model: %s %d outside the vocabulary of %d tokens", field, (int)id,
                       n_vocab);
    return TK_OK;
}

tk_status arch_hparams_validate(const tk_hparams *hp) {
    tk_status st;
    if ((unsigned)hp->arch >= TK_ARCH_COUNT)
        return tk_fail(TK_ERR_UNSUPPORTED, "model: unsupported architecture id %d", (int)hp->arch);
    if ((st = check_range("block_count", hp->n_layer, 1, TK_MAX_LAYERS))) return st;
    if ((st = check_range("embedding_length", hp->n_embd, 1, TK_MAX_EMBD))) return st;
    if ((st = check_range("feed_forward_length", hp->n_ff, 1, TK_MAX_FF))) return st;
    if ((st = check_range("head_count", hp->n_head, 1, TK_MAX_HEADS))) return st;
    if ((st = check_range("head_count_kv", hp->n_head_kv, 1, TK_MAX_HEADS))) return st;
    if ((st = check_range("key_length (head_dim)", hp->head_dim, 1, TK_MAX_HEAD_DIM))) return st;
    if ((st = check_range("vocab_size", hp->n_vocab, 1, TK_MAX_VOCAB))) return st;
    if ((st = check_range("context_length", hp->n_ctx_train, 0, TK_MAX_CTX_TRAIN))) return st;
    if (hp->n_head % hp->n_head_kv)
        return tk_fail(TK_ERR_FORMAT, "model: head_count %d is not a multiple of head_count_kv %d",
                       hp->n_head, hp->n_head_kv);
    if (hp->head_dim % 2)
        return tk_fail(TK_ERR_FORMAT, "model: head_dim %d is odd (RoPE rotates pairs)", hp->head_dim);
    if (!(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f))
        return tk_fail(TK_ERR_FORMAT, "model: layer_norm_rms_epsilon %g out of range (0, 1)",
                       (double)hp->rms_eps);
    if (!(hp->rope_theta > 1.0f) || !isfinite(hp->rope_theta))
        return tk_fail(TK_ERR_FORMAT, "model: rope.freq_base %g must be finite and > 1",
                       (double)hp->rope_theta);
    if (hp->rope_scaling != TK_ROPE_SCALING_NONE && !(hp->rope_factor >= 1.0f && hp->rope_factor < 1e6f))
        return tk_fail(TK_ERR_FORMAT, "model: rope scaling factor %g out of range [1, 1e6)",
                       (double)hp->rope_factor);
    if (hp->rope_scaling == TK_ROPE_SCALING_LLAMA3 && hp->rope_orig_ctx > 0 &&
        !(hp->rope_high_freq_factor > hp->rope_low_freq_factor && hp->rope_low_freq_factor > 0))
        return tk_fail(TK_ERR_FORMAT,
                       "model: llama3 rope high_freq_factor %g must exceed low_freq_factor %g > 0",
                       (double)hp->rope_high_freq_factor, (double)hp->rope_low_freq_factor);
    if ((st = check_token("bos_token_id", hp->bos_id, hp->n_vocab))) return st;
    if ((st = check_token("eos_token_id", hp->eos_id, hp->n_vocab))) return st;
    if ((st = check_token("pad_token_id", hp->pad_id, hp->n_vocab))) return st;
    return TK_OK;
}

static void hparams_defaults(tk_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    hp->rms_eps = 1e-6f;
    hp->rope_theta = 10000.0f;
    hp->rope_factor = 1.0f;
    hp->bos_id = hp->eos_id = hp->pad_id = -1;
}

/* ---- GGUF ------------------------------------------------------------------- */

static tk_status gguf_int(const gguf_file *f, const char *arch, const char *suffix, bool required,
                          int64_t def, int64_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (required && !gguf_find(f, key)) return tk_fail(TK_ERR_FORMAT, "model: missing metadata key %s", key);
    return gguf_get_i64(f, key, def, out);
}

static tk_status gguf_float(const gguf_file *f, const char *arch, const char *suffix, float def, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_f32(f, key, def, out);
}

/* Clamp for int fields: out-of-range values are caught by validate with the true value. */
static int clamp_int(int64_t v) { return v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int)v; }

static tk_status gguf_token_id(const gguf_file *f, const char *key, int32_t *out) {
    if (!gguf_find(f, key)) {
        *out = -1;
        return TK_OK;
    }
    int64_t v;
    tk_status st = gguf_get_i64(f, key, -1, &v);
    if (st) return st;
    if (v < -1 || v > INT32_MAX)
        return tk_fail(TK_ERR_RANGE, "model: %s %lld out of range", key, (long long)v);
    *out = (int32_t)v;
    return TK_OK;
}

tk_status arch_hparams_gguf(const gguf_file *f, tk_hparams *hp) {
    hparams_defaults(hp);
    gguf_str an;
    tk_status st = gguf_require_str(f, "general.architecture", &an);
    if (st) return st;
    if ((st = arch_from_name(an.ptr, an.len, &hp->arch))) return st;
    const char *a = arch_name(hp->arch);

    int64_t v;
    if ((st = gguf_int(f, a, "block_count", true, 0, &v))) return st;
    hp->n_layer = clamp_int(v);
    char key[128];
    snprintf(key, sizeof key, "%s.context_length", a);
    if ((st = gguf_int(f, a, "context_length", false, 0, &v))) return st;
    /* absent: the file does not say (0); present, it must be a usable context */
    if (gguf_find(f, key) && (st = check_range(key, v, 1, TK_MAX_CTX_TRAIN))) return st;
    hp->n_ctx_train = clamp_int(v);
    if ((st = gguf_int(f, a, "embedding_length", true, 0, &v))) return st;
    hp->n_embd = clamp_int(v);
    if ((st = gguf_int(f, a, "feed_forward_length", true, 0, &v))) return st;
    hp->n_ff = clamp_int(v);
    if ((st = gguf_int(f, a, "attention.head_count", true, 0, &v))) return st;
    hp->n_head = clamp_int(v);
    if ((st = gguf_int(f, a, "attention.head_count_kv", false, hp->n_head, &v))) return st;
    hp->n_head_kv = clamp_int(v);
    int def_hd = hp->n_head > 0 ? hp->n_embd / hp->n_head : 0;
    if ((st = gguf_int(f, a, "attention.key_length", false, def_hd, &v))) return st;
    hp->head_dim = clamp_int(v);
    if ((st = gguf_int(f, a, "attention.value_length", false, hp->head_dim, &v))) return st;
    if (v != hp->head_dim)
        return tk_fail(TK_ERR_UNSUPPORTED, "model: %s.attention.value_length %lld differs from key_length %d",
                       a, (long long)v, hp->head_dim);
    if ((st = gguf_int(f, a, "rope.dimension_count", false, hp->head_dim, &v))) return st;
    if (v != hp->head_dim)
        return tk_fail(TK_ERR_UNSUPPORTED,
                       "model: %s.rope.dimension_count %lld differs from head_dim %d (partial RoPE)", a,
                       (long long)v, hp->head_dim);
    if ((st = gguf_float(f, a, "attention.layer_norm_rms_epsilon", 1e-6f, &hp->rms_eps))) return st;
    if ((st = gguf_float(f, a, "rope.freq_base", 10000.0f, &hp->rope_theta))) return st;

    /* RoPE scaling: linear from metadata; llama3 comes as per-frequency factors
     * in rope_freqs.weight (the converter's output), detected here. */
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    gguf_str stype;
    bool found = false;
    if ((st = gguf_get_str(f, key, &stype, &found))) return st;
    float factor = 1.0f;
    char fkey[128];
    snprintf(fkey, sizeof fkey, "%s.rope.scaling.factor", a);
    if ((st = gguf_float(f, a, "rope.scaling.factor", 1.0f, &factor))) return st;
    if (found && !gguf_str_eq(stype, "none")) {
        if (gguf_str_eq(stype, "linear")) {
            if (!gguf_find(f, fkey))
                return tk_fail(TK_ERR_FORMAT, "model: %s is linear but %s is missing", key, fkey);
            hp->rope_scaling = TK_ROPE_SCALING_LINEAR;
            hp->rope_factor = factor;
        } else if (!gguf_str_eq(stype, "llama3")) {
            return tk_fail(TK_ERR_UNSUPPORTED, "model: %s '%.*s' not supported (none, linear, llama3)", key,
                           (int)(stype.len > 32 ? 32 : stype.len), stype.ptr);
        } else if (!gguf_find_tensor(f, "rope_freqs.weight")) {
            return tk_fail(TK_ERR_FORMAT, "model: %s is llama3 but the rope_freqs.weight tensor is missing",
                           key);
        }
    }
    if (gguf_find_tensor(f, "rope_freqs.weight")) {
        if (hp->rope_scaling == TK_ROPE_SCALING_LINEAR)
            return tk_fail(TK_ERR_UNSUPPORTED, "model: both linear rope scaling and rope_freqs.weight");
        hp->rope_scaling = TK_ROPE_SCALING_LLAMA3;
        hp->rope_factor = factor >= 1.0f ? factor : 1.0f;
        hp->rope_orig_ctx = 0; /* factors come from the tensor */
    }

    /* Vocabulary size: explicit key, else the embedding rows, else the token list. */
    const tk_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    const gguf_kv *toks = gguf_find(f, "tokenizer.ggml.tokens");
    int64_t nv = emb ? emb->ne[1] : toks && toks->type == GGUF_T_ARRAY ? (int64_t)toks->arr_n : 0;
    if ((st = gguf_int(f, a, "vocab_size", false, nv, &v))) return st;
    hp->n_vocab = clamp_int(v);

    hp->tied = gguf_find_tensor(f, "output.weight") == NULL;
    hp->qk_norm = hp->arch == TK_ARCH_QWEN3;
    hp->qkv_bias = hp->arch == TK_ARCH_QWEN2 || gguf_find_tensor(f, "blk.0.attn_q.bias") != NULL;

    if ((st = gguf_token_id(f, "tokenizer.ggml.bos_token_id", &hp->bos_id))) return st;
    if ((st = gguf_token_id(f, "tokenizer.ggml.eos_token_id", &hp->eos_id))) return st;
    if ((st = gguf_token_id(f, "tokenizer.ggml.padding_token_id", &hp->pad_id))) return st;
    return arch_hparams_validate(hp);
}

/* ---- Hugging Face config.json -------------------------------------------------- */

/* An integer field: *out keeps its value when the key is absent (or null). */
static tk_status json_int(const cJSON *o, const char *key, bool required, int64_t *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) {
        if (required) return tk_fail(TK_ERR_FORMAT, "model: config.json lacks %s", key);
        return TK_OK;
    }
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || fabs(j->valuedouble) > 9.0e15)
        return tk_fail(TK_ERR_FORMAT, "model: config.json %s is not an integer", key);
    *out = (int64_t)j->valuedouble;
    return TK_OK;
}

static tk_status json_float(const cJSON *o, const char *key, float *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) return TK_OK;
    if (!cJSON_IsNumber(j)) return tk_fail(TK_ERR_FORMAT, "model: config.json %s is not a number", key);
    *out = (float)j->valuedouble;
    return TK_OK;
}

/* A boolean field: *out keeps its value when the key is absent (or null). */
static tk_status json_bool(const cJSON *o, const char *key, bool *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) return TK_OK;
    if (!cJSON_IsBool(j)) return tk_fail(TK_ERR_FORMAT, "model: config.json %s is not true or false", key);
    *out = cJSON_IsTrue(j);
    return TK_OK;
}

/* An integer field that, when present, must lie in [lo, hi]; *present says whether it was. */
static tk_status json_int_range(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                                bool *present) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    *present = j && !cJSON_IsNull(j);
    if (!*present) return TK_OK;
    int64_t v;
    tk_status st = json_int(o, key, true, &v);
    if (st) return st;
    char field[96];
    snprintf(field, sizeof field, "config.json %s", key);
    if ((st = check_range(field, v, lo, hi))) return st;
    *out = v;
    return TK_OK;
}

/* The keys a rope_scaling type needs (as transformers validates them): absent is an error. */
static tk_status rope_require(const cJSON *rs, const char *type, const char *const *keys) {
    for (; *keys; keys++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(rs, *keys);
        if (!j || cJSON_IsNull(j))
            return tk_fail(TK_ERR_FORMAT, "model: config.json rope_scaling of type %s lacks %s", type, *keys);
    }
    return TK_OK;
}

/* Token ids may be a number or a list (llama 3.1 lists several EOS ids; the
 * first is the one tokamak stops on by default, every one is range-checked). */
static tk_status json_token(const cJSON *o, const char *key, int n_vocab, int32_t *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = -1;
    if (!j || cJSON_IsNull(j)) return TK_OK;
    const cJSON *first = NULL;
    if (cJSON_IsArray(j)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= n_vocab ||
                e->valuedouble != floor(e->valuedouble))
                return tk_fail(TK_ERR_RANGE,
                               "model: config.json %s entry %g outside the vocabulary of %d tokens", key,
                               cJSON_IsNumber(e) ? e->valuedouble : -1.0, n_vocab);
            if (!first) first = e;
        }
        if (!first) return TK_OK;
    } else {
        first = j;
    }
    if (!cJSON_IsNumber(first) || first->valuedouble != floor(first->valuedouble))
        return tk_fail(TK_ERR_FORMAT, "model: config.json %s is not a token id", key);
    double d = first->valuedouble;
    if (d < 0 || d >= n_vocab)
        return tk_fail(TK_ERR_RANGE, "model: config.json %s %g outside the vocabulary of %d tokens", key, d,
                       n_vocab);
    *out = (int32_t)d;
    return TK_OK;
}

static tk_status hf_arch(const cJSON *root, tk_arch *out) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (cJSON_IsString(mt)) return arch_from_name(mt->valuestring, strlen(mt->valuestring), out);
    if (mt && !cJSON_IsNull(mt))
        return tk_fail(TK_ERR_FORMAT, "model: config.json model_type is not a string");
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!cJSON_IsString(a0))
        return tk_fail(TK_ERR_FORMAT, "model: config.json has neither model_type nor architectures");
    static const struct {
        const char *hf;
        tk_arch a;
    } MAP[] = {{"LlamaForCausalLM", TK_ARCH_LLAMA},
               {"Qwen2ForCausalLM", TK_ARCH_QWEN2},
               {"Qwen3ForCausalLM", TK_ARCH_QWEN3}};
    for (size_t i = 0; i < sizeof MAP / sizeof MAP[0]; i++)
        if (!strcmp(a0->valuestring, MAP[i].hf)) {
            *out = MAP[i].a;
            return TK_OK;
        }
    return tk_fail(TK_ERR_UNSUPPORTED,
                   "model: unsupported architecture '%.64s' (supported: llama, qwen2, qwen3)",
                   a0->valuestring);
}

static tk_status hf_rope_scaling(const cJSON *root, tk_hparams *hp) {
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return TK_OK;
    if (!cJSON_IsObject(rs))
        return tk_fail(TK_ERR_FORMAT, "model: config.json rope_scaling is not an object");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t)) return tk_fail(TK_ERR_FORMAT, "model: config.json rope_scaling has no rope_type");
    tk_status st;
    if ((st = json_float(rs, "factor", &hp->rope_factor))) return st;
    if (!strcmp(t->valuestring, "default")) return TK_OK;
    if (!strcmp(t->valuestring, "linear")) {
        static const char *const need[] = {"factor", NULL};
        if ((st = rope_require(rs, "linear", need))) return st;
        hp->rope_scaling = TK_ROPE_SCALING_LINEAR;
        return TK_OK;
    }
    if (strcmp(t->valuestring, "llama3"))
        return tk_fail(TK_ERR_UNSUPPORTED,
                       "model: config.json rope_scaling type '%.32s' not supported (linear, llama3)",
                       t->valuestring);
    static const char *const need[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings", NULL};
    if ((st = rope_require(rs, "llama3", need))) return st;
    hp->rope_scaling = TK_ROPE_SCALING_LLAMA3;
    hp->rope_low_freq_factor = 1.0f;
    hp->rope_high_freq_factor = 4.0f;
    int64_t orig = 8192;
    if ((st = json_float(rs, "low_freq_factor", &hp->rope_low_freq_factor))) return st;
    if ((st = json_float(rs, "high_freq_factor", &hp->rope_high_freq_factor))) return st;
    if ((st = json_int(rs, "original_max_position_embeddings", false, &orig))) return st;
    if ((st = check_range("rope_scaling.original_max_position_embeddings", orig, 1, TK_MAX_CTX_TRAIN)))
        return st;
    hp->rope_orig_ctx = (int)orig;
    return TK_OK;
}

static tk_status hf_parse(const cJSON *root, tk_hparams *hp) {
    if (!cJSON_IsObject(root)) return tk_fail(TK_ERR_FORMAT, "model: config.json is not a JSON object");
    tk_status st = hf_arch(root, &hp->arch);
    if (st) return st;
    int64_t n_layer = 0, n_embd = 0, n_ff = 0, n_head = 0, n_kv = 0, hd = 0, n_vocab = 0, ctx = 0;
    bool has_kv, has_hd, has_ctx;
    if ((st = json_int(root, "num_hidden_layers", true, &n_layer))) return st;
    if ((st = json_int(root, "hidden_size", true, &n_embd))) return st;
    if ((st = json_int(root, "intermediate_size", true, &n_ff))) return st;
    if ((st = json_int(root, "num_attention_heads", true, &n_head))) return st;
    /* Optional keys are checked as written: a bad value is an error naming
     * the key, never replaced by the default. */
    if ((st = json_int_range(root, "num_key_value_heads", 1, TK_MAX_HEADS, &n_kv, &has_kv))) return st;
    if ((st = json_int_range(root, "head_dim", 1, TK_MAX_HEAD_DIM, &hd, &has_hd))) return st;
    if ((st = json_int(root, "vocab_size", true, &n_vocab))) return st;
    if ((st = json_int_range(root, "max_position_embeddings", 1, TK_MAX_CTX_TRAIN, &ctx, &has_ctx)))
        return st;
    hp->n_layer = clamp_int(n_layer);
    hp->n_embd = clamp_int(n_embd);
    hp->n_ff = clamp_int(n_ff);
    hp->n_head = clamp_int(n_head);
    hp->n_head_kv = clamp_int(has_kv ? n_kv : n_head);
    hp->head_dim = clamp_int(has_hd ? hd : (n_head > 0 ? n_embd / n_head : 0));
    hp->n_vocab = clamp_int(n_vocab);
    hp->n_ctx_train = clamp_int(has_ctx ? ctx : 0);
    if ((st = json_float(root, "rms_norm_eps", &hp->rms_eps))) return st;
    if ((st = json_float(root, "rope_theta", &hp->rope_theta))) return st;
    if ((st = hf_rope_scaling(root, hp))) return st;

    bool bias = false;
    hp->tied = false;
    if ((st = json_bool(root, "tie_word_embeddings", &hp->tied))) return st;
    if ((st = json_bool(root, "attention_bias", &bias))) return st;
    hp->qkv_bias = hp->arch == TK_ARCH_QWEN2 || bias;
    hp->qk_norm = hp->arch == TK_ARCH_QWEN3;

    /* Range-check the shape first so token-id messages quote a sane vocabulary. */
    if ((st = check_range("vocab_size", hp->n_vocab, 1, TK_MAX_VOCAB))) return st;
    if ((st = json_token(root, "bos_token_id", hp->n_vocab, &hp->bos_id))) return st;
    if ((st = json_token(root, "eos_token_id", hp->n_vocab, &hp->eos_id))) return st;
    if ((st = json_token(root, "pad_token_id", hp->n_vocab, &hp->pad_id))) return st;
    return arch_hparams_validate(hp);
}

tk_status arch_hparams_hf_json(const char *json, size_t len, tk_hparams *hp) {
    hparams_defaults(hp);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return tk_fail(TK_ERR_FORMAT, "model: config.json is not valid JSON");
    tk_status st = hf_parse(root, hp);
    cJSON_Delete(root);
    return st;
}

/* ---- tensor names ------------------------------------------------------------ */

static const char *const GGUF_NAMES[TK_ROLE_COUNT] = {
    [TK_ROLE_ATTN_NORM] = "blk.%d.attn_norm.weight",
    [TK_ROLE_Q] = "blk.%d.attn_q.weight",
    [TK_ROLE_K] = "blk.%d.attn_k.weight",
    [TK_ROLE_V] = "blk.%d.attn_v.weight",
    [TK_ROLE_O] = "blk.%d.attn_output.weight",
    [TK_ROLE_Q_BIAS] = "blk.%d.attn_q.bias",
    [TK_ROLE_K_BIAS] = "blk.%d.attn_k.bias",
    [TK_ROLE_V_BIAS] = "blk.%d.attn_v.bias",
    [TK_ROLE_Q_NORM] = "blk.%d.attn_q_norm.weight",
    [TK_ROLE_K_NORM] = "blk.%d.attn_k_norm.weight",
    [TK_ROLE_FFN_NORM] = "blk.%d.ffn_norm.weight",
    [TK_ROLE_GATE] = "blk.%d.ffn_gate.weight",
    [TK_ROLE_UP] = "blk.%d.ffn_up.weight",
    [TK_ROLE_DOWN] = "blk.%d.ffn_down.weight",
    [TK_ROLE_TOK_EMBD] = "token_embd.weight",
    [TK_ROLE_OUTPUT_NORM] = "output_norm.weight",
    [TK_ROLE_OUTPUT] = "output.weight",
    [TK_ROLE_ROPE_FREQS] = "rope_freqs.weight",
};

static const char *const HF_NAMES[TK_ROLE_COUNT] = {
    [TK_ROLE_ATTN_NORM] = "model.layers.%d.input_layernorm.weight",
    [TK_ROLE_Q] = "model.layers.%d.self_attn.q_proj.weight",
    [TK_ROLE_K] = "model.layers.%d.self_attn.k_proj.weight",
    [TK_ROLE_V] = "model.layers.%d.self_attn.v_proj.weight",
    [TK_ROLE_O] = "model.layers.%d.self_attn.o_proj.weight",
    [TK_ROLE_Q_BIAS] = "model.layers.%d.self_attn.q_proj.bias",
    [TK_ROLE_K_BIAS] = "model.layers.%d.self_attn.k_proj.bias",
    [TK_ROLE_V_BIAS] = "model.layers.%d.self_attn.v_proj.bias",
    [TK_ROLE_Q_NORM] = "model.layers.%d.self_attn.q_norm.weight",
    [TK_ROLE_K_NORM] = "model.layers.%d.self_attn.k_norm.weight",
    [TK_ROLE_FFN_NORM] = "model.layers.%d.post_attention_layernorm.weight",
    [TK_ROLE_GATE] = "model.layers.%d.mlp.gate_proj.weight",
    [TK_ROLE_UP] = "model.layers.%d.mlp.up_proj.weight",
    [TK_ROLE_DOWN] = "model.layers.%d.mlp.down_proj.weight",
    [TK_ROLE_TOK_EMBD] = "model.embed_tokens.weight",
    [TK_ROLE_OUTPUT_NORM] = "model.norm.weight",
    [TK_ROLE_OUTPUT] = "lm_head.weight",
    [TK_ROLE_ROPE_FREQS] = NULL, /* HF computes llama3 factors from config.json */
};

bool arch_tensor_name(tk_naming naming, tk_role role, int layer, char *buf, size_t n) {
    if ((unsigned)role >= TK_ROLE_COUNT) return false;
    const char *fmt = naming == TK_NAMING_HF ? HF_NAMES[role] : GGUF_NAMES[role];
    if (!fmt) return false;
    int w = role < TK_ROLE_LAYER_COUNT ? snprintf(buf, n, fmt, layer) : snprintf(buf, n, "%s", fmt);
    return w > 0 && (size_t)w < n;
}

void arch_tensor_shape(const tk_hparams *hp, tk_role role, int64_t ne[4]) {
    int64_t q = (int64_t)hp->n_head * hp->head_dim, kv = (int64_t)hp->n_head_kv * hp->head_dim;
    ne[0] = ne[1] = ne[2] = ne[3] = 1;
    switch (role) {
    case TK_ROLE_ATTN_NORM:
    case TK_ROLE_FFN_NORM:
    case TK_ROLE_OUTPUT_NORM:
        ne[0] = hp->n_embd;
        break;
    case TK_ROLE_Q:
        ne[0] = hp->n_embd;
        ne[1] = q;
        break;
    case TK_ROLE_K:
    case TK_ROLE_V:
        ne[0] = hp->n_embd;
        ne[1] = kv;
        break;
    case TK_ROLE_O:
        ne[0] = q;
        ne[1] = hp->n_embd;
        break;
    case TK_ROLE_Q_BIAS:
        ne[0] = q;
        break;
    case TK_ROLE_K_BIAS:
    case TK_ROLE_V_BIAS:
        ne[0] = kv;
        break;
    case TK_ROLE_Q_NORM:
    case TK_ROLE_K_NORM:
        ne[0] = hp->head_dim;
        break;
    case TK_ROLE_GATE:
    case TK_ROLE_UP:
        ne[0] = hp->n_embd;
        ne[1] = hp->n_ff;
        break;
    case TK_ROLE_DOWN:
        ne[0] = hp->n_ff;
        ne[1] = hp->n_embd;
        break;
    case TK_ROLE_TOK_EMBD:
    case TK_ROLE_OUTPUT:
        ne[0] = hp->n_embd;
        ne[1] = hp->n_vocab;
        break;
    case TK_ROLE_ROPE_FREQS:
        ne[0] = hp->head_dim / 2;
        break;
    default:
        break;
    }
}

bool arch_role_is_matmul(tk_role role) {
    return role == TK_ROLE_Q || role == TK_ROLE_K || role == TK_ROLE_V || role == TK_ROLE_O ||
           role == TK_ROLE_GATE || role == TK_ROLE_UP || role == TK_ROLE_DOWN || role == TK_ROLE_OUTPUT;
}
