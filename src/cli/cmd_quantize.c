/* tokamak quantize: a Hugging Face directory or a GGUF file rewritten as a GGUF
 * file whose matrices are F32, BF16, Q8_0, Q6_K, Q4_K or Q4_0 (or the Q4_K_M
 * mix), the vectors (norms, biases) F32, with the metadata and vocabulary
 * `tokamak synth` writes. Every tensor goes through F32: dequantized row by row
 * from the source, quantized row by row into the new type. With calibration
 * text (calib.h), activation-aware scales are searched per layer and folded
 * into the norms and projections before the matmuls read them (the file's
 * shapes and the inference cost stay the same), and each block's clip range is
 * searched for the least activation-weighted error. */
#include <fnmatch.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/calib.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/synth.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/pool.h"
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

/* GGUF row of HF row `row` for llama q/k: within a head, half-split pairs (i, i + hd/2) become (2i, 2i + 1).
 */
static int64_t q_permuted(int64_t row, int n_head, int64_t n_rows) {
    int64_t hd = n_rows / n_head, h = row / hd, j = row % hd;
    return h * hd + (j < hd / 2 ? 2 * j : 2 * (j - hd / 2) + 1);
}

/* One planned output tensor. */
typedef struct q_item {
    const tk_tensor *src; /* NULL: rope_freqs computed from the hyper-parameters (HF llama3) */
    int64_t ne[2];
    char name[96];
    tk_role role;
    int layer;
    tk_dtype type;
    int permute; /* llama q/k from HF: heads to permute into GGUF's interleaved RoPE order */
} q_item;

/* The --type choices: the matrices' type, llama.cpp's general.file_type. */
typedef struct q_kind {
    const char *name;
    tk_dtype type;
    uint32_t ftype;
    bool mix; /* q4_k_m: Q6_K for attn_v and ffn_down where llama.cpp puts them */
} q_kind;

static const q_kind KINDS[] = {
    {"f32", TK_DTYPE_F32, 0, false},     {"bf16", TK_DTYPE_BF16, 32, false},
    {"q8_0", TK_DTYPE_Q8_0, 7, false},   {"q6_k", TK_DTYPE_Q6_K, 18, false},
    {"q4_k", TK_DTYPE_Q4_K, 14, false},  {"q4_0", TK_DTYPE_Q4_0, 2, false},
    {"q4_k_m", TK_DTYPE_Q4_K, 15, true},
};
enum { N_KINDS = sizeof KINDS / sizeof KINDS[0] };

#define Q_MAX_KEEP 16

typedef struct q_keep {
    char pattern[96];
    tk_dtype type;
} q_keep;

typedef struct q_args {
    const char *in, *out, *type, *calib;
    int calib_lines, calib_tokens, threads;
    bool rtn, quiet, no_defaults;
    q_keep keep[Q_MAX_KEEP];
    int n_keep;
} q_args;

/* "PATTERN[=TYPE]" (TYPE default bf16), or "none": no higher-precision defaults.
 * dst is &q_args.keep (the row's field); the list's count and the flag live
 * beside it in the same struct. */
static bool q_parse_keep(const char *v, void *dst) {
    q_args *a = (q_args *)((char *)dst - offsetof(q_args, keep));
    if (!strcmp(v, "none")) {
        a->no_defaults = true;
        return true;
    }
    if (a->n_keep == Q_MAX_KEEP) return false;
    q_keep *k = &a->keep[a->n_keep];
    const char *eq = strchr(v, '=');
    size_t len = eq ? (size_t)(eq - v) : strlen(v);
    if (len == 0 || len >= sizeof k->pattern) return false;
    memcpy(k->pattern, v, len);
    k->pattern[len] = 0;
    k->type = TK_DTYPE_BF16;
    if (eq) {
        int t = -1;
        for (int i = 0; i < N_KINDS; i++)
            if (!KINDS[i].mix && !strcmp(eq + 1, KINDS[i].name)) t = (int)KINDS[i].type;
        if (t < 0) return false;
        k->type = (tk_dtype)t;
    }
    a->n_keep++;
    return true;
}

static const cli_opt Q_ROWS[] = {
    {.name = "-i",
     .arg = "MODEL",
     .help = "a Hugging Face directory (with tokenizer.json) or a GGUF file",
     .kind = CLI_STR,
     .off = offsetof(q_args, in)},
    {.name = "-o",
     .arg = "OUT.gguf",
     .help = "the file written",
     .kind = CLI_STR,
     .off = offsetof(q_args, out)},
    {.name = "--type",
     .arg = "T",
     .help = "matrix type: f32, bf16, q8_0, q6_k, q4_k, q4_0 or q4_k_m; vectors stay f32",
     .kind = CLI_STR,
     .off = offsetof(q_args, type)},
    {.name = "--calib",
     .arg = "FILE.txt",
     .help = "calibration text (one sample a line, in-distribution, not the evaluation text):\n"
             "activation-aware scales and a clip search per block; without: round to nearest",
     .kind = CLI_STR,
     .off = offsetof(q_args, calib)},
    {.name = "--calib-samples",
     .arg = "N",
     .help = "lines of the calibration text used (default 256)",
     .kind = CLI_INT,
     .off = offsetof(q_args, calib_lines),
     .lo = 1,
     .hi = 1 << 20},
    {.name = "--calib-tokens",
     .arg = "N",
     .help = "tokens (evenly spaced) the output error is measured on per layer (default 64)",
     .kind = CLI_INT,
     .off = offsetof(q_args, calib_tokens),
     .lo = 1,
     .hi = 4096},
    {.name = "--rtn",
     .help = "with --calib: round to nearest anyway (only measure the activation-weighted error)",
     .kind = CLI_FLAG,
     .off = offsetof(q_args, rtn)},
    {.name = "--keep",
     .arg = "PAT[=T]",
     .help = "tensors whose GGUF name matches the glob PAT get type T (default bf16); repeatable,\n"
             "the last match wins; 'none' drops the defaults (embedding/output q8_0, first and\n"
             "last layers one step above the rest)",
     .kind = CLI_FN,
     .off = offsetof(q_args, keep),
     .fn = q_parse_keep,
     .want = "PATTERN, PATTERN=TYPE (f32, bf16, q8_0, q6_k, q4_k, q4_0) or none, at most 16"},
    {.name = "--threads",
     .arg = "N",
     .help = "threads of the calibration run and of the conversion (default: one per core)",
     .kind = CLI_INT,
     .off = offsetof(q_args, threads),
     .lo = 0,
     .hi = 1024},
    {.name = "--quiet",
     .alias = "-q",
     .help = "no progress bar or per-tensor lines on stderr",
     .kind = CLI_FLAG,
     .off = offsetof(q_args, quiet)},
    {0},
};

static const cli_cmd Q_CMD = {
    "quantize",
    "usage: tokamak quantize -i MODEL -o OUT.gguf --type T [--calib FILE.txt] [options]",
    0,
    Q_ROWS,
    "Vectors (norms, biases) stay f32. By default the embedding/output matrix is at\n"
    "least q8_0 and the first and last layers one step above the rest (q4 -> q6_k ->\n"
    "q8_0); K-quant rows that are not whole 256-blocks fall back to q4_0 / q8_0.\n"
    "Each tensor's type and error is printed: with --calib the activation-weighted\n"
    "output error ||(W - Q(W)) X||^2 / ||W X||^2 on the sampled tokens, else ||W - Q(W)||^2 / ||W||^2.\n"
    "docs/formats.md describes the types and the calibration.",
    0,
    NULL,
};

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
        it->ne[0] = hp->head_dim / 2, it->ne[1] = 1, it->type = TK_DTYPE_F32, it->role = r;
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
    it->role = r, it->layer = l;
    arch_tensor_name(TK_NAMING_GGUF, r, l, it->name, sizeof it->name);
    it->type = arch_role_is_matmul(r) || r == TK_ROLE_TOK_EMBD ? mtype : TK_DTYPE_F32;
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

/* Bits per weight, for "at least" comparisons between types. */
static double q_bits(tk_dtype t) { return 8.0 * (double)dtype_block_bytes(t) / (double)dtype_block_elems(t); }

/* One step up the ladder q4 -> q6_k -> q8_0 (q8_0 and above are near lossless: they stay). */
static tk_dtype q_step_up(tk_dtype t) {
    switch (t) {
    case TK_DTYPE_Q4_0:
    case TK_DTYPE_Q4_K:
        return TK_DTYPE_Q6_K;
    case TK_DTYPE_Q6_K:
        return TK_DTYPE_Q8_0;
    default:
        return t;
    }
}

/* llama.cpp's use_more_bits: the layers where Q4_K_M keeps attn_v and ffn_down at Q6_K. */
static bool q_more_bits(int l, int n) { return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2; }

/* Every tensor's type: the kind, then the defaults, then --keep; K-quant rows
 * that are not whole 256-blocks fall back to the 32-block type of as many bits. */
static void q_assign(const q_src *s, const q_kind *kind, const q_args *a, q_item *items, int n) {
    const int L = s->hp.n_layer;
    for (int i = 0; i < n; i++) {
        q_item *it = &items[i];
        bool mat = arch_role_is_matmul(it->role) || it->role == TK_ROLE_TOK_EMBD;
        if (!mat) continue;
        tk_dtype t = kind->type;
        if (kind->mix && (it->role == TK_ROLE_V || it->role == TK_ROLE_DOWN) && q_more_bits(it->layer, L))
            t = TK_DTYPE_Q6_K;
        if (!a->no_defaults) {
            if (it->role == TK_ROLE_TOK_EMBD || it->role == TK_ROLE_OUTPUT) {
                if (q_bits(t) < q_bits(TK_DTYPE_Q8_0)) t = TK_DTYPE_Q8_0;
            } else if (it->layer == 0 || it->layer == L - 1) {
                tk_dtype up = q_step_up(kind->type);
                if (q_bits(up) > q_bits(t)) t = up;
            }
        }
        for (int k = 0; k < a->n_keep; k++)
            if (!fnmatch(a->keep[k].pattern, it->name, 0)) t = a->keep[k].type;
        if (it->ne[0] % dtype_block_elems(t))
            t = t == TK_DTYPE_Q4_K ? TK_DTYPE_Q4_0 : t == TK_DTYPE_Q6_K ? TK_DTYPE_Q8_0 : t;
        if (it->ne[0] % dtype_block_elems(t)) t = TK_DTYPE_BF16;
        it->type = t;
    }
}

/* ---- activation-aware scales ---------------------------------------------------------- */

/* Per layer, the input-channel scales folded into the weights (NULL: none):
 * s_in[site] multiplies the columns of the matrices reading that site and
 * divides what writes it (the norm for ATTN_IN / FFN_IN, up's rows for
 * FFN_MID, v's rows for ATTN_OUT when every query head has its own KV head). */
typedef struct q_layer_scales {
    float *s[BACKEND_SITE_COUNT];
} q_layer_scales;

static backend_site q_site_of(tk_role r) {
    return r == TK_ROLE_O                         ? BACKEND_SITE_ATTN_OUT
           : r == TK_ROLE_GATE || r == TK_ROLE_UP ? BACKEND_SITE_FFN_IN
           : r == TK_ROLE_DOWN                    ? BACKEND_SITE_FFN_MID
                                                  : BACKEND_SITE_ATTN_IN;
}

static const q_item *q_item_of(const q_item *items, int n, tk_role r, int l) {
    for (int i = 0; i < n; i++)
        if (items[i].role == r && items[i].layer == l && items[i].src) return &items[i];
    return NULL;
}

static tk_status q_load_f32(const q_item *it, float **out) {
    const tk_kernels *K = kernels_default();
    *out = tk_malloc((size_t)(it->ne[0] * it->ne[1]) * sizeof **out);
    if (!*out) return tk_fail(TK_ERR_NOMEM, "quantize: out of memory for %s", it->name);
    for (int64_t r = 0; r < it->ne[1]; r++)
        kern_dequant_tensor_row(K, it->src, r, *out + (size_t)(r * it->ne[0]));
    return TK_OK;
}

static bool q_is_quant(tk_dtype t) { return dtype_block_elems(t) > 1; }

/* Search the scales of every site of every layer (matrices of a site that are
 * not block-quantized keep scales of 1 and take no part). */
static tk_status q_awq(const q_src *s, const calib *c, const q_item *items, int n, q_layer_scales *ls,
                       bool quiet) {
    static const tk_role site_roles[BACKEND_SITE_COUNT][3] = {{TK_ROLE_Q, TK_ROLE_K, TK_ROLE_V},
                                                              {TK_ROLE_O, TK_ROLE_COUNT, TK_ROLE_COUNT},
                                                              {TK_ROLE_GATE, TK_ROLE_UP, TK_ROLE_COUNT},
                                                              {TK_ROLE_DOWN, TK_ROLE_COUNT, TK_ROLE_COUNT}};
    const tk_hparams *hp = &s->hp;
    tk_status st = TK_OK;
    for (int l = 0; l < hp->n_layer && !st; l++) {
        for (int site = 0; site < BACKEND_SITE_COUNT && !st; site++) {
            /* o's input is v's output only when the heads map one to one */
            if (site == BACKEND_SITE_ATTN_OUT && hp->n_head != hp->n_head_kv) continue;
            float *W[3] = {0};
            int64_t rows[3];
            tk_dtype types[3];
            int nm = 0;
            for (int i = 0; i < 3 && !st; i++) {
                const q_item *it =
                    site_roles[site][i] == TK_ROLE_COUNT ? NULL : q_item_of(items, n, site_roles[site][i], l);
                if (!it || !q_is_quant(it->type)) continue;
                rows[nm] = it->ne[1], types[nm] = it->type;
                st = q_load_f32(it, &W[nm++]);
            }
            const calib_site *cs = calib_at(c, l, (backend_site)site);
            if (!st && nm > 0) {
                ls[l].s[site] = tk_malloc((size_t)cs->k * sizeof(float));
                if (!ls[l].s[site])
                    st = tk_fail(TK_ERR_NOMEM, "quantize: out of memory");
                else
                    calib_awq_search(c, cs, W, rows, types, nm, ls[l].s[site]);
            }
            for (int i = 0; i < nm; i++) tk_free(W[i]);
        }
        if (!quiet) cli_progress("scale search", l + 1, hp->n_layer);
    }
    return st;
}

/* The factors row r of the tensor is multiplied by as written (the layer's
 * scales folded in); false when there are none. */
static bool q_factors(const q_item *it, const q_layer_scales *ls, int64_t r, float *fac) {
    if (!ls || !it->src || it->role >= TK_ROLE_LAYER_COUNT) return false;
    const int64_t k = it->ne[0];
    const float *in = NULL, *div_row = NULL, *div_col = NULL;
    switch (it->role) {
    case TK_ROLE_ATTN_NORM:
        div_col = ls->s[BACKEND_SITE_ATTN_IN];
        break;
    case TK_ROLE_FFN_NORM:
        div_col = ls->s[BACKEND_SITE_FFN_IN];
        break;
    case TK_ROLE_V_BIAS:
        div_col = ls->s[BACKEND_SITE_ATTN_OUT];
        break;
    case TK_ROLE_Q:
    case TK_ROLE_K:
        in = ls->s[BACKEND_SITE_ATTN_IN];
        break;
    case TK_ROLE_V:
        in = ls->s[BACKEND_SITE_ATTN_IN], div_row = ls->s[BACKEND_SITE_ATTN_OUT];
        break;
    case TK_ROLE_O:
        in = ls->s[BACKEND_SITE_ATTN_OUT];
        break;
    case TK_ROLE_GATE:
        in = ls->s[BACKEND_SITE_FFN_IN];
        break;
    case TK_ROLE_UP:
        in = ls->s[BACKEND_SITE_FFN_IN], div_row = ls->s[BACKEND_SITE_FFN_MID];
        break;
    case TK_ROLE_DOWN:
        in = ls->s[BACKEND_SITE_FFN_MID];
        break;
    default:
        break;
    }
    if (!in && !div_row && !div_col) return false;
    for (int64_t j = 0; j < k; j++)
        fac[j] = (in ? in[j] : 1.0f) / (div_col ? div_col[j] : 1.0f) / (div_row ? div_row[r] : 1.0f);
    return true;
}

/* Scratch rows of the widest tensor, one set per thread. */
typedef struct q_work {
    float *row, *orig, *fac, *imp, *dq;
} q_work;

/* Error sums of one tensor: num / den as printed. */
typedef struct q_err {
    double num, den;
} q_err;

/* One tensor's rows, split over the pool: each row is converted on its own
 * (its output bytes do not depend on the split) and its error terms kept
 * per row, summed in row order afterwards, so the file and the printed
 * errors are the same for any number of threads. */
typedef struct q_rows_job {
    const tk_preset *p;
    const q_item *it;
    const calib *c;
    const calib_site *cs;
    const q_layer_scales *ls;
    bool search;
    const q_work *wk; /* (nth) */
    uint8_t *data;
    size_t row_bytes;
    double *num, *den; /* (rows) */
    atomic_bool failed;
} q_rows_job;

static void q_rows(void *ctx, int ith, int nth) {
    q_rows_job *j = ctx;
    const tk_kernels *K = kernels_default();
    const q_item *it = j->it;
    const q_work *wk = &j->wk[ith];
    const int64_t cols = it->ne[0], rows = it->ne[1];
    long r0, r1;
    pool_split((long)rows, ith, nth, 1, &r0, &r1);
    for (long r = r0; r < r1 && !atomic_load_explicit(&j->failed, memory_order_relaxed); r++) {
        float *row = wk->row;
        if (it->src)
            kern_dequant_tensor_row(K, it->src, r, row);
        else { /* the factors synth writes: llama.cpp's converter's */
            synth_cfg sc = {.p = *j->p};
            synth_tensor t = {.kind = SYNTH_ROPE_FREQS, .n_dims = 1, .ne = {cols, 1}};
            synth_gen_rows(&sc, &t, 0, 1, true, row);
        }
        memcpy(wk->orig, row, (size_t)cols * sizeof *row);
        bool folded = q_factors(it, j->ls, r, wk->fac);
        if (folded)
            for (int64_t c = 0; c < cols; c++) row[c] *= wk->fac[c];
        const float *imp = NULL;
        if (j->cs && j->search) {
            for (int64_t c = 0; c < cols; c++)
                wk->imp[c] = folded ? j->cs->ms[c] / (wk->fac[c] * wk->fac[c]) : j->cs->ms[c];
            imp = wk->imp;
        }
        int64_t dst = it->permute ? q_permuted(r, it->permute, rows) : r;
        uint8_t *out = j->data + (uint64_t)dst * j->row_bytes;
        if (!kern_quantize_row_imp(it->type, row, imp, out, cols)) {
            atomic_store(&j->failed, true);
            return;
        }
        if (!arch_role_is_matmul(it->role) && it->role != TK_ROLE_TOK_EMBD) continue;
        K->dequant_row[it->type](out, wk->dq, cols);
        for (int64_t c = 0; c < cols; c++)
            wk->dq[c] = (folded ? wk->dq[c] / wk->fac[c] : wk->dq[c]) - wk->orig[c];
        double num = 0.0, den = 0.0;
        if (j->cs) {
            num = calib_row_error(j->c, j->cs, wk->dq);
            den = calib_row_error(j->c, j->cs, wk->orig);
        } else {
            for (int64_t c = 0; c < cols; c++) {
                num += (double)wk->dq[c] * wk->dq[c];
                den += (double)wk->orig[c] * wk->orig[c];
            }
        }
        j->num[r] = num, j->den[r] = den;
    }
}

static tk_status q_write_tensor(gguf_writer *w, tk_pool *pool, const tk_preset *p, const q_item *it,
                                const calib *c, const q_layer_scales *ls, bool search, const q_work *wk,
                                q_err *err) {
    int64_t cols = it->ne[0], rows = it->ne[1];
    uint64_t row_bytes, nbytes;
    if (!dtype_row_bytes(it->type, (uint64_t)cols, &row_bytes) ||
        !tk_mul_u64(row_bytes, (uint64_t)rows, &nbytes) || nbytes > SIZE_MAX)
        return tk_fail(TK_ERR_RANGE, "quantize: tensor %s size overflows", it->name);
    uint8_t *data = tk_alloc_aligned((size_t)nbytes, 64);
    double *terms = tk_calloc((size_t)rows, 2 * sizeof *terms);
    if (!data || !terms) {
        tk_free_aligned(data);
        tk_free(terms);
        return tk_fail(TK_ERR_NOMEM, "quantize: out of memory for tensor %s", it->name);
    }
    const bool mat = arch_role_is_matmul(it->role) && it->role != TK_ROLE_OUTPUT;
    q_rows_job job = {.p = p,
                      .it = it,
                      .c = c,
                      .cs = c && mat ? calib_at(c, it->layer, q_site_of(it->role)) : NULL,
                      .ls = ls,
                      .search = search,
                      .wk = wk,
                      .data = data,
                      .row_bytes = (size_t)row_bytes,
                      .num = terms,
                      .den = terms + rows};
    atomic_init(&job.failed, false);
    pool_run(pool, q_rows, &job);
    tk_status st = TK_OK;
    if (atomic_load(&job.failed)) {
        st = tk_fail(TK_ERR_UNSUPPORTED, "quantize: cannot write %s as %s", it->name, dtype_name(it->type));
    } else {
        memset(err, 0, sizeof *err);
        for (int64_t r = 0; r < rows; r++) err->num += job.num[r], err->den += job.den[r];
        st = gguf_w_tensor_data(w, data, nbytes);
    }
    tk_free(terms);
    tk_free_aligned(data);
    return st;
}

static tk_status q_convert(const q_src *s, const q_kind *kind, const q_args *a, const calib *c) {
    const tk_hparams *hp = &s->hp;
    int cap = TK_ROLE_COUNT * (hp->n_layer + 1);
    q_item *items = tk_calloc((size_t)cap, sizeof *items);
    q_layer_scales *ls = NULL;
    q_work *wk = NULL;
    float *scratch = NULL;
    tk_pool *pool = NULL;
    gguf_writer *w = NULL;
    bool began = false;
    int n = 0;
    tk_status st =
        items ? q_plan(s, kind->type, items, &n) : tk_fail(TK_ERR_NOMEM, "quantize: out of memory");
    if (st) goto done;
    q_assign(s, kind, a, items, n);
    if (c && !a->rtn) {
        if (!(ls = tk_calloc((size_t)hp->n_layer, sizeof *ls))) {
            st = tk_fail(TK_ERR_NOMEM, "quantize: out of memory");
            goto done;
        }
        if ((st = q_awq(s, c, items, n, ls, a->quiet))) goto done;
    }
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
    if ((st = gguf_writer_init(32, &w)) || (st = synth_write_meta(w, &p, s->name, kind->ftype, s->vocab)))
        goto done;
    int64_t maxc = 1;
    for (int i = 0; i < n; i++) {
        if ((st = gguf_w_tensor_info(w, items[i].name, items[i].type, items[i].ne[1] > 1 ? 2 : 1,
                                     items[i].ne)))
            goto done;
        if (items[i].ne[0] > maxc) maxc = items[i].ne[0];
    }
    if ((st = pool_init(a->threads, false, &pool))) goto done;
    const int nth = pool_size(pool);
    wk = tk_calloc((size_t)nth, sizeof *wk);
    scratch = tk_calloc((size_t)nth * 5, (size_t)maxc * sizeof(float));
    if (!wk || !scratch) {
        st = tk_fail(TK_ERR_NOMEM, "quantize: out of memory");
        goto done;
    }
    for (int t = 0; t < nth; t++) {
        float *b = scratch + (size_t)t * 5 * (size_t)maxc;
        wk[t] = (q_work){b, b + maxc, b + 2 * maxc, b + 3 * maxc, b + 4 * maxc};
    }
    if ((st = gguf_w_begin(w, a->out))) goto done;
    began = true;
    q_err tot = {0, 0};
    for (int i = 0; i < n; i++) {
        q_err e;
        const q_item *it = &items[i];
        if ((st = q_write_tensor(w, pool, &p, it, c, ls ? &ls[it->layer] : NULL, c && !a->rtn, wk, &e)))
            goto done;
        bool mat = arch_role_is_matmul(it->role) || it->role == TK_ROLE_TOK_EMBD;
        bool weighted = c && arch_role_is_matmul(it->role) && it->role != TK_ROLE_OUTPUT;
        if (weighted) tot.num += e.num, tot.den += e.den;
        if (!a->quiet && mat)
            fprintf(stderr, "%-28s %-5s %s %.3e\n", it->name, dtype_name(it->type),
                    weighted ? "act-weighted err" : "weight err      ", e.den > 0 ? e.num / e.den : 0.0);
    }
    if (c) printf("activation-weighted error (all layers): %.6e\n", tot.den > 0 ? tot.num / tot.den : 0.0);
    st = gguf_w_finish(w);
done:
    if (st && began) remove(a->out); /* no half-written model left behind */
    gguf_writer_free(w);
    tk_free(wk);
    tk_free(scratch);
    pool_free(pool);
    for (int l = 0; ls && l < hp->n_layer; l++)
        for (int k = 0; k < BACKEND_SITE_COUNT; k++) tk_free(ls[l].s[k]);
    tk_free(ls);
    tk_free(items);
    return st;
}

int cmd_quantize(int argc, char **argv) {
    q_args a = {.calib_lines = 256, .calib_tokens = 64};
    cli_opts o;
    cli_opts_init(&o, &Q_CMD, &a);
    int prc = cli_opts_parse(&o, argc, argv);
    if (prc != CLI_GO_ON) return prc;
    if (!a.in || !a.out || !a.type) {
        cli_error(&Q_CMD, "-i, -o and --type are required; 'tokamak quantize --help' lists the options");
        return 2;
    }
    const q_kind *kind = NULL;
    for (int i = 0; i < N_KINDS; i++)
        if (!strcmp(a.type, KINDS[i].name)) kind = &KINDS[i];
    if (!kind) {
        cli_error(&Q_CMD, "bad value '%s' for --type (f32, bf16, q8_0, q6_k, q4_k, q4_0 or q4_k_m)", a.type);
        return 2;
    }
    if (a.rtn && !a.calib) {
        cli_error(&Q_CMD, "--rtn measures against --calib text; give --calib FILE.txt");
        return 2;
    }
    calib *c = NULL;
    q_src s;
    memset(&s, 0, sizeof s);
    tk_status st =
        a.calib ? calib_run(a.in, a.calib, a.calib_lines, a.calib_tokens, a.threads, !a.quiet, &c) : TK_OK;
    if (!st) st = q_open(a.in, &s);
    if (!st) {
        char name[256]; /* general.name: the input's last path component */
        size_t len = strlen(a.in);
        while (len > 1 && a.in[len - 1] == '/') len--;
        size_t b = len;
        while (b > 0 && a.in[b - 1] != '/') b--;
        snprintf(name, sizeof name, "%.*s", (int)(len - b), a.in + b);
        s.name = name;
        st = q_convert(&s, kind, &a, c);
    }
    q_close(&s);
    calib_free(c);
    if (st) {
        fprintf(stderr, "tokamak quantize: %s\n", tk_last_error());
        return 1;
    }
    fprintf(stderr, "tokamak quantize: wrote %s (%s%s)\n", a.out, a.type,
            c ? (a.rtn ? ", round to nearest, measured" : ", calibrated") : "");
    return 0;
}
