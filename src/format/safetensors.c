/* safetensors reader and writer (see safetensors.h for what is validated).
 *
 * The cJSON tree of the header stays alive while the file is open: tensor names
 * and metadata strings point into it, so nothing is copied twice.
 */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "format/fmap.h"

struct st_file {
    char *path;          /* "" for memory */
    tk_fmap map;         /* owned mapping (st_open); zero for st_open_mem */
    const uint8_t *base; /* (size) bytes */
    uint64_t size;
    uint64_t data_start; /* 8 + header length */
    cJSON *root;         /* the parsed header */
    int64_t n_tensors;
    tk_tensor *tensors; /* (n_tensors) header order; names point into root */
    uint64_t *begin;    /* (n_tensors) data_offsets[0] of each */
    int64_t *by_name;   /* (n_tensors) indices sorted by name, for lookups */
    int64_t n_meta;
    const cJSON **meta; /* (n_meta) the "__metadata__" entries */
};

const char *st_dtype_name(tk_dtype t) {
    switch (t) {
    case TK_DTYPE_F32:
        return "F32";
    case TK_DTYPE_F16:
        return "F16";
    case TK_DTYPE_BF16:
        return "BF16";
    default:
        return NULL;
    }
}

/* JSON numbers are doubles: accept exact non-negative integers below 2^53. */
static bool json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0) || d >= 9007199254740992.0 || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

static tk_status parse_entry(st_file *f, const cJSON *e, int64_t i) {
    const char *name = e->string;
    tk_tensor *t = &f->tensors[i];
    t->name = name;
    if (!cJSON_IsObject(e))
        return tk_fail(TK_ERR_FORMAT, "safetensors: tensor '%s': entry is not an object", name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!dt) return tk_fail(TK_ERR_FORMAT, "safetensors: tensor '%s': dtype is missing", name);
    if (!shape) return tk_fail(TK_ERR_FORMAT, "safetensors: tensor '%s': shape is missing", name);
    if (!offs) return tk_fail(TK_ERR_FORMAT, "safetensors: tensor '%s': data_offsets is missing", name);
    if (!cJSON_IsString(dt))
        return tk_fail(TK_ERR_FORMAT, "safetensors: tensor '%s': dtype is not a string", name);
    int esize;
    if (!strcmp(dt->valuestring, "F32"))
        t->type = TK_DTYPE_F32, esize = 4;
    else if (!strcmp(dt->valuestring, "F16"))
        t->type = TK_DTYPE_F16, esize = 2;
    else if (!strcmp(dt->valuestring, "BF16"))
        t->type = TK_DTYPE_BF16, esize = 2;
    else
        return tk_fail(TK_ERR_UNSUPPORTED,
                       "safetensors: tensor '%s': dtype %.32s is not supported (F32, F16, BF16)", name,
                       dt->valuestring);
    if (!cJSON_IsArray(shape))
        return tk_fail(TK_ERR_FORMAT, "safetensors: tensor '%s': shape is not an array", name);
    int nd = cJSON_GetArraySize(shape);
    if (nd > 4)
        return tk_fail(TK_ERR_UNSUPPORTED, "safetensors: tensor '%s': shape has %d dims, more than 4", name,
                       nd);
    uint64_t dims[4], n_el = 1;
    int k = 0;
    for (const cJSON *d = shape->child; d; d = d->next, k++) {
        if (!json_uint(d, &dims[k]) || dims[k] > INT64_MAX)
            return tk_fail(TK_ERR_FORMAT, "safetensors: tensor '%s': shape[%d] is not a non-negative integer",
                           name, k);
        if (!tk_mul_u64(n_el, dims[k], &n_el))
            return tk_fail(TK_ERR_FORMAT, "safetensors: tensor '%s': shape product overflows", name);
    }
    t->n_dims = nd ? nd : 1;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (int d = 0; d < nd; d++) t->ne[d] = (int64_t)dims[nd - 1 - d]; /* GGML order */
    uint64_t b = 0, en = 0;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_uint(offs->child, &b) ||
        !json_uint(offs->child->next, &en))
        return tk_fail(TK_ERR_FORMAT,
                       "safetensors: tensor '%s': data_offsets is not a pair of non-negative integers", name);
    if (en < b)
        return tk_fail(TK_ERR_FORMAT,
                       "safetensors: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 ") end before begin",
                       name, b, en);
    if (!tk_mul_u64(n_el, (uint64_t)esize, &t->nbytes) || t->nbytes != en - b)
        return tk_fail(TK_ERR_FORMAT,
                       "safetensors: tensor '%s': shape x %s size is %" PRIu64
                       " elements but data_offsets [%" PRIu64 ", %" PRIu64 ") hold %" PRIu64 " bytes",
                       name, dt->valuestring, n_el, b, en, en - b);
    uint64_t data_bytes = f->size - f->data_start;
    if (en > data_bytes)
        return tk_fail(TK_ERR_FORMAT,
                       "safetensors: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       ") are outside the %" PRIu64 "-byte data section",
                       name, b, en, data_bytes);
    f->begin[i] = b;
    t->data = f->base + f->data_start + b;
    return TK_OK;
}

/* qsort without a context pointer: sort (key, index) pairs. */
typedef struct by_off {
    uint64_t b, e;
    int64_t i;
} by_off;
static int by_off_cmp(const void *x, const void *y) {
    const by_off *a = x, *b = y;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    return a->e < b->e ? -1 : a->e > b->e;
}

typedef struct by_nm {
    const char *name;
    int64_t i;
} by_nm;
static int by_nm_cmp(const void *x, const void *y) {
    return strcmp(((const by_nm *)x)->name, ((const by_nm *)y)->name);
}

/* Sorted by begin, the ranges must tile [0, data_bytes) exactly (as the HF library checks). */
static tk_status check_layout(st_file *f) {
    int64_t n = f->n_tensors;
    uint64_t data_bytes = f->size - f->data_start, end = 0;
    if (n == 0) {
        if (data_bytes == 0) return TK_OK;
        return tk_fail(TK_ERR_FORMAT,
                       "safetensors: data_offsets end at 0 but the data section has %" PRIu64 " bytes",
                       data_bytes);
    }
    by_off *o = n ? tk_calloc((size_t)n, sizeof *o) : NULL;
    by_nm *m = n ? tk_calloc((size_t)n, sizeof *m) : NULL;
    f->by_name = n ? tk_calloc((size_t)n, sizeof *f->by_name) : NULL;
    if (n && (!o || !m || !f->by_name)) {
        tk_free(o);
        tk_free(m);
        return tk_fail(TK_ERR_NOMEM, "safetensors: cannot allocate the layout check");
    }
    for (int64_t i = 0; i < n; i++) {
        o[i] = (by_off){f->begin[i], f->begin[i] + f->tensors[i].nbytes, i};
        m[i] = (by_nm){f->tensors[i].name, i};
    }
    tk_status st = TK_OK;
    /* names first: a duplicated entry would otherwise be reported as an overlap */
    qsort(m, (size_t)n, sizeof *m, by_nm_cmp);
    for (int64_t k = 0; k < n; k++) {
        f->by_name[k] = m[k].i;
        if (k && !strcmp(m[k].name, m[k - 1].name) && st == TK_OK)
            st = tk_fail(TK_ERR_FORMAT, "safetensors: tensor name '%s' is duplicated", m[k].name);
    }
    qsort(o, (size_t)n, sizeof *o, by_off_cmp);
    const char *prev = NULL;
    for (int64_t k = 0; k < n && st == TK_OK; k++) {
        const char *name = f->tensors[o[k].i].name;
        if (o[k].b > end)
            st = tk_fail(TK_ERR_FORMAT,
                         "safetensors: tensor '%s': data_offsets begin at %" PRIu64
                         ", leaving a gap after %s%s%s (ends at %" PRIu64 ")",
                         name, o[k].b, prev ? "'" : "", prev ? prev : "the start", prev ? "'" : "", end);
        else if (o[k].b < end)
            st = tk_fail(TK_ERR_FORMAT,
                         "safetensors: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                         ") overlap '%s' (ends at %" PRIu64 ")",
                         name, o[k].b, o[k].e, prev, end);
        end = o[k].e;
        prev = name;
    }
    if (st == TK_OK && end != data_bytes)
        st =
            tk_fail(TK_ERR_FORMAT,
                    "safetensors: data_offsets end at %" PRIu64 " but the data section has %" PRIu64 " bytes",
                    end, data_bytes);
    tk_free(o);
    tk_free(m);
    return st;
}

static tk_status parse_meta(st_file *f, const cJSON *md) {
    if (!cJSON_IsObject(md)) return tk_fail(TK_ERR_FORMAT, "safetensors: __metadata__ is not an object");
    int n = cJSON_GetArraySize(md);
    if (n == 0) return TK_OK;
    f->meta = tk_calloc((size_t)n, sizeof *f->meta);
    if (!f->meta) return tk_fail(TK_ERR_NOMEM, "safetensors: cannot allocate metadata");
    for (const cJSON *e = md->child; e; e = e->next) {
        if (!cJSON_IsString(e))
            return tk_fail(TK_ERR_FORMAT, "safetensors: __metadata__ '%s' is not a string", e->string);
        f->meta[f->n_meta++] = e;
    }
    return TK_OK;
}

static tk_status parse(st_file *f) {
    if (f->size < 8)
        return tk_fail(TK_ERR_FORMAT,
                       "safetensors: file is %" PRIu64 " bytes, shorter than the 8-byte header length",
                       f->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->base[i];
    if (n > ST_MAX_HEADER)
        return tk_fail(TK_ERR_FORMAT, "safetensors: header length %" PRIu64 " exceeds the %u-byte limit", n,
                       ST_MAX_HEADER);
    if (n > f->size - 8)
        return tk_fail(TK_ERR_FORMAT,
                       "safetensors: header length %" PRIu64 " is past the end of the file (%" PRIu64
                       " bytes)",
                       n, f->size);
    f->data_start = 8 + n;
    const char *json = (const char *)f->base + 8, *end = NULL;
    f->root = cJSON_ParseWithLengthOpts(json, (size_t)n, &end, false);
    if (!f->root) {
        uint64_t at = end && end >= json ? (uint64_t)(end - json) : 0;
        return tk_fail(TK_ERR_FORMAT,
                       "safetensors: header is not valid JSON (or nested too deeply) near byte %" PRIu64, at);
    }
    for (const char *p = end; p < json + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            return tk_fail(TK_ERR_FORMAT,
                           "safetensors: header has trailing bytes after the JSON at byte %" PRIu64,
                           (uint64_t)(p - json));
    if (!cJSON_IsObject(f->root))
        return tk_fail(TK_ERR_FORMAT, "safetensors: header is JSON but not an object");
    int64_t cnt = 0;
    for (const cJSON *e = f->root->child; e; e = e->next) cnt += strcmp(e->string, "__metadata__") != 0;
    if (cnt) {
        f->tensors = tk_calloc((size_t)cnt, sizeof *f->tensors);
        f->begin = tk_calloc((size_t)cnt, sizeof *f->begin);
        if (!f->tensors || !f->begin)
            return tk_fail(TK_ERR_NOMEM, "safetensors: cannot allocate %" PRId64 " tensors", cnt);
    }
    bool seen_meta = false;
    tk_status st = TK_OK;
    for (const cJSON *e = f->root->child; e && st == TK_OK; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (seen_meta) return tk_fail(TK_ERR_FORMAT, "safetensors: __metadata__ is duplicated");
            seen_meta = true;
            st = parse_meta(f, e);
        } else {
            st = parse_entry(f, e, f->n_tensors);
            f->n_tensors++;
        }
    }
    return st == TK_OK ? check_layout(f) : st;
}

static tk_status open_common(st_file *f, st_file **out) {
    tk_status st = parse(f);
    if (st != TK_OK) {
        if (f->path[0]) tk_error_prefix("%s", f->path);
        st_close(f);
        return st;
    }
    *out = f;
    return TK_OK;
}

static st_file *st_alloc(const char *path) {
    st_file *f = tk_calloc(1, sizeof *f);
    if (f) f->path = tk_strdup(path);
    if (f && !f->path) {
        tk_free(f);
        f = NULL;
    }
    return f;
}

tk_status st_open_mem(const void *data, size_t size, st_file **out) {
    *out = NULL;
    if (!data && size) return tk_fail(TK_ERR_INVALID, "safetensors: NULL buffer of %zu bytes", size);
    st_file *f = st_alloc("");
    if (!f) return tk_fail(TK_ERR_NOMEM, "safetensors: cannot allocate a file object");
    f->base = data;
    f->size = size;
    return open_common(f, out);
}

tk_status st_open(const char *path, st_file **out) {
    *out = NULL;
    if (!path) return tk_fail(TK_ERR_INVALID, "safetensors: NULL path");
    st_file *f = st_alloc(path);
    if (!f) return tk_fail(TK_ERR_NOMEM, "safetensors: cannot allocate a file object");
    tk_status st = fmap_open(path, &f->map);
    if (st != TK_OK) {
        st_close(f);
        return st;
    }
    f->base = f->map.data;
    f->size = f->map.size;
    return open_common(f, out);
}

void st_close(st_file *f) {
    if (!f) return;
    cJSON_Delete(f->root);
    tk_free(f->tensors);
    tk_free(f->begin);
    tk_free(f->by_name);
    tk_free(f->meta);
    fmap_close(&f->map);
    tk_free(f->path);
    tk_free(f);
}

const char *st_path(const st_file *f) { return f->path; }
uint64_t st_data_bytes(const st_file *f) { return f->size - f->data_start; }
int64_t st_n_tensors(const st_file *f) { return f->n_tensors; }
const tk_tensor *st_tensor_at(const st_file *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const tk_tensor *st_find_tensor(const st_file *f, const char *name) {
    if (!name) return NULL;
    int64_t lo = 0, hi = f->n_tensors; /* binary search over the name order */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[f->by_name[mid]].name, name);
        if (c == 0) return &f->tensors[f->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int64_t st_n_meta(const st_file *f) { return f->n_meta; }

tk_status st_meta_at(const st_file *f, int64_t i, const char **key, const char **value) {
    if (i < 0 || i >= f->n_meta)
        return tk_fail(TK_ERR_RANGE,
                       "safetensors: metadata index %" PRId64 " is past the %" PRId64 " entries", i,
                       f->n_meta);
    *key = f->meta[i]->string;
    *value = f->meta[i]->valuestring;
    return TK_OK;
}

const char *st_meta_find(const st_file *f, const char *key) {
    if (!key) return NULL;
    for (int64_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[i]->string, key)) return f->meta[i]->valuestring;
    return NULL;
}

/* ---- writer ------------------------------------------------------------------------- */

static tk_status write_bytes(FILE *fp, const void *p, size_t n, const char *path) {
    if (n && fwrite(p, 1, n, fp) != n)
        return tk_fail(TK_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return TK_OK;
}

static tk_status build_header(const tk_tensor *ts, int64_t n, const char *const *meta, char **out) {
    *out = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root) return tk_fail(TK_ERR_NOMEM, "safetensors writer: out of memory");
    tk_status st = TK_OK;
    if (meta && meta[0]) {
        cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
        for (int k = 0; st == TK_OK && md && meta[k]; k += 2) {
            if (!meta[k + 1])
                st = tk_fail(TK_ERR_INVALID, "safetensors writer: metadata key '%s' has no value", meta[k]);
            else if (cJSON_GetObjectItemCaseSensitive(md, meta[k]))
                st = tk_fail(TK_ERR_INVALID, "safetensors writer: metadata key '%s' is given twice", meta[k]);
            else if (!cJSON_AddStringToObject(md, meta[k], meta[k + 1]))
                md = NULL;
        }
        if (!md && st == TK_OK) st = tk_fail(TK_ERR_NOMEM, "safetensors writer: out of memory");
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < n && st == TK_OK; i++) {
        const tk_tensor *t = &ts[i];
        const char *dn = st_dtype_name(t->type);
        uint64_t want = t->type == TK_DTYPE_F32 ? 4 : 2;
        if (!t->name || !t->name[0] || !strcmp(t->name, "__metadata__")) {
            st = tk_fail(TK_ERR_INVALID,
                         "safetensors writer: tensor %" PRId64 " has an empty or reserved name", i);
            break;
        }
        if (!dn) {
            st = tk_fail(TK_ERR_INVALID, "safetensors writer: tensor '%s': type %s is not F32, F16 or BF16",
                         t->name, dtype_name(t->type));
            break;
        }
        if (t->n_dims < 1 || t->n_dims > 4) {
            st = tk_fail(TK_ERR_INVALID, "safetensors writer: tensor '%s': n_dims %d is not in 1..4", t->name,
                         t->n_dims);
            break;
        }
        if (cJSON_GetObjectItemCaseSensitive(root, t->name)) {
            st = tk_fail(TK_ERR_INVALID, "safetensors writer: tensor '%s' is given twice", t->name);
            break;
        }
        double shape[4];
        for (int d = 0; d < t->n_dims && st == TK_OK; d++) {
            if (t->ne[d] < 0 || !tk_mul_u64(want, (uint64_t)t->ne[d], &want))
                st = tk_fail(TK_ERR_INVALID,
                             "safetensors writer: tensor '%s': ne[%d] = %" PRId64 " is invalid", t->name, d,
                             t->ne[d]);
            shape[t->n_dims - 1 - d] = (double)t->ne[d];
        }
        if (st != TK_OK) break;
        if (want != t->nbytes || (want && !t->data)) {
            st = tk_fail(TK_ERR_INVALID,
                         "safetensors writer: tensor '%s': nbytes %" PRIu64 " but the shape needs %" PRIu64,
                         t->name, t->nbytes, want);
            break;
        }
        double range[2] = {(double)off, (double)(off + want)};
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON *sh = cJSON_CreateDoubleArray(shape, t->n_dims), *ro = cJSON_CreateDoubleArray(range, 2);
        if (!e || !sh || !ro || !cJSON_AddStringToObject(e, "dtype", dn)) {
            cJSON_Delete(sh);
            cJSON_Delete(ro);
            st = tk_fail(TK_ERR_NOMEM, "safetensors writer: out of memory");
            break;
        }
        cJSON_AddItemToObject(e, "shape", sh);
        cJSON_AddItemToObject(e, "data_offsets", ro);
        off += want;
    }
    if (st == TK_OK) {
        *out = cJSON_PrintUnformatted(root);
        if (!*out) st = tk_fail(TK_ERR_NOMEM, "safetensors writer: out of memory");
    }
    cJSON_Delete(root);
    return st;
}

tk_status st_write(const char *path, const tk_tensor *tensors, int64_t n, const char *const *meta) {
    if (!path || n < 0 || (n && !tensors))
        return tk_fail(TK_ERR_INVALID, "safetensors writer: bad arguments");
    char *json;
    tk_status st = build_header(tensors, n, meta, &json);
    if (st != TK_OK) return st;
    size_t len = strlen(json), padded = (len + 7) / 8 * 8; /* data section starts 8-aligned */
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        cJSON_free(json);
        return tk_fail(TK_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    st = write_bytes(fp, len8, 8, path);
    if (st == TK_OK) st = write_bytes(fp, json, len, path);
    for (size_t i = len; i < padded && st == TK_OK; i++) st = write_bytes(fp, " ", 1, path);
    cJSON_free(json);
    /* little-endian data as stored in memory: every host tokamak targets is */
    for (int64_t i = 0; i < n && st == TK_OK; i++)
        st = write_bytes(fp, tensors[i].data, (size_t)tensors[i].nbytes, path);
    if (fclose(fp) != 0 && st == TK_OK)
        st = tk_fail(TK_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    return st;
}
