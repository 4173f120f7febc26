/* Hugging Face checkpoint directories (see hf.h). */
#include "hf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/error.h"
#include "format/fmap.h"
#include "format/safetensors.h"

struct hf_ckpt {
    char *dir;
    char *config_text; /* (config_len + 1) raw config.json */
    size_t config_len;
    cJSON *config; /* parsed config.json (an object) */
    int n_shards;
    char **shard_names; /* (n_shards) */
    st_file **shards;   /* (n_shards) */
    int64_t n_tensors;
    const tk_tensor **tensors; /* (n_tensors) sorted by name; owned by the shards */
};

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = tk_malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* A shard is a plain file of the directory: one path component, which is
 * neither "." nor "..", so no name reaches outside it ("a..b" is fine). */
static tk_status check_shard_name(const char *index, const char *name, const char *tensor) {
    if (!name[0])
        return tk_fail(TK_ERR_FORMAT, "%s: weight_map: tensor '%s': shard name is empty", index, tensor);
    if (strchr(name, '/') || strchr(name, '\\') || !strcmp(name, ".") || !strcmp(name, ".."))
        return tk_fail(TK_ERR_FORMAT,
                       "%s: weight_map: tensor '%s': shard name '%.200s' is not a plain file name", index,
                       tensor, name);
    return TK_OK;
}

static tk_status read_json(const char *path, char **text, size_t *len, cJSON **root) {
    *root = NULL;
    tk_status st = fmap_read_all(path, HF_MAX_JSON, text, len);
    if (st != TK_OK) return st;
    *root = cJSON_ParseWithLength(*text, *len);
    if (!*root) return tk_fail(TK_ERR_FORMAT, "%s: not valid JSON (or nested too deeply)", path);
    if (!cJSON_IsObject(*root)) return tk_fail(TK_ERR_FORMAT, "%s: JSON is not an object", path);
    return TK_OK;
}

static tk_status add_shard(hf_ckpt *h, const char *name, int *idx) {
    for (int i = 0; i < h->n_shards; i++)
        if (!strcmp(h->shard_names[i], name)) {
            *idx = i;
            return TK_OK;
        }
    size_t n = (size_t)h->n_shards + 1;
    char **nn = tk_realloc(h->shard_names, n * sizeof *nn);
    if (nn) h->shard_names = nn;
    st_file **ns = nn ? tk_realloc(h->shards, n * sizeof *ns) : NULL;
    if (ns) h->shards = ns;
    char *copy = ns ? tk_strdup(name) : NULL;
    if (!copy) return tk_fail(TK_ERR_NOMEM, "hf: out of memory for shard names");
    h->shard_names[h->n_shards] = copy;
    h->shards[h->n_shards] = NULL;
    *idx = h->n_shards++;
    return TK_OK;
}

static tk_status open_shards(hf_ckpt *h) {
    for (int i = 0; i < h->n_shards; i++) {
        char *p = path_join(h->dir, h->shard_names[i]);
        if (!p) return tk_fail(TK_ERR_NOMEM, "hf: out of memory");
        tk_status st = st_open(p, &h->shards[i]);
        tk_free(p);
        if (st != TK_OK) return st; /* st_open's message names the path */
    }
    return TK_OK;
}

static tk_status read_index(hf_ckpt *h, const char *path) {
    char *text = NULL;
    size_t len;
    cJSON *root;
    tk_status st = read_json(path, &text, &len, &root);
    tk_free(text);
    const cJSON *wm = st == TK_OK ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (st == TK_OK && !cJSON_IsObject(wm))
        st = tk_fail(TK_ERR_FORMAT, "%s: weight_map is missing or not an object", path);
    int *which = NULL; /* (entries) shard of each weight_map entry */
    int n = wm ? cJSON_GetArraySize(wm) : 0, k = 0;
    if (st == TK_OK && n == 0) st = tk_fail(TK_ERR_FORMAT, "%s: weight_map is empty", path);
    if (st == TK_OK && !(which = tk_calloc((size_t)n, sizeof *which)))
        st = tk_fail(TK_ERR_NOMEM, "hf: out of memory");
    for (const cJSON *e = wm ? wm->child : NULL; e && st == TK_OK; e = e->next, k++) {
        if (!cJSON_IsString(e))
            st =
                tk_fail(TK_ERR_FORMAT, "%s: weight_map: tensor '%s': shard is not a string", path, e->string);
        else if ((st = check_shard_name(path, e->valuestring, e->string)) == TK_OK)
            st = add_shard(h, e->valuestring, &which[k]);
    }
    if (st == TK_OK) st = open_shards(h);
    k = 0;
    for (const cJSON *e = wm ? wm->child : NULL; e && st == TK_OK; e = e->next, k++)
        if (!st_find_tensor(h->shards[which[k]], e->string))
            st = tk_fail(TK_ERR_FORMAT, "%s: tensor '%s' is listed in the index but missing from shard '%s'",
                         path, e->string, h->shard_names[which[k]]);
    tk_free(which);
    cJSON_Delete(root);
    return st;
}

static int tensor_cmp(const void *a, const void *b) {
    return strcmp((*(const tk_tensor *const *)a)->name, (*(const tk_tensor *const *)b)->name);
}

static tk_status collect_tensors(hf_ckpt *h) {
    int64_t n = 0;
    for (int i = 0; i < h->n_shards; i++) n += st_n_tensors(h->shards[i]);
    if (n == 0) return tk_fail(TK_ERR_FORMAT, "%s: the checkpoint has no tensors", h->dir);
    h->tensors = tk_calloc((size_t)n, sizeof *h->tensors);
    if (!h->tensors) return tk_fail(TK_ERR_NOMEM, "hf: out of memory for %" PRId64 " tensors", n);
    for (int i = 0; i < h->n_shards; i++)
        for (int64_t j = 0; j < st_n_tensors(h->shards[i]); j++)
            h->tensors[h->n_tensors++] = st_tensor_at(h->shards[i], j);
    qsort(h->tensors, (size_t)n, sizeof *h->tensors, tensor_cmp);
    for (int64_t i = 1; i < n; i++)
        if (!strcmp(h->tensors[i]->name, h->tensors[i - 1]->name))
            return tk_fail(TK_ERR_FORMAT, "%s: tensor '%s' appears in more than one shard", h->dir,
                           h->tensors[i]->name);
    return TK_OK;
}

static tk_status hf_load(hf_ckpt *h) {
    char *p = path_join(h->dir, "config.json");
    if (!p) return tk_fail(TK_ERR_NOMEM, "hf: out of memory");
    tk_status st = read_json(p, &h->config_text, &h->config_len, &h->config);
    tk_free(p);
    if (st != TK_OK) return st;
    char *idx = path_join(h->dir, "model.safetensors.index.json");
    char *single = path_join(h->dir, "model.safetensors");
    int dummy;
    if (!idx || !single)
        st = tk_fail(TK_ERR_NOMEM, "hf: out of memory");
    else if (file_exists(idx))
        st = read_index(h, idx);
    else if (file_exists(single)) {
        st = add_shard(h, "model.safetensors", &dummy);
        if (st == TK_OK) st = open_shards(h);
    } else
        st = tk_fail(TK_ERR_IO, "%s has neither model.safetensors nor model.safetensors.index.json", h->dir);
    tk_free(idx);
    tk_free(single);
    return st == TK_OK ? collect_tensors(h) : st;
}

tk_status hf_open(const char *dir, hf_ckpt **out) {
    *out = NULL;
    if (!dir) return tk_fail(TK_ERR_INVALID, "hf: NULL directory");
    hf_ckpt *h = tk_calloc(1, sizeof *h);
    if (h) h->dir = tk_strdup(dir);
    if (!h || !h->dir) {
        tk_free(h);
        return tk_fail(TK_ERR_NOMEM, "hf: out of memory");
    }
    tk_status st = hf_load(h);
    if (st != TK_OK) {
        hf_close(h);
        return st;
    }
    *out = h;
    return TK_OK;
}

void hf_close(hf_ckpt *h) {
    if (!h) return;
    for (int i = 0; i < h->n_shards; i++) {
        st_close(h->shards[i]);
        tk_free(h->shard_names[i]);
    }
    tk_free(h->shards);
    tk_free(h->shard_names);
    tk_free(h->tensors);
    cJSON_Delete(h->config);
    tk_free(h->config_text);
    tk_free(h->dir);
    tk_free(h);
}

const char *hf_dir(const hf_ckpt *h) { return h->dir; }
const struct cJSON *hf_config(const hf_ckpt *h) { return h->config; }
const char *hf_config_json(const hf_ckpt *h, size_t *len) {
    if (len) *len = h->config_len;
    return h->config_text;
}
int64_t hf_n_tensors(const hf_ckpt *h) { return h->n_tensors; }
const tk_tensor *hf_tensor_at(const hf_ckpt *h, int64_t i) {
    return i >= 0 && i < h->n_tensors ? h->tensors[i] : NULL;
}
int hf_n_shards(const hf_ckpt *h) { return h->n_shards; }
const char *hf_shard_name(const hf_ckpt *h, int i) {
    return i >= 0 && i < h->n_shards ? h->shard_names[i] : NULL;
}

const tk_tensor *hf_find_tensor(const hf_ckpt *h, const char *name) {
    if (!name) return NULL;
    int64_t lo = 0, hi = h->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(h->tensors[mid]->name, name);
        if (c == 0) return h->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}
