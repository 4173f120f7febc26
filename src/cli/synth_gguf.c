/* `tokamak synth` GGUF output: metadata and vocabulary as llama.cpp writes
 * them, then the tensors, generated and quantized one row block at a time. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "cli/synth.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/pool.h"
#include "format/gguf.h"
#include "kernels/kernels.h"

#define ROW_BLOCK_FLOATS (1 << 20) /* generate ~4 MB of floats at a time */

/* "<arch>.<suffix>" in key: the architecture's own metadata keys. */
static const char *akey(char key[128], const tk_preset *p, const char *suffix) {
    snprintf(key, 128, "%s.%s", p->arch, suffix);
    return key;
}

/* Every key in order; the first failure stops the writes and is returned. */
tk_status synth_write_meta(gguf_writer *w, const tk_preset *p, const char *name, uint32_t file_type,
                           const synth_vocab *v) {
    char key[128];
    tk_status st = TK_OK;
    if (st == TK_OK) st = gguf_w_str(w, "general.architecture", p->arch);
    if (st == TK_OK) st = gguf_w_str(w, "general.name", name);
    if (st == TK_OK) st = gguf_w_u32(w, "general.alignment", 32);
    if (st == TK_OK) st = gguf_w_u32(w, "general.file_type", file_type);
    if (st == TK_OK) st = gguf_w_u32(w, "general.quantization_version", 2);
    if (st == TK_OK) st = gguf_w_u32(w, akey(key, p, "block_count"), (uint32_t)p->n_layer);
    if (st == TK_OK) st = gguf_w_u32(w, akey(key, p, "context_length"), (uint32_t)p->n_ctx);
    if (st == TK_OK) st = gguf_w_u32(w, akey(key, p, "embedding_length"), (uint32_t)p->n_embd);
    if (st == TK_OK) st = gguf_w_u32(w, akey(key, p, "feed_forward_length"), (uint32_t)p->n_ff);
    if (st == TK_OK) st = gguf_w_u32(w, akey(key, p, "attention.head_count"), (uint32_t)p->n_head);
    if (st == TK_OK) st = gguf_w_u32(w, akey(key, p, "attention.head_count_kv"), (uint32_t)p->n_head_kv);
    if (st == TK_OK) st = gguf_w_u32(w, akey(key, p, "attention.key_length"), (uint32_t)p->head_dim);
    if (st == TK_OK) st = gguf_w_u32(w, akey(key, p, "attention.value_length"), (uint32_t)p->head_dim);
    if (st == TK_OK) st = gguf_w_u32(w, akey(key, p, "rope.dimension_count"), (uint32_t)p->head_dim);
    if (st == TK_OK) st = gguf_w_f32(w, akey(key, p, "rope.freq_base"), (float)p->rope_theta);
    if (st == TK_OK) st = gguf_w_f32(w, akey(key, p, "attention.layer_norm_rms_epsilon"), (float)p->rms_eps);
    if (st == TK_OK) st = gguf_w_u32(w, akey(key, p, "vocab_size"), (uint32_t)p->n_vocab);
    if (p->rope_factor > 0) {
        /* llama.cpp encodes Llama-3 scaling as the rope_freqs.weight tensor; these
         * keys describe it for readers that want the parameters. */
        if (st == TK_OK) st = gguf_w_str(w, akey(key, p, "rope.scaling.type"), "llama3");
        if (st == TK_OK) st = gguf_w_f32(w, akey(key, p, "rope.scaling.factor"), (float)p->rope_factor);
        if (st == TK_OK)
            st = gguf_w_u32(w, akey(key, p, "rope.scaling.original_context_length"),
                            (uint32_t)p->rope_orig_ctx);
        if (st == TK_OK)
            st = gguf_w_f32(w, akey(key, p, "rope.scaling.low_freq_factor"), (float)p->rope_low_freq);
        if (st == TK_OK)
            st = gguf_w_f32(w, akey(key, p, "rope.scaling.high_freq_factor"), (float)p->rope_high_freq);
    }
    if (st == TK_OK) st = gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    if (st == TK_OK) st = gguf_w_str(w, "tokenizer.ggml.pre", "qwen2");
    if (st == TK_OK)
        st = gguf_w_arr_str(w, "tokenizer.ggml.tokens", v->pieces, v->piece_lens, (uint64_t)v->n_tokens);
    if (st == TK_OK)
        st = gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_T_I32, v->types, (uint64_t)v->n_tokens);
    if (st == TK_OK)
        st = gguf_w_arr_str(w, "tokenizer.ggml.merges", v->merges, v->merge_lens, (uint64_t)v->n_merges);
    if (st == TK_OK) st = gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos_id);
    if (st == TK_OK) st = gguf_w_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad_id);
    if (st == TK_OK) st = gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos_id);
    if (st == TK_OK) st = gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false);
    if (st == TK_OK && v->chat_template) st = gguf_w_str(w, "tokenizer.chat_template", v->chat_template);
    return st;
}

/* One tensor: rows generated in blocks into f32 and quantized per row into
 * the tensor's buffer, both split over the pool, written in one call (the
 * writer takes whole tensors). */
static tk_status write_tensor(gguf_writer *w, tk_pool *pool, const synth_cfg *c, const synth_tensor *t,
                              float *fbuf, int64_t fcap) {
    uint64_t row_bytes, nbytes;
    int64_t cols = t->ne[0], rows = t->ne[1];
    if (!dtype_row_bytes(t->gguf_type, (uint64_t)cols, &row_bytes) ||
        !tk_mul_u64(row_bytes, (uint64_t)rows, &nbytes) || nbytes > SIZE_MAX)
        return tk_fail(TK_ERR_RANGE, "synth: tensor %s size overflows", t->gguf_name);
    uint8_t *data = tk_alloc_aligned((size_t)nbytes, 64);
    if (!data)
        return tk_fail(TK_ERR_NOMEM, "synth: out of memory for tensor %s (%llu bytes)", t->gguf_name,
                       (unsigned long long)nbytes);
    int64_t block = fcap / cols;
    if (block < 1) block = 1;
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
        int64_t n = rows - r0 < block ? rows - r0 : block;
        if (!synth_gen_rows_par(pool, c, t, r0, n, true, fbuf, data + (uint64_t)r0 * row_bytes,
                                (size_t)row_bytes)) {
            tk_free_aligned(data);
            return tk_fail(TK_ERR_UNSUPPORTED, "synth: cannot quantize tensor %s to %s", t->gguf_name,
                           dtype_name(t->gguf_type));
        }
    }
    tk_status st = gguf_w_tensor_data(w, data, nbytes);
    tk_free_aligned(data);
    return st;
}

tk_status synth_write_gguf(const synth_cfg *c, const synth_vocab *v, const char *path) {
    synth_tensor *ts = NULL;
    int nt = 0;
    gguf_writer *w = NULL;
    tk_pool *pool = NULL;
    float *fbuf = NULL;
    bool began = false;
    tk_status st = synth_plan(c, &ts, &nt);
    if (st != TK_OK) return st;
    if ((st = gguf_writer_init(32, &w)) != TK_OK) goto done;
    char name[128];
    if (!strcmp(c->p.name, "tiny"))
        snprintf(name, sizeof name, "synth-tiny-%s", c->p.arch);
    else
        snprintf(name, sizeof name, "synth-%s", c->p.name);
    if ((st = synth_write_meta(w, &c->p, name, synth_file_type(c->quant), v)) != TK_OK) goto done;
    for (int i = 0; i < nt; i++) {
        if ((st = gguf_w_tensor_info(w, ts[i].gguf_name, ts[i].gguf_type, ts[i].n_dims, ts[i].ne)) != TK_OK)
            goto done;
    }
    int64_t fcap = ROW_BLOCK_FLOATS;
    for (int i = 0; i < nt; i++)
        if (ts[i].ne[0] > fcap) fcap = ts[i].ne[0];
    fbuf = tk_malloc((size_t)fcap * sizeof *fbuf);
    if (!fbuf) {
        st = tk_fail(TK_ERR_NOMEM, "synth: out of memory");
        goto done;
    }
    pool = pool_open_allowed(INT_MAX); /* NULL: one thread generates */
    if ((st = gguf_w_begin(w, path)) != TK_OK) goto done;
    began = true;
    for (int i = 0; i < nt; i++)
        if ((st = write_tensor(w, pool, c, &ts[i], fbuf, fcap)) != TK_OK) goto done;
    st = gguf_w_finish(w);
done:
    if (st != TK_OK) tk_error_prefix("%s", path);
    tk_free(fbuf);
    pool_free(pool);
    gguf_writer_free(w);
    if (st != TK_OK && began) remove(path); /* no half-written model left to be loaded later */
    tk_free(ts);
    return st;
}
