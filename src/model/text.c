/* The public text calls (tokamak.h): the model's tokenizer behind tk_tokenize,
 * tk_detokenize and tk_chat_tokenize. Every buffer handed out is tk_malloc'd,
 * so tk_free_buf is tk_free. */
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

void tk_free_buf(void *p) { tk_free(p); }

static tk_status vocab_of(const tk_model *m, const char *what, const tk_tokenizer **t) {
    if (!m) return tk_fail(TK_ERR_INVALID, "%s: NULL model", what);
    if (!(*t = model_tokenizer(m)))
        return tk_fail(TK_ERR_UNSUPPORTED, "%s: the model carries no vocabulary", what);
    return TK_OK;
}

tk_status tk_tokenize(const tk_model *m, const char *text, size_t len, bool add_bos, bool parse_special,
                      int32_t **ids, size_t *n_ids) {
    if (!ids || !n_ids) return tk_fail(TK_ERR_INVALID, "tk_tokenize: NULL output");
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return tk_fail(TK_ERR_INVALID, "tk_tokenize: NULL text");
    const tk_tokenizer *t;
    tk_status st = vocab_of(m, "tk_tokenize", &t);
    if (st) return st;
    size_t cap = tok_encode_bound(t, len), n = 0;
    if (cap > SIZE_MAX / sizeof(int32_t))
        return tk_fail(TK_ERR_RANGE, "tk_tokenize: %zu bytes of text is too long", len);
    int32_t *out = tk_malloc(cap * sizeof *out);
    if (!out) return tk_fail(TK_ERR_NOMEM, "tk_tokenize: out of memory for %zu ids", cap);
    if ((st = tok_encode(t, text ? text : "", len, add_bos, parse_special, out, cap, &n))) {
        tk_free(out);
        return st;
    }
    int32_t *fit = tk_realloc(out, (n ? n : 1) * sizeof *out); /* give back the bound's slack */
    *ids = fit ? fit : out;
    *n_ids = n;
    return TK_OK;
}

tk_status tk_detokenize(const tk_model *m, const int32_t *ids, size_t n_ids, bool show_special, char **text,
                        size_t *len) {
    if (!text || !len) return tk_fail(TK_ERR_INVALID, "tk_detokenize: NULL output");
    *text = NULL;
    *len = 0;
    if (!ids && n_ids) return tk_fail(TK_ERR_INVALID, "tk_detokenize: NULL ids");
    const tk_tokenizer *t;
    tk_status st = vocab_of(m, "tk_detokenize", &t);
    if (st) return st;
    int nv = tok_n_vocab(t);
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= nv)
            return tk_fail(TK_ERR_RANGE, "tk_detokenize: id %d at %zu is outside the vocabulary (0..%d)",
                           (int)ids[i], i, nv - 1);
    tok_stream *s;
    if ((st = tok_stream_init(t, show_special, &s))) return st;
    size_t bound = tok_stream_bound(t), cap = 0, n = 0;
    char *out = NULL;
    for (size_t i = 0; i <= n_ids; i++) {
        if (cap - n < bound + 1) { /* room for one push (or the flush) and the NUL */
            size_t c = cap ? cap : 256;
            while (c - n < bound + 1) {
                if (c > SIZE_MAX / 2) break;
                c *= 2;
            }
            char *q = c - n >= bound + 1 ? tk_realloc(out, c) : NULL;
            if (!q) {
                tk_free(out);
                tok_stream_free(s);
                return tk_fail(TK_ERR_NOMEM, "tk_detokenize: out of memory");
            }
            out = q;
            cap = c;
        }
        n += i < n_ids ? tok_stream_push(s, ids[i], out + n, cap - n - 1)
                       : tok_stream_flush(s, out + n, cap - n - 1);
    }
    tok_stream_free(s);
    out[n] = 0;
    *text = out;
    *len = n;
    return TK_OK;
}

void tk_chat_opts_default(tk_chat_opts *o) {
    memset(o, 0, sizeof *o);
    o->add_generation_prompt = true;
    o->enable_thinking = true;
}

tk_status tk_chat_tokenize(const tk_model *m, const tk_chat_message *msgs, int n_msgs,
                           const tk_chat_opts *opts, int32_t **ids, size_t *n_ids) {
    if (!ids || !n_ids) return tk_fail(TK_ERR_INVALID, "tk_chat_tokenize: NULL output");
    *ids = NULL;
    *n_ids = 0;
    const tk_tokenizer *t;
    tk_status st = vocab_of(m, "tk_chat_tokenize", &t);
    if (st) return st;
    tk_chat_opts def;
    if (!opts) {
        tk_chat_opts_default(&def);
        opts = &def;
    }
    return tok_chat_encode(t, msgs, n_msgs, opts->add_generation_prompt, opts->enable_thinking, ids, n_ids);
}

const char *tk_model_chat_format(const tk_model *m) {
    const tk_tokenizer *t = m ? model_tokenizer(m) : NULL;
    return t ? tok_chat_family(t) : NULL;
}
