/* tokamak quantize: a Hugging Face directory or a GGUF file rewritten as a GGUF
 * file whose matrices are F32, BF16 or Q8_0 (round to nearest), the vectors
 * (norms, biases) F32, with the metadata and vocabulary `tokamak synth` writes.
 * Every tensor goes through F32: dequantized row by row from the source,
 * quantized row by row into the new type. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/synth.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "format/gguf.h"
#include "format/hf.h"
#include "kernels/kernels.h"
#include "model/arch.h"

typedef struct q_src {
    gguf_file *gguf; /* exactly one of gguf, hf */
    hf_ckpt *hf;
    tk_hparams hp;
    synth_vocab *vocab; /* HF: synth_vocab_load's (synth_vocab_free) */
    synth_vocab gv;     /* GGUF: views into the mapping, arrays owned here */
    const char *name;
} q_src;

static void q_usage(FILE *f) {
    fprintf(f, "usage: tokamak quantize -i MODEL -o OUT.gguf --type f32|bf16|q8_0\n"
               "  -i MODEL     a Hugging Face directory (with tokenizer.json) or a GGUF file\n"
               "  -o OUT.gguf  the file written\n"
               "  --type T     matrix type: f32, bf16 or q8_0 (round to nearest); vectors stay f32\n");
}

static const tk_tensor *q_find(const q_src *s, tk_role role, int layer) {
    char name[96];
    if (!arch_tensor_name(s->hf ? TK_NAMING_HF : TK_NAMING_GGUF, role, layer, name, sizeof name)) return NULL;
    return s->hf ? hf_find_tensor(s->hf, name) : gguf_find_tensor(s->gguf, name);
}

/* The vocabulary arrays of a GGUF file as a synth_vocab (pieces point into the mapping). */
static tk_status q_gguf_vocab(q_src *s) {
    synth_vocab *v = &s->gv;
    const gguf_kv *toks, *types, *merges = NULL;
    tk_status st;
    if ((st = gguf_require_arr(s->gguf, "tokenizer.ggml.tokens", GGUF_T_STRING, &toks)) ||
        (st = gguf_require_arr(s->gguf, "tokenizer.ggml.token_type", GGUF_T_I32, &types)))
        return st;
    if (types->arr_n != toks->arr_n)
        return tk_fail(TK_ERR_FORMAT, "quantize: %llu token types for %llu tokens",
                       (unsigned long long)types->arr_n, (unsigned long long)toks->arr_n);
    if (gguf_find(s->gguf, "tokenizer.ggml.merges") &&
        (st = gguf_require_arr(s->gguf, "tokenizer.ggml.merges", GGUF_T_STRING, &merges)))
        return st;
    v->n_tokens = (int64_t)toks->arr_n;
    v->n_merges = merges ? (int64_t)merges->arr_n : 0;
    v->pieces = tk_calloc((size_t)v->n_tokens + 1, sizeof *v->pieces);
    v->piece_lens = tk_calloc((size_t)v->n_tokens + 1, sizeof *v->piece_lens);
    v->types = tk_calloc((size_t)v->n_tokens + 1, sizeof *v->types);
    v->merges = tk_calloc((size_t)v->n_merges + 1, sizeof *v->merges);
    v->merge_lens = tk_calloc((size_t)v->n_merges + 1, sizeof *v->merge_lens);
    if (!v->pieces || !v->piece_lens || !v->types || !v->merges || !v->merge_lens)
        return tk_fail(TK_ERR_NOMEM, "quantize: out of memory for the vocabulary");
    gguf_str str;
    int64_t t;
    for (int64_t i = 0; i < v->n_tokens; i++) {
        if ((st = gguf_arr_str(toks, (uint64_t)i, &str)) || (st = gguf_arr_i64(types, (uint64_t)i, &t)))
            return st;
        v->pieces[i] = str.ptr, v->piece_lens[i] = str.len, v->types[i] = (int32_t)t;
    }
    for (int64_t i = 0; i < v->n_merges; i++) {
        if ((st = gguf_arr_str(merges, (uint64_t)i, &str))) return st;
        v->merges[i] = str.ptr, v->merge_lens[i] = str.len;
    }
    bool found = false;
    if ((st = gguf_get_str(s->gguf, "tokenizer.chat_template", &str, &found))) return st;
    if (found && !(v->chat_template = tk_strndup(str.ptr, (size_t)str.len)))
        return tk_fail(TK_ERR_NOMEM, "quantize: out of memory");
    return TK_OK;
}

static tk_status q_open(const char *path, q_src *s) {
    struct stat sb;
    tk_status st;
    memset(s, 0, sizeof *s);
    if (stat(path, &sb) != 0) return tk_fail(TK_ERR_IO, "quantize: cannot read %s", path);
    if (S_ISDIR(sb.st_mode)) {
        size_t len = 0;
        if ((st = hf_open(path, &s->hf))) return st;
        const char *json = hf_config_json(s->hf, &len);
        if ((st = arch_hparams_hf_json(json, len, &s->hp))) return st;
        if ((st = synth_vocab_load(path, s->hp.n_vocab, &s->vocab))) return st;
    } else {
        if ((st = gguf_open(path, &s->gguf)) || (st = arch_hparams_gguf(s->gguf, &s->hp)) ||
            (st = q_gguf_vocab(s)))
            return st;
        s->vocab = &s->gv;
    }
    /* the model's own special tokens win over the tokenizer files' defaults */
    if (s->hp.eos_id >= 0) s->vocab->eos_id = s->hp.eos_id;
    if (s->hp.bos_id >= 0) s->vocab->bos_id = s->hp.bos_id;
    if (s->hp.pad_id >= 0) s->vocab->pad_id = s->hp.pad_id;
    if (s->hp.rope_scaling == TK_ROPE_SCALING_LINEAR)
        return tk_fail(TK_ERR_UNSUPPORTED, "quantize: %s: linear RoPE scaling is not supported", path);
    return TK_OK;
}

static void q_close(q_src *s) {
    if (s->vocab && s->vocab != &s->gv) synth_vocab_free(s->vocab);
    tk_free((void *)s->gv.pieces);
    tk_free(s->gv.piece_lens);
    tk_free(s->gv.types);
    tk_free((void *)s->gv.merges);
    tk_free(s->gv.merge_lens);
    tk_free(s->gv.chat_template);
    hf_close(s->hf);
    gguf_close(s->gguf);
}

/* One planned output tensor. */
typedef struct q_item {
    const tk_tensor *src; /* NULL: rope_freqs computed from the hyper-parameters (HF llama3) */
    int64_t ne[2];
    char name[96];
    tk_dtype type;
    int permute; /* llama q/k from HF: heads to permute into GGUF's interleaved RoPE order */
} q_item;

/* Append the tensor of (role, layer) to items; absent optional tensors are skipped. */
static tk_status q_add(const q_src *s, tk_dtype mtype, tk_role r, int l, q_item *items, int *n) {
    const tk_hparams *hp = &s->hp;
    bool bias = r == TK_ROLE_Q_BIAS || r == TK_ROLE_K_BIAS || r == TK_ROLE_V_BIAS;
    bool qkn = r == TK_ROLE_Q_NORM || r == TK_ROLE_K_NORM;
    const tk_tensor *t = q_find(s, r, l);
    if (!t && ((bias && !hp->qkv_bias) || (qkn && !hp->qk_norm))) return TK_OK;
    if (r == TK_ROLE_ROPE_FREQS && s->hf) { /* HF configs give the parameters; GGUF files carry the tensor */
        q_item *it = &items[(*n)++];
        memset(it, 0, sizeof *it);
        it->ne[0] = hp->head_dim / 2, it->ne[1] = 1, it->type = TK_DTYPE_F32;
        arch_tensor_name(TK_NAMING_GGUF, r, l, it->name, sizeof it->name);
        return TK_OK;
    }
    char hname[96];
    arch_tensor_name(s->hf ? TK_NAMING_HF : TK_NAMING_GGUF, r, l, hname, sizeof hname);
    if (!t) return tk_fail(TK_ERR_FORMAT, "quantize: tensor %s missing", hname);
    int64_t ne[4];
    arch_tensor_shape(hp, r, ne);
    if (t->ne[0] != ne[0] || t->ne[1] != ne[1] || t->ne[2] != 1 || t->ne[3] != 1)
        return tk_fail(TK_ERR_FORMAT, "quantize: tensor %s has shape [%lld, %lld], expected [%lld, %lld]",
                       hname, (long long)t->ne[0], (long long)t->ne[1], (long long)ne[0], (long long)ne[1]);
    if (!kernels_default()->dequant_row[t->type])
        return tk_fail(TK_ERR_UNSUPPORTED, "quantize: tensor %s: cannot read %s", hname, dtype_name(t->type));
    q_item *it = &items[(*n)++];
    it->src = t;
    it->ne[0] = t->ne[0], it->ne[1] = t->ne[1];
    arch_tensor_name(TK_NAMING_GGUF, r, l, it->name, sizeof it->name);
    it->type = arch_role_is_matmul(r) || r == TK_ROLE_TOK_EMBD ? mtype : TK_DTYPE_F32;
    if (ne[0] % dtype_block_elems(it->type))
        return tk_fail(TK_ERR_UNSUPPORTED, "quantize: tensor %s: rows of %lld are not a multiple of %s's %d",
                       hname, (long long)ne[0], dtype_name(it->type), dtype_block_elems(it->type));
    it->permute = 0;
    if (s->hf && hp->arch == TK_ARCH_LLAMA && (r == TK_ROLE_Q || r == TK_ROLE_K))
        it->permute = r == TK_ROLE_Q ? hp->n_head : hp->n_head_kv;
    return TK_OK;
}

/* token_embd, the blocks, rope_freqs (llama3 scaling), output_norm, output (untied only). */
static tk_status q_plan(const q_src *s, tk_dtype mtype, q_item *items, int *n) {
    tk_status st = q_add(s, mtype, TK_ROLE_TOK_EMBD, 0, items, n);
    for (int l = 0; l < s->hp.n_layer && !st; l++)
        for (int r = 0; r < TK_ROLE_LAYER_COUNT && !st; r++) st = q_add(s, mtype, (tk_role)r, l, items, n);
    if (!st && s->hp.rope_scaling == TK_ROPE_SCALING_LLAMA3)
        st = q_add(s, mtype, TK_ROLE_ROPE_FREQS, 0, items, n);
    if (!st) st = q_add(s, mtype, TK_ROLE_OUTPUT_NORM, 0, items, n);
    if (!st && !s->hp.tied) st = q_add(s, mtype, TK_ROLE_OUTPUT, 0, items, n);
    return st;
}

/* GGUF row of HF row `row` for llama q/k: within a head, half-split pairs (i, i + hd/2) become (2i, 2i + 1).
 */
static int64_t q_permuted(int64_t row, int n_head, int64_t n_rows) {
    int64_t hd = n_rows / n_head, h = row / hd, j = row % hd;
    return h * hd + (j < hd / 2 ? 2 * j : 2 * (j - hd / 2) + 1);
}

static tk_status q_write_tensor(gguf_writer *w, const tk_preset *p, const q_item *it, float *row) {
    const tk_kernels *K = kernels_default();
    int64_t cols = it->ne[0], rows = it->ne[1];
    uint64_t row_bytes, nbytes;
    if (!dtype_row_bytes(it->type, (uint64_t)cols, &row_bytes) ||
        !tk_mul_u64(row_bytes, (uint64_t)rows, &nbytes) || nbytes > SIZE_MAX)
        return tk_fail(TK_ERR_RANGE, "quantize: tensor %s size overflows", it->name);
    uint8_t *data = tk_alloc_aligned((size_t)nbytes, 64);
    if (!data) return tk_fail(TK_ERR_NOMEM, "quantize: out of memory for tensor %s", it->name);
    for (int64_t r = 0; r < rows; r++) {
        if (it->src)
            kern_dequant_tensor_row(K, it->src, r, row);
        else { /* the factors synth writes: llama.cpp's converter's */
            synth_cfg c = {.p = *p};
            synth_tensor t = {.kind = SYNTH_ROPE_FREQS, .n_dims = 1, .ne = {cols, 1}};
            synth_gen_rows(&c, &t, 0, 1, true, row);
        }
        int64_t dst = it->permute ? q_permuted(r, it->permute, rows) : r;
        if (!kern_quantize_row(it->type, row, data + (uint64_t)dst * row_bytes, cols)) {
            tk_free_aligned(data);
            return tk_fail(TK_ERR_UNSUPPORTED, "quantize: cannot write %s as %s", it->name,
                           dtype_name(it->type));
        }
    }
    tk_status st = gguf_w_tensor_data(w, data, nbytes);
    tk_free_aligned(data);
    return st;
}

static tk_status q_convert(const q_src *s, tk_dtype mtype, uint32_t ftype, const char *out) {
    const tk_hparams *hp = &s->hp;
    int cap = TK_ROLE_COUNT * (hp->n_layer + 1);
    q_item *items = tk_calloc((size_t)cap, sizeof *items);
    float *row = NULL;
    gguf_writer *w = NULL;
    bool began = false;
    int n = 0;
    tk_status st = items ? q_plan(s, mtype, items, &n) : tk_fail(TK_ERR_NOMEM, "quantize: out of memory");
    if (st) goto done;
    tk_preset p = {.name = s->name,
                   .arch = arch_name(hp->arch),
                   .n_layer = hp->n_layer,
                   .n_embd = hp->n_embd,
                   .n_head = hp->n_head,
                   .n_head_kv = hp->n_head_kv,
                   .head_dim = hp->head_dim,
                   .n_ff = hp->n_ff,
                   .n_vocab = hp->n_vocab,
                   .n_ctx = hp->n_ctx_train,
                   .rope_theta = hp->rope_theta,
                   .rms_eps = hp->rms_eps,
                   .tied = hp->tied,
                   .qkv_bias = hp->qkv_bias,
                   .qk_norm = hp->qk_norm};
    if (hp->rope_scaling == TK_ROPE_SCALING_LLAMA3) {
        p.rope_factor = hp->rope_factor, p.rope_low_freq = hp->rope_low_freq_factor;
        p.rope_high_freq = hp->rope_high_freq_factor, p.rope_orig_ctx = hp->rope_orig_ctx;
    }
    if ((st = gguf_writer_init(32, &w)) || (st = synth_write_meta(w, &p, s->name, ftype, s->vocab)))
        goto done;
    int64_t maxc = 1;
    for (int i = 0; i < n; i++) {
        if ((st = gguf_w_tensor_info(w, items[i].name, items[i].type, items[i].ne[1] > 1 ? 2 : 1,
                                     items[i].ne)))
            goto done;
        if (items[i].ne[0] > maxc) maxc = items[i].ne[0];
    }
    if (!(row = tk_malloc((size_t)maxc * sizeof *row))) {
        st = tk_fail(TK_ERR_NOMEM, "quantize: out of memory");
        goto done;
    }
    if ((st = gguf_w_begin(w, out))) goto done;
    began = true;
    for (int i = 0; i < n; i++)
        if ((st = q_write_tensor(w, &p, &items[i], row))) goto done;
    st = gguf_w_finish(w);
done:
    if (st && began) remove(out); /* no half-written model left behind */
    gguf_writer_free(w);
    tk_free(row);
    tk_free(items);
    return st;
}

int cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *type = NULL;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            q_usage(stdout);
            return 0;
        }
        const char **dst = !strcmp(o, "-i")       ? &in
                           : !strcmp(o, "-o")     ? &out
                           : !strcmp(o, "--type") ? &type
                                                  : NULL;
        if (!dst) {
            fprintf(stderr, "tokamak quantize: unknown option '%s'\n", o);
            q_usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tokamak quantize: %s needs a value\n", o);
            return 2;
        }
        *dst = argv[++i];
    }
    if (!in || !out || !type) {
        fprintf(stderr, "tokamak quantize: -i, -o and --type are required\n");
        q_usage(stderr);
        return 2;
    }
    tk_dtype mtype;
    uint32_t ftype; /* llama.cpp's general.file_type */
    if (!strcmp(type, "f32"))
        mtype = TK_DTYPE_F32, ftype = synth_file_type(SYNTH_F32);
    else if (!strcmp(type, "bf16"))
        mtype = TK_DTYPE_BF16, ftype = synth_file_type(SYNTH_BF16);
    else if (!strcmp(type, "q8_0"))
        mtype = TK_DTYPE_Q8_0, ftype = synth_file_type(SYNTH_Q8_0);
    else {
        fprintf(stderr, "tokamak quantize: bad value '%s' for --type (f32, bf16 or q8_0)\n", type);
        return 2;
    }
    q_src s;
    tk_status st = q_open(in, &s);
    if (!st) {
        char name[256]; /* general.name: the input's last path component */
        size_t len = strlen(in);
        while (len > 1 && in[len - 1] == '/') len--;
        size_t b = len;
        while (b > 0 && in[b - 1] != '/') b--;
        snprintf(name, sizeof name, "%.*s", (int)(len - b), in + b);
        s.name = name;
        st = q_convert(&s, mtype, ftype, out);
    }
    q_close(&s);
    if (st) {
        fprintf(stderr, "tokamak quantize: %s\n", tk_last_error());
        return 1;
    }
    fprintf(stderr, "tokamak quantize: wrote %s (%s)\n", out, type);
    return 0;
}
