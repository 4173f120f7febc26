/* GGUF tokenizer.ggml.* metadata (as llama.cpp writes it) -> tk_tokenizer, and
 * tok_load_path, which picks the loader from what a path names. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/error.h"
#include "format/fmap.h"
#include "tokenizer/tok_internal.h"

static tk_status token_id(const gguf_file *f, const char *key, int32_t n, int32_t *out) {
    int64_t v;
    tk_status st = gguf_get_i64(f, key, -1, &v);
    if (st) return st;
    if (v >= n)
        return tk_fail(TK_ERR_FORMAT, "gguf: %s = %lld is past the %d-token vocabulary", key, (long long)v,
                       (int)n);
    *out = v < 0 ? -1 : (int32_t)v;
    return TK_OK;
}

static tk_status load_merges(tk_tokenizer *t, const gguf_file *f, tok_build *b) {
    const gguf_kv *kv;
    tk_status st = gguf_require_arr(f, "tokenizer.ggml.merges", GGUF_T_STRING, &kv);
    if (st) return st;
    if (kv->arr_n > (uint64_t)TOK_MAX_VOCAB * 4)
        return tk_fail(TK_ERR_FORMAT, "gguf: %llu merges is too many", (unsigned long long)kv->arr_n);
    int64_t n = (int64_t)kv->arr_n;
    if (n == 0) return TK_OK;
    b->ml = tk_calloc((size_t)n, sizeof *b->ml);
    b->mr = tk_calloc((size_t)n, sizeof *b->mr);
    b->mll = tk_calloc((size_t)n, sizeof *b->mll);
    b->mrl = tk_calloc((size_t)n, sizeof *b->mrl);
    if (!b->ml || !b->mr || !b->mll || !b->mrl) return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    for (int64_t i = 0; i < n; i++) {
        gguf_str s;
        if ((st = gguf_arr_str(kv, (uint64_t)i, &s))) return st;
        /* "a b": split at the first space after the first byte (a piece may itself be " ") */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp)
            return tk_fail(TK_ERR_FORMAT, "gguf: tokenizer.ggml.merges[%lld] \"%.*s\" is not \"a b\"",
                           (long long)i, (int)(s.len > 40 ? 40 : s.len), s.ptr);
        b->ml[i] = s.ptr;
        b->mll[i] = (size_t)(sp - s.ptr);
        b->mr[i] = sp + 1;
        b->mrl[i] = s.len - b->mll[i] - 1;
    }
    return tok_set_merges(t, n, b->ml, b->mll, b->mr, b->mrl);
}

tk_status tok_load_gguf(const gguf_file *f, tk_tokenizer **out) {
    *out = NULL;
    if (!f) return tk_fail(TK_ERR_INVALID, "tok_load_gguf: NULL file");
    gguf_str model, pre = {"", 0}, tmpl;
    bool has_pre = false, has_tmpl = false;
    tk_status st = gguf_require_str(f, "tokenizer.ggml.model", &model);
    if (st) return st;
    tok_kind kind;
    if (gguf_str_eq(model, "gpt2"))
        kind = TOK_KIND_BPE;
    else if (gguf_str_eq(model, "llama"))
        kind = TOK_KIND_SPM;
    else
        return tk_fail(TK_ERR_UNSUPPORTED,
                       "gguf: tokenizer.ggml.model '%.*s' is not supported (gpt2 or llama)",
                       (int)(model.len > 40 ? 40 : model.len), model.ptr);
    if ((st = gguf_get_str(f, "tokenizer.ggml.pre", &pre, &has_pre))) return st;
    if ((st = gguf_get_str(f, "tokenizer.chat_template", &tmpl, &has_tmpl))) return st;
    const gguf_kv *toks, *types = gguf_find(f, "tokenizer.ggml.tokens"), *scores = NULL;
    if ((st = gguf_require_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &toks))) return st;
    if (toks->arr_n == 0 || toks->arr_n > TOK_MAX_VOCAB)
        return tk_fail(TK_ERR_FORMAT, "gguf: tokenizer.ggml.tokens has %llu entries (1..%d)",
                       (unsigned long long)toks->arr_n, TOK_MAX_VOCAB);
    int32_t n = (int32_t)toks->arr_n;
    types = gguf_find(f, "tokenizer.ggml.token_type");
    if (types && (types->type != GGUF_T_ARRAY || types->arr_n != (uint64_t)n))
        return tk_fail(TK_ERR_FORMAT, "gguf: tokenizer.ggml.token_type must be an array of %d integers",
                       (int)n);
    if (kind == TOK_KIND_SPM) {
        scores = gguf_find(f, "tokenizer.ggml.scores");
        if (scores && (scores->type != GGUF_T_ARRAY || scores->arr_n != (uint64_t)n))
            return tk_fail(TK_ERR_FORMAT, "gguf: tokenizer.ggml.scores must be an array of %d numbers",
                           (int)n);
    }

    tk_tokenizer *t = NULL;
    tok_build b = {0};
    if ((st = tok_alloc(kind, n, &t))) return st;
    snprintf(t->model_name, sizeof t->model_name, "%s", kind == TOK_KIND_BPE ? "gpt2" : "llama");
    b.pieces = tk_calloc((size_t)n, sizeof *b.pieces);
    b.lens = tk_calloc((size_t)n, sizeof *b.lens);
    b.types = tk_malloc((size_t)n);
    if (kind == TOK_KIND_SPM) t->score = tk_calloc((size_t)n, sizeof *t->score);
    if (!b.pieces || !b.lens || !b.types || (kind == TOK_KIND_SPM && !t->score)) {
        st = tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < n; i++) {
        gguf_str s;
        if ((st = gguf_arr_str(toks, (uint64_t)i, &s))) goto fail;
        b.pieces[i] = s.ptr;
        b.lens[i] = (size_t)s.len;
        int64_t ty = TOK_TYPE_NORMAL;
        if (types && (st = gguf_arr_i64(types, (uint64_t)i, &ty))) goto fail;
        if (ty < TOK_TYPE_NORMAL || ty > TOK_TYPE_BYTE) {
            st = tk_fail(TK_ERR_FORMAT, "gguf: tokenizer.ggml.token_type[%d] = %lld, expected 1..6", (int)i,
                         (long long)ty);
            goto fail;
        }
        b.types[i] = (uint8_t)ty;
        if (scores && (st = gguf_arr_f32(scores, (uint64_t)i, &t->score[i]))) goto fail;
    }
    if ((st = tok_set_pieces(t, b.pieces, b.lens, b.types))) goto fail;
    for (int32_t i = 0; i < n; i++) {
        int ty = t->type[i];
        if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER || ty == TOK_TYPE_UNKNOWN)
            if ((st = tok_add_added(t, i, ty != TOK_TYPE_USER))) goto fail;
    }
    if (kind == TOK_KIND_BPE) {
        if ((st = load_merges(t, f, &b))) goto fail;
        /* Files from before tokenizer.ggml.pre existed used GPT-2's regex. */
        snprintf(t->pre_name, sizeof t->pre_name, "%.*s", has_pre ? (int)(pre.len > 31 ? 31 : pre.len) : 4,
                 has_pre ? pre.ptr : "gpt2");
        t->nfc = !strcmp(t->pre_name, "qwen2") ||
                 !strcmp(t->pre_name, "deepseek-r1-qwen"); /* HF Qwen2 normalises */
        t->ignore_merges = !strcmp(t->pre_name, "llama-bpe") || !strcmp(t->pre_name, "llama3");
    } else {
        snprintf(t->pre_name, sizeof t->pre_name, "default");
    }
    if ((st = token_id(f, "tokenizer.ggml.bos_token_id", n, &t->bos)) ||
        (st = token_id(f, "tokenizer.ggml.eos_token_id", n, &t->eos)) ||
        (st = token_id(f, "tokenizer.ggml.unknown_token_id", n, &t->unk)) ||
        (st = token_id(f, "tokenizer.ggml.padding_token_id", n, &t->pad)))
        goto fail;
    bool add_bos;
    if ((st = gguf_get_bool(f, "tokenizer.ggml.add_bos_token", kind == TOK_KIND_SPM, &add_bos))) goto fail;
    if ((st =
             gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", kind == TOK_KIND_SPM, &t->add_space_prefix)))
        goto fail;
    t->add_bos = add_bos && t->bos >= 0;
    if (kind == TOK_KIND_SPM && t->unk < 0) t->unk = tok_find(t, "<unk>", 5);
    if (has_tmpl && tmpl.len) {
        if (!(t->chat_template = tk_strndup(tmpl.ptr, (size_t)tmpl.len))) {
            st = tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
            goto fail;
        }
    }
    if ((st = tok_finish(t))) goto fail;
    tok_build_free(&b);
    *out = t;
    return TK_OK;
fail:
    tok_build_free(&b);
    tok_free(t);
    return st;
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

tk_status tok_load_path(const char *path, tk_tokenizer **out) {
    *out = NULL;
    if (!path) return tk_fail(TK_ERR_INVALID, "tok_load_path: NULL path");
    struct stat sb;
    if (stat(path, &sb) != 0) return tk_fail(TK_ERR_IO, "%s: no such file or directory", path);
    if (S_ISDIR(sb.st_mode)) return tok_load_hf(path, out);
    if (ends_with(path, ".json")) {
        char *json = NULL, *cfg = NULL;
        size_t jl = 0, cl = 0;
        tk_status st = fmap_read_all(path, TOK_MAX_JSON, &json, &jl);
        if (st) return st;
        /* tokenizer_config.json beside it, if there is one */
        size_t pl = strlen(path);
        char *cp = tk_malloc(pl + 32);
        if (!cp) {
            tk_free(json);
            return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
        }
        memcpy(cp, path, pl + 1);
        char *slash = strrchr(cp, '/');
        snprintf(slash ? slash + 1 : cp, pl + 32 - (size_t)(slash ? slash + 1 - cp : 0),
                 "tokenizer_config.json");
        if (strcmp(cp, path) && stat(cp, &sb) == 0) st = fmap_read_all(cp, TOK_MAX_JSON, &cfg, &cl);
        if (!st && (st = tok_load_json(json, jl, cfg, out)))
            tk_error_prefix("%s", path); /* read errors name the file */
        tk_free(cp);
        tk_free(json);
        tk_free(cfg);
        return st;
    }
    gguf_file *f = NULL;
    tk_status st = gguf_open(path, &f);
    if (st) return st;
    st = tok_load_gguf(f, out);
    if (st) tk_error_prefix("%s", path);
    gguf_close(f);
    return st;
}
