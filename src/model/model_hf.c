/* Hugging Face checkpoint directories: config.json for the hyper-parameters,
 * safetensors shards for the weights (views into their mappings), and
 * tokenizer.json when present. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/error.h"
#include "format/hf.h"
#include "model/model_internal.h"

static const tk_tensor *hf_source_find(void *ctx, const char *name) { return hf_find_tensor(ctx, name); }
static void hf_source_close(void *h) { hf_close(h); }

/* The directory's last component ("models/qwen3-hf/" -> "qwen3-hf"). */
static char *dir_name(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t s = n;
    while (s > 0 && dir[s - 1] != '/') s--;
    return tk_strndup(dir + s, n - s);
}

/* Every message names the directory (or a file in it) once: hf_open and
 * tok_load_hf name what they fail on, the other steps are prefixed with dir. */
tk_status model_open_hf(const char *dir, const tk_model_opts *o, tk_model **out) {
    *out = NULL;
    hf_ckpt *h;
    tk_status st = hf_open(dir, &h);
    if (st) return st;
    size_t len = 0;
    const char *json = hf_config_json(h, &len);
    tk_hparams hp;
    if ((st = arch_hparams_hf_json(json, len, &hp))) {
        hf_close(h);
        tk_error_prefix("%s", dir);
        return st;
    }
    model_source src = {TK_NAMING_HF, hf_source_find, h};
    tk_model *m;
    if ((st = model_create(&hp, &src, o, &m))) {
        hf_close(h);
        tk_error_prefix("%s", dir);
        return st;
    }
    m->src_handle = h;
    m->src_close = hf_source_close;
    if (!(m->name = dir_name(dir))) {
        tk_model_free(m);
        return tk_fail(TK_ERR_NOMEM, "model: out of memory");
    }
    char path[4096];
    struct stat sb;
    int w = snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (w > 0 && (size_t)w < sizeof path && stat(path, &sb) == 0) {
        if ((st = tok_load_hf(dir, &m->tok))) {
            tk_model_free(m);
            return st;
        }
        if (tok_n_vocab(m->tok) > hp.n_vocab) {
            int nv = tok_n_vocab(m->tok);
            tk_model_free(m);
            return tk_fail(TK_ERR_FORMAT, "%s: model: tokenizer has %d tokens but vocab_size is %d", dir, nv,
                           hp.n_vocab);
        }
    }
    *out = m;
    return TK_OK;
}
