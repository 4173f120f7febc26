/* `tokamak synth --format hf`: a Hugging Face checkpoint directory (config.json,
 * model.safetensors or shards + model.safetensors.index.json, tokenizer files).
 * The safetensors are streamed here row block by row block, so no tensor is
 * ever held whole; the header is known up front because every size is. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/synth.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/pool.h"

#define ROW_BLOCK_FLOATS    (1 << 20)
#define DEFAULT_SHARD_BYTES (4ull << 30)

typedef struct hf_type {
    const char *st_name, *torch_name;
    int size;
} hf_type;

static hf_type hf_type_of(synth_quant q) {
    if (q == SYNTH_F16) return (hf_type){"F16", "float16", 2};
    if (q == SYNTH_BF16) return (hf_type){"BF16", "bfloat16", 2};
    return (hf_type){"F32", "float32", 4};
}

static tk_status write_all(FILE *f, const void *p, size_t n, const char *path) {
    if (n && fwrite(p, 1, n, f) != n)
        return tk_fail(TK_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return TK_OK;
}

static tk_status write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return tk_fail(TK_ERR_IO, "%s: %s", path, strerror(errno));
    tk_status st = write_all(f, text, strlen(text), path);
    if (fclose(f) != 0 && st == TK_OK) st = tk_fail(TK_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    return st;
}

static tk_status copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb");
    if (!in) return tk_fail(TK_ERR_IO, "%s: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return tk_fail(TK_ERR_IO, "%s: %s", to, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    tk_status st = TK_OK;
    while (st == TK_OK && (n = fread(buf, 1, sizeof buf, in)) > 0) st = write_all(out, buf, n, to);
    if (st == TK_OK && ferror(in)) st = tk_fail(TK_ERR_IO, "%s: read failed", from);
    fclose(in);
    if (fclose(out) != 0 && st == TK_OK) st = tk_fail(TK_ERR_IO, "%s: close failed", to);
    return st;
}

static tk_status path_join(char *buf, size_t cap, const char *dir, const char *name) {
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return tk_fail(TK_ERR_RANGE, "synth: path %s/%s is too long", dir, name);
    return TK_OK;
}

static tk_status write_config(const synth_cfg *c, const char *dir) {
    const tk_preset *p = &c->p;
    const char *arch_cls = !strcmp(p->arch, "qwen3")   ? "Qwen3ForCausalLM"
                           : !strcmp(p->arch, "qwen2") ? "Qwen2ForCausalLM"
                                                       : "LlamaForCausalLM";
    cJSON *o = cJSON_CreateObject();
    if (!o) return tk_fail(TK_ERR_NOMEM, "synth: out of memory");
    cJSON *archs = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString(arch_cls));
    cJSON_AddStringToObject(o, "model_type", p->arch);
    cJSON_AddBoolToObject(o, "attention_bias", p->qkv_bias);
    cJSON_AddNumberToObject(o, "bos_token_id", 151643);
    cJSON_AddNumberToObject(o, "eos_token_id", 151645);
    cJSON_AddNumberToObject(o, "head_dim", p->head_dim);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "hidden_size", p->n_embd);
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    cJSON_AddNumberToObject(o, "intermediate_size", p->n_ff);
    cJSON_AddNumberToObject(o, "max_position_embeddings", p->n_ctx);
    cJSON_AddNumberToObject(o, "num_attention_heads", p->n_head);
    cJSON_AddNumberToObject(o, "num_hidden_layers", p->n_layer);
    cJSON_AddNumberToObject(o, "num_key_value_heads", p->n_head_kv);
    cJSON_AddNumberToObject(o, "rms_norm_eps", p->rms_eps);
    if (p->rope_factor > 0) {
        cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
        cJSON_AddNumberToObject(rs, "factor", p->rope_factor);
        cJSON_AddNumberToObject(rs, "low_freq_factor", p->rope_low_freq);
        cJSON_AddNumberToObject(rs, "high_freq_factor", p->rope_high_freq);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", p->rope_orig_ctx);
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
    } else {
        cJSON_AddNullToObject(o, "rope_scaling");
    }
    cJSON_AddNumberToObject(o, "rope_theta", p->rope_theta);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", p->tied);
    cJSON_AddStringToObject(o, "torch_dtype", hf_type_of(c->quant).torch_name);
    cJSON_AddBoolToObject(o, "use_cache", true);
    cJSON_AddNumberToObject(o, "vocab_size", p->n_vocab);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return tk_fail(TK_ERR_NOMEM, "synth: out of memory");
    char path[4200];
    tk_status st = path_join(path, sizeof path, dir, "config.json");
    if (st == TK_OK) st = write_text(path, text);
    cJSON_free(text);
    return st;
}

/* A growing string for the headers and the index (sizes known only at the end). */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    for (;;) {
        if (b->oom) return;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->p && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *np = tk_realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

static uint64_t tensor_bytes(const synth_tensor *t, int esize) {
    return (uint64_t)t->ne[0] * (uint64_t)t->ne[1] * (uint64_t)esize;
}

/* Tensors [t0, t1) of the plan (HF ones only) into one safetensors file. */
static tk_status write_shard(tk_pool *pool, const synth_cfg *c, const synth_tensor *ts, int t0, int t1,
                             const char *path, float *fbuf, void *obuf, int64_t fcap) {
    hf_type ht = hf_type_of(c->quant);
    sbuf h = {0};
    uint64_t off = 0;
    sb_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = t0; i < t1; i++) {
        const synth_tensor *t = &ts[i];
        if (!t->hf_name[0]) continue;
        uint64_t nb = tensor_bytes(t, ht.size);
        if (t->n_dims == 2)
            sb_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%llu,%llu]}",
                      t->hf_name, ht.st_name, (long long)t->ne[1], (long long)t->ne[0],
                      (unsigned long long)off, (unsigned long long)(off + nb));
        else
            sb_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[%llu,%llu]}",
                      t->hf_name, ht.st_name, (long long)t->ne[0], (unsigned long long)off,
                      (unsigned long long)(off + nb));
        off += nb;
    }
    sb_printf(&h, "}");
    while (!h.oom && h.len % 8) sb_printf(&h, " "); /* the HF library pads with spaces to 8 bytes */
    if (h.oom) {
        tk_free(h.p);
        return tk_fail(TK_ERR_NOMEM, "synth: out of memory for the safetensors header");
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        tk_free(h.p);
        return tk_fail(TK_ERR_IO, "%s: %s", path, strerror(errno));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    tk_status st = write_all(f, len8, 8, path);
    if (st == TK_OK) st = write_all(f, h.p, h.len, path);
    tk_free(h.p);
    for (int i = t0; i < t1 && st == TK_OK; i++) {
        const synth_tensor *t = &ts[i];
        if (!t->hf_name[0]) continue;
        int64_t cols = t->ne[0], rows = t->ne[1], block = fcap / cols;
        if (block < 1) block = 1;
        for (int64_t r0 = 0; r0 < rows && st == TK_OK; r0 += block) {
            int64_t n = rows - r0 < block ? rows - r0 : block, k = n * cols;
            synth_gen_rows_par(pool, c, t, r0, n, false, fbuf, NULL, 0);
            if (c->quant == SYNTH_F16)
                for (int64_t j = 0; j < k; j++) ((tk_f16 *)obuf)[j] = tk_f32_to_f16(fbuf[j]);
            else if (c->quant == SYNTH_BF16)
                for (int64_t j = 0; j < k; j++) ((tk_bf16 *)obuf)[j] = tk_f32_to_bf16(fbuf[j]);
            /* safetensors is little-endian, as is every machine tokamak runs on */
            st = write_all(f, c->quant == SYNTH_F32 ? (const void *)fbuf : obuf, (size_t)k * (size_t)ht.size,
                           path);
        }
    }
    if (fclose(f) != 0 && st == TK_OK) st = tk_fail(TK_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    return st;
}

tk_status synth_write_hf(const synth_cfg *c, const char *tok_dir, const char *dir, uint64_t shard_bytes,
                         bool force_index) {
    if (c->quant != SYNTH_F32 && c->quant != SYNTH_F16 && c->quant != SYNTH_BF16)
        return tk_fail(TK_ERR_INVALID, "--format hf supports --dtype f32, f16 or bf16, not %s",
                       synth_quant_name(c->quant));
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) return tk_fail(TK_ERR_IO, "%s: %s", dir, strerror(errno));
    if (!shard_bytes) shard_bytes = DEFAULT_SHARD_BYTES;
    synth_tensor *ts = NULL;
    int nt = 0;
    tk_status st = synth_plan(c, &ts, &nt);
    if (st != TK_OK) return st;
    hf_type ht = hf_type_of(c->quant);

    /* shard boundaries: a new shard when the next tensor would pass the limit */
    int *start = tk_calloc((size_t)nt + 1, sizeof *start), n_shards = 0;
    int64_t fcap = ROW_BLOCK_FLOATS;
    for (int i = 0; i < nt; i++)
        if (ts[i].ne[0] > fcap) fcap = ts[i].ne[0];
    float *fbuf = tk_malloc((size_t)fcap * sizeof *fbuf);
    void *obuf = tk_malloc((size_t)fcap * 2);
    tk_pool *pool = pool_open_allowed(INT_MAX); /* NULL: one thread generates */
    sbuf idx = {0};
    if (!start || !fbuf || !obuf) {
        st = tk_fail(TK_ERR_NOMEM, "synth: out of memory");
        goto done;
    }
    uint64_t cur = 0, total = 0;
    for (int i = 0; i < nt; i++) {
        if (!ts[i].hf_name[0]) continue;
        uint64_t nb = tensor_bytes(&ts[i], ht.size);
        if (n_shards == 0 || (cur > 0 && cur + nb > shard_bytes)) {
            start[n_shards++] = i;
            cur = 0;
        }
        cur += nb;
        total += nb;
    }
    start[n_shards] = nt;
    bool index = force_index || n_shards > 1;
    char path[4300], fname[64];
    sb_printf(&idx, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {",
              (unsigned long long)total);
    bool first = true;
    for (int s = 0; s < n_shards && st == TK_OK; s++) {
        if (index)
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        else
            snprintf(fname, sizeof fname, "model.safetensors");
        if ((st = path_join(path, sizeof path, dir, fname)) != TK_OK) break;
        st = write_shard(pool, c, ts, start[s], start[s + 1], path, fbuf, obuf, fcap);
        for (int i = start[s]; i < start[s + 1]; i++) {
            if (!ts[i].hf_name[0]) continue;
            sb_printf(&idx, "%s\n    \"%s\": \"%s\"", first ? "" : ",", ts[i].hf_name, fname);
            first = false;
        }
    }
    sb_printf(&idx, "\n  }\n}\n");
    if (idx.oom && st == TK_OK) st = tk_fail(TK_ERR_NOMEM, "synth: out of memory for the index");
    if (st == TK_OK && index) {
        st = path_join(path, sizeof path, dir, "model.safetensors.index.json");
        if (st == TK_OK) st = write_text(path, idx.p);
    }
    if (st == TK_OK) st = write_config(c, dir);
    const char *tok_files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2 && st == TK_OK; i++) {
        char from[4300];
        st = path_join(from, sizeof from, tok_dir, tok_files[i]);
        if (st == TK_OK) st = path_join(path, sizeof path, dir, tok_files[i]);
        if (st == TK_OK) st = copy_file(from, path);
    }
done:
    tk_free(idx.p);
    tk_free(start);
    tk_free(fbuf);
    tk_free(obuf);
    pool_free(pool);
    tk_free(ts);
    return st;
}
