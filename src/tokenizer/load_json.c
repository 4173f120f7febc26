/* Hugging Face tokenizer.json (+ tokenizer_config.json): byte-level BPE only.
 * Everything the file says is checked before use: ids in range and unique,
 * merges naming real tokens, a known pre-tokenizer pattern, and the JSON itself
 * bounded in size and depth. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "format/fmap.h"
#include "tokenizer/tok_internal.h"

/* cJSON recurses per nesting level; refuse deep input before it gets there.
 * cJSON's strings are NUL-terminated, so a NUL inside one (a raw byte or
 * \u0000) would silently cut it ("a\u0000b" read as "a"): refused too. */
static tk_status check_json_shape(const char *json, size_t len, const char *what) {
    if (len > TOK_MAX_JSON)
        return tk_fail(TK_ERR_FORMAT, "%s: %zu bytes is larger than the %llu-byte limit", what, len,
                       (unsigned long long)TOK_MAX_JSON);
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char c = json[i];
        if (in_str) {
            if (c == '\\' && i + 5 < len && !memcmp(json + i + 1, "u0000", 5))
                return tk_fail(
                    TK_ERR_FORMAT,
                    "%s: a string holds \\u0000 (NUL) at byte %zu; no token or name can contain NUL", what,
                    i);
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
            else if (c == 0)
                return tk_fail(TK_ERR_FORMAT, "%s: a string holds a NUL byte at byte %zu", what, i);
        } else if (c == '"') {
            in_str = true;
        } else if (c == '{' || c == '[') {
            if (++depth > TOK_MAX_JSON_DEPTH)
                return tk_fail(TK_ERR_FORMAT, "%s: JSON nested deeper than %d levels (at byte %zu)", what,
                               TOK_MAX_JSON_DEPTH, i);
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return TK_OK;
}

static tk_status parse_json(const char *json, size_t len, const char *what, cJSON **out) {
    *out = NULL;
    tk_status st = check_json_shape(json, len, what);
    if (st) return st;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!root) {
        size_t at = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        return tk_fail(TK_ERR_FORMAT, "%s: invalid JSON near byte %zu", what, at);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return tk_fail(TK_ERR_FORMAT, "%s: expected a JSON object at the top", what);
    }
    *out = root;
    return TK_OK;
}

/* A token named in the config: a string or {"content": "..."}. */
static const char *token_text(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static bool get_int_id(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d < (double)TOK_MAX_VOCAB) || d != (double)(int64_t)d) return false;
    *out = (int64_t)d;
    return true;
}

/* The pre-tokenizer's name from its Split regex (or ByteLevel's built-in one). */
static tk_status find_pre(const cJSON *pre, char *name, size_t cap, bool *byte_level) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
    if (!cJSON_IsString(type)) return tk_fail(TK_ERR_FORMAT, "tokenizer.json: pre_tokenizer without a type");
    if (!strcmp(type->valuestring, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers"), *p;
        if (!cJSON_IsArray(list))
            return tk_fail(TK_ERR_FORMAT, "tokenizer.json: Sequence without pretokenizers");
        cJSON_ArrayForEach(p, list) {
            tk_status st = find_pre(p, name, cap, byte_level);
            if (st) return st;
        }
        return TK_OK;
    }
    if (!strcmp(type->valuestring, "ByteLevel")) {
        *byte_level = true;
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(pre, "use_regex");
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space");
        if (cJSON_IsTrue(ap))
            return tk_fail(TK_ERR_UNSUPPORTED, "tokenizer.json: ByteLevel add_prefix_space is not supported");
        if (!cJSON_IsFalse(ur)) { /* default true: GPT-2's own regex */
            if (name[0])
                return tk_fail(TK_ERR_UNSUPPORTED, "tokenizer.json: two pre-tokenizer regexes in sequence");
            snprintf(name, cap, "gpt2");
        }
        return TK_OK;
    }
    if (!strcmp(type->valuestring, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pre, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(pre, "behavior");
        const cJSON *inv = cJSON_GetObjectItemCaseSensitive(pre, "invert");
        if (!cJSON_IsString(re))
            return tk_fail(TK_ERR_UNSUPPORTED, "tokenizer.json: Split without a Regex pattern");
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") || cJSON_IsTrue(inv))
            return tk_fail(TK_ERR_UNSUPPORTED,
                           "tokenizer.json: Split behavior must be Isolated (not inverted)");
        const char *known = tok_pre_from_regex(re->valuestring);
        if (!known)
            return tk_fail(
                TK_ERR_UNSUPPORTED,
                "tokenizer.json: unknown pre-tokenizer regex \"%.80s%s\" (known: Qwen2, Llama-3, GPT-2)",
                re->valuestring, strlen(re->valuestring) > 80 ? "..." : "");
        if (name[0])
            return tk_fail(TK_ERR_UNSUPPORTED, "tokenizer.json: two pre-tokenizer regexes in sequence");
        snprintf(name, cap, "%s", known);
        return TK_OK;
    }
    return tk_fail(TK_ERR_UNSUPPORTED, "tokenizer.json: pre_tokenizer type '%.40s' is not supported",
                   type->valuestring);
}

/* Every id 0..max_id must name a token (the vocab's or an added one): a hole
 * means an entry went missing, which is said as such rather than as the
 * range error it would otherwise surface as. n_entries bounds the bitmap, so
 * a huge id in a small file costs nothing. */
static tk_status check_dense(const cJSON *vocab, const cJSON *added, int64_t n_entries, int64_t max_id,
                             int64_t max_vocab_id) {
    int64_t span = max_id + 1 < n_entries ? max_id + 1 : n_entries; /* a hole lies below this */
    if (span <= 0) return TK_OK;
    uint8_t *seen = tk_calloc((size_t)span, 1);
    if (!seen) return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        int64_t id = (int64_t)e->valuedouble;
        if (id < span) seen[id] = 1;
    }
    cJSON_ArrayForEach(e, added) {
        int64_t id = (int64_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        if (id < span) seen[id] = 1;
    }
    int64_t hole = -1;
    for (int64_t i = 0; i < span && hole < 0; i++)
        if (!seen[i]) hole = i;
    tk_free(seen);
    if (hole < 0) return TK_OK; /* max_id >= n_entries would leave a hole below n_entries */
    if (hole < max_vocab_id)
        return tk_fail(
            TK_ERR_FORMAT,
            "tokenizer.json: vocab ids are not contiguous: id %lld is missing (vocab ids run to %lld)",
            (long long)hole, (long long)max_vocab_id);
    return tk_fail(
        TK_ERR_FORMAT,
        "tokenizer.json: token ids are not contiguous: id %lld is missing (vocab ids run to %lld, added "
        "token ids to %lld)",
        (long long)hole, (long long)max_vocab_id, (long long)max_id);
}

static tk_status load_merges(tk_tokenizer *t, const cJSON *merges, tok_build *b) {
    if (!merges) return TK_OK;
    if (!cJSON_IsArray(merges)) return tk_fail(TK_ERR_FORMAT, "tokenizer.json: model.merges is not an array");
    int64_t n = cJSON_GetArraySize(merges);
    if (n == 0) return TK_OK;
    b->ml = tk_calloc((size_t)n, sizeof *b->ml);
    b->mr = tk_calloc((size_t)n, sizeof *b->mr);
    b->mll = tk_calloc((size_t)n, sizeof *b->mll);
    b->mrl = tk_calloc((size_t)n, sizeof *b->mrl);
    if (!b->ml || !b->mr || !b->mll || !b->mrl) return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    int64_t i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        if (cJSON_IsString(m)) { /* older files: "a b" */
            const char *s = m->valuestring, *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return tk_fail(TK_ERR_FORMAT, "tokenizer.json: merge %lld \"%.40s\" is not two tokens",
                               (long long)i, s);
            b->ml[i] = s;
            b->mll[i] = (size_t)(sp - s);
            b->mr[i] = sp + 1;
            b->mrl[i] = strlen(sp + 1);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 0)) && cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            b->ml[i] = cJSON_GetArrayItem(m, 0)->valuestring;
            b->mr[i] = cJSON_GetArrayItem(m, 1)->valuestring;
            b->mll[i] = strlen(b->ml[i]);
            b->mrl[i] = strlen(b->mr[i]);
        } else {
            return tk_fail(TK_ERR_FORMAT, "tokenizer.json: merge %lld is neither \"a b\" nor [a, b]",
                           (long long)i);
        }
        i++;
    }
    return tok_set_merges(t, n, b->ml, b->mll, b->mr, b->mrl);
}

static tk_status apply_config(tk_tokenizer *t, const cJSON *root, const cJSON *cfg) {
    /* BOS: the config's add_bos_token, else a TemplateProcessing that starts with a special token. */
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    const char *bos_text = NULL, *eos_text = NULL, *pad_text = NULL, *unk_text = NULL;
    bool add_bos = false, add_bos_set = false;
    if (cfg) {
        bos_text = token_text(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"));
        eos_text = token_text(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"));
        pad_text = token_text(cJSON_GetObjectItemCaseSensitive(cfg, "pad_token"));
        unk_text = token_text(cJSON_GetObjectItemCaseSensitive(cfg, "unk_token"));
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
        if (cJSON_IsBool(ab)) {
            add_bos = cJSON_IsTrue(ab);
            add_bos_set = true;
        }
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        const char *tmpl = NULL;
        if (cJSON_IsString(ct))
            tmpl = ct->valuestring;
        else if (cJSON_IsArray(ct)) { /* [{name, template}, ...]: the "default" one */
            const cJSON *e;
            cJSON_ArrayForEach(e, ct) {
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
                const cJSON *tp = cJSON_GetObjectItemCaseSensitive(e, "template");
                if (cJSON_IsString(nm) && cJSON_IsString(tp) && !strcmp(nm->valuestring, "default"))
                    tmpl = tp->valuestring;
            }
        }
        if (tmpl && !(t->chat_template = tk_strdup(tmpl)))
            return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    }
    if (cJSON_IsObject(pp)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(pp, "type");
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
        if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "TemplateProcessing") && cJSON_IsArray(single)) {
            const cJSON *first = cJSON_GetArrayItem(single, 0);
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
            const cJSON *sid = cJSON_GetObjectItemCaseSensitive(sp, "id");
            if (cJSON_IsString(sid)) {
                if (!bos_text) bos_text = sid->valuestring;
                if (!add_bos_set) add_bos = true;
            }
        }
    }
    if (bos_text && (t->bos = tok_find(t, bos_text, strlen(bos_text))) < 0)
        return tk_fail(TK_ERR_FORMAT, "tokenizer: bos_token '%.40s' is not in the vocabulary", bos_text);
    if (eos_text && (t->eos = tok_find(t, eos_text, strlen(eos_text))) < 0)
        return tk_fail(TK_ERR_FORMAT, "tokenizer: eos_token '%.40s' is not in the vocabulary", eos_text);
    if (pad_text) t->pad = tok_find(t, pad_text, strlen(pad_text));
    if (unk_text) t->unk = tok_find(t, unk_text, strlen(unk_text));
    if (!eos_text) { /* no config: the family's usual end-of-text token */
        static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>"};
        for (size_t i = 0; i < 3 && t->eos < 0; i++) t->eos = tok_find(t, names[i], strlen(names[i]));
    }
    t->add_bos = add_bos && t->bos >= 0;
    return TK_OK;
}

tk_status tok_load_json(const char *json, size_t len, const char *config_json, tk_tokenizer **out) {
    *out = NULL;
    if (!json) return tk_fail(TK_ERR_INVALID, "tok_load_json: NULL json");
    cJSON *root = NULL, *cfg = NULL;
    tk_tokenizer *t = NULL;
    tok_build b = {0};
    tk_status st = parse_json(json, len, "tokenizer.json", &root);
    if (st) return st;
    if (config_json && (st = parse_json(config_json, strlen(config_json), "tokenizer_config.json", &cfg)))
        goto fail;

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) {
        st = tk_fail(TK_ERR_FORMAT, "tokenizer.json: missing \"model\" section");
        goto fail;
    }
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (mtype && (!cJSON_IsString(mtype) || strcmp(mtype->valuestring, "BPE"))) {
        st = tk_fail(TK_ERR_UNSUPPORTED, "tokenizer.json: model type '%.40s' is not supported (expected BPE)",
                     cJSON_IsString(mtype) ? mtype->valuestring : "?");
        goto fail;
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab) || !vocab->child) {
        st = tk_fail(TK_ERR_FORMAT, "tokenizer.json: model.vocab is missing or empty");
        goto fail;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsArray(added)) {
        st = tk_fail(TK_ERR_FORMAT, "tokenizer.json: added_tokens is not an array");
        goto fail;
    }
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    bool nfc = false;
    if (norm && !cJSON_IsNull(norm)) {
        const cJSON *nt = cJSON_GetObjectItemCaseSensitive(norm, "type");
        if (!cJSON_IsString(nt) || strcmp(nt->valuestring, "NFC")) {
            st = tk_fail(TK_ERR_UNSUPPORTED,
                         "tokenizer.json: normalizer '%.40s' is not supported (NFC or none)",
                         cJSON_IsString(nt) ? nt->valuestring : "?");
            goto fail;
        }
        nfc = true;
    }

    /* Size the vocabulary: ids must be dense enough to index. */
    int64_t n_model = cJSON_GetArraySize(vocab), n_add = added ? cJSON_GetArraySize(added) : 0, max_id = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        int64_t id;
        if (!get_int_id(e, &id)) {
            st = tk_fail(TK_ERR_FORMAT, "tokenizer.json: vocab entry '%.40s' has a bad id", e->string);
            goto fail;
        }
        if (!e->string[0]) {
            st =
                tk_fail(TK_ERR_FORMAT, "tokenizer.json: vocab entry %lld is the empty string", (long long)id);
            goto fail;
        }
        if (id > max_id) max_id = id;
    }
    int64_t max_vocab_id = max_id;
    cJSON_ArrayForEach(e, added) {
        int64_t id;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!get_int_id(cJSON_GetObjectItemCaseSensitive(e, "id"), &id) || !cJSON_IsString(c)) {
            st = tk_fail(TK_ERR_FORMAT, "tokenizer.json: an added token lacks a valid id or content");
            goto fail;
        }
        if (!c->valuestring[0]) { /* would never match, yet claim an id */
            st = tk_fail(TK_ERR_FORMAT, "tokenizer.json: added token %lld has empty content", (long long)id);
            goto fail;
        }
        if (id > max_id) max_id = id;
    }
    if ((st = check_dense(vocab, added, n_model + n_add, max_id, max_vocab_id))) goto fail;
    int32_t n = (int32_t)(max_id + 1);
    if ((st = tok_alloc(TOK_KIND_BPE, n, &t))) goto fail;
    snprintf(t->model_name, sizeof t->model_name, "gpt2");
    b.pieces = tk_calloc((size_t)n, sizeof *b.pieces);
    b.lens = tk_calloc((size_t)n, sizeof *b.lens);
    b.types = tk_malloc((size_t)n);
    if (!b.pieces || !b.lens || !b.types) {
        st = tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
        goto fail;
    }
    memset(b.types, TOK_TYPE_UNUSED, (size_t)n);
    cJSON_ArrayForEach(e, vocab) {
        int32_t id = (int32_t)e->valuedouble;
        if (b.pieces[id]) {
            st = tk_fail(TK_ERR_FORMAT, "tokenizer.json: id %d used by both '%.40s' and '%.40s'", (int)id,
                         b.pieces[id], e->string);
            goto fail;
        }
        b.pieces[id] = e->string;
        b.lens[id] = strlen(e->string);
        b.types[id] = TOK_TYPE_NORMAL;
    }
    cJSON_ArrayForEach(e, added) {
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        const char *c = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        bool special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"));
        if (b.pieces[id] && strcmp(b.pieces[id], c)) {
            st = tk_fail(TK_ERR_FORMAT, "tokenizer.json: added token '%.40s' reuses id %d of '%.40s'", c,
                         (int)id, b.pieces[id]);
            goto fail;
        }
        b.pieces[id] = c;
        b.lens[id] = strlen(c);
        b.types[id] = special ? TOK_TYPE_CONTROL : TOK_TYPE_USER;
    }
    if ((st = tok_set_pieces(t, b.pieces, b.lens, b.types))) goto fail;
    cJSON_ArrayForEach(e, added) {
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        if ((st = tok_add_added(t, id, t->type[id] == TOK_TYPE_CONTROL))) goto fail;
    }
    if ((st = load_merges(t, cJSON_GetObjectItemCaseSensitive(model, "merges"), &b))) goto fail;
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    const cJSON *bf = cJSON_GetObjectItemCaseSensitive(model, "byte_fallback");
    if (cJSON_IsTrue(bf)) {
        st = tk_fail(TK_ERR_UNSUPPORTED,
                     "tokenizer.json: byte_fallback BPE (SentencePiece style) is not supported; use GGUF");
        goto fail;
    }

    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    bool byte_level = false;
    if (!cJSON_IsObject(pre)) {
        st = tk_fail(TK_ERR_UNSUPPORTED,
                     "tokenizer.json: no pre_tokenizer (only byte-level BPE is supported)");
        goto fail;
    }
    if ((st = find_pre(pre, t->pre_name, sizeof t->pre_name, &byte_level))) goto fail;
    if (!byte_level || !t->pre_name[0]) {
        st = tk_fail(TK_ERR_UNSUPPORTED,
                     "tokenizer.json: pre_tokenizer is not byte-level BPE with a known regex");
        goto fail;
    }
    t->nfc = nfc;
    if ((st = apply_config(t, root, cfg))) goto fail;
    if ((st = tok_finish(t))) goto fail;
    tok_build_free(&b);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    *out = t;
    return TK_OK;
fail:
    tok_build_free(&b);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    tok_free(t);
    return st;
}

tk_status tok_load_hf(const char *dir, tk_tokenizer **out) {
    *out = NULL;
    if (!dir) return tk_fail(TK_ERR_INVALID, "tok_load_hf: NULL directory");
    size_t dl = strlen(dir);
    char *p = tk_malloc(dl + 32);
    if (!p) return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    char *json = NULL, *cfg = NULL;
    size_t jl = 0, cl = 0;
    snprintf(p, dl + 32, "%s/tokenizer.json", dir);
    tk_status st = fmap_read_all(p, TOK_MAX_JSON, &json, &jl);
    struct stat sb;
    snprintf(p, dl + 32, "%s/tokenizer_config.json", dir);
    if (!st && stat(p, &sb) == 0) st = fmap_read_all(p, TOK_MAX_JSON, &cfg, &cl);
    if (!st && (st = tok_load_json(json, jl, cfg, out)))
        tk_error_prefix("%s", dir); /* read errors name the file */
    tk_free(p);
    tk_free(json);
    tk_free(cfg);
    return st;
}
