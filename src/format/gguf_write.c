/* GGUF writer: metadata and tensor infos are declared first (kept in memory,
 * they are small), then gguf_w_begin writes the header and the caller streams
 * each tensor's bytes in declaration order. The layout is gguf-py's: version 3,
 * tensor offsets relative to the aligned start of the data section, each tensor
 * padded to the alignment, so llama.cpp and gguf-py read our files.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "format/gguf.h"

typedef struct wtensor {
    char *name;
    tk_dtype type;
    uint32_t n_dims;
    int64_t ne[4];   /* GGML order */
    uint64_t nbytes; /* exactly rows * row bytes */
    uint64_t offset; /* relative to the data section, multiple of alignment */
} wtensor;

struct gguf_writer {
    uint32_t alignment;
    uint8_t *meta; /* (meta_len) serialized kvs, in declaration order */
    size_t meta_len, meta_cap;
    char **keys; /* (n_kv) declared keys, for duplicate checks */
    uint64_t n_kv, keys_cap;
    wtensor *t; /* (n_t) */
    uint64_t n_t, t_cap;
    uint64_t data_bytes; /* padded size of the data section so far */
    FILE *fp;            /* open between begin and finish */
    char *path;
    uint64_t next; /* next tensor to receive data */
    uint64_t pos;  /* bytes written to fp */
    bool failed;   /* a write failed: later calls refuse */
};

static tk_status wfail_state(const gguf_writer *w) {
    if (w->fp)
        return tk_fail(TK_ERR_INVALID,
                       "gguf writer: metadata and tensor infos must be declared before gguf_w_begin");
    return TK_OK;
}

static tk_status buf_put(gguf_writer *w, const void *p, size_t n) {
    size_t need;
    if (!tk_add_size(w->meta_len, n, &need))
        return tk_fail(TK_ERR_NOMEM, "gguf writer: metadata size overflows");
    if (need > w->meta_cap) {
        size_t cap = w->meta_cap ? w->meta_cap : 4096;
        while (cap < need) {
            if (!tk_mul_size(cap, 2, &cap))
                return tk_fail(TK_ERR_NOMEM, "gguf writer: metadata size overflows");
        }
        uint8_t *q = tk_realloc(w->meta, cap);
        if (!q) return tk_fail(TK_ERR_NOMEM, "gguf writer: cannot grow metadata to %zu bytes", cap);
        w->meta = q;
        w->meta_cap = cap;
    }
    if (n) memcpy(w->meta + w->meta_len, p, n);
    w->meta_len = need;
    return TK_OK;
}

static tk_status buf_uint(gguf_writer *w, uint64_t v, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i));
    return buf_put(w, b, (size_t)n);
}

static tk_status buf_str(gguf_writer *w, const char *s, uint64_t len) {
    tk_status st = buf_uint(w, len, 8);
    return st == TK_OK ? buf_put(w, s, (size_t)len) : st;
}

/* Validate and record the key, then write it and the value type. */
static tk_status begin_kv(gguf_writer *w, const char *key, gguf_vtype type) {
    tk_status st = wfail_state(w);
    if (st != TK_OK) return st;
    if (!key || !key[0]) return tk_fail(TK_ERR_INVALID, "gguf writer: key is empty");
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key))
            return tk_fail(TK_ERR_INVALID, "gguf writer: key '%s' is declared twice", key);
    if (w->n_kv == w->keys_cap) {
        uint64_t cap = w->keys_cap ? w->keys_cap * 2 : 32;
        char **k = tk_realloc(w->keys, cap * sizeof *k);
        if (!k) return tk_fail(TK_ERR_NOMEM, "gguf writer: cannot grow the key list");
        w->keys = k;
        w->keys_cap = cap;
    }
    char *copy = tk_strdup(key);
    if (!copy) return tk_fail(TK_ERR_NOMEM, "gguf writer: cannot copy key '%s'", key);
    w->keys[w->n_kv++] = copy;
    st = buf_str(w, key, strlen(key));
    if (st == TK_OK) st = buf_uint(w, (uint64_t)type, 4);
    return st;
}

tk_status gguf_writer_init(uint32_t alignment, gguf_writer **out) {
    *out = NULL;
    if (alignment == 0) alignment = 32;
    if (alignment & (alignment - 1))
        return tk_fail(TK_ERR_INVALID, "gguf writer: alignment %u is not a power of two", alignment);
    gguf_writer *w = tk_calloc(1, sizeof *w);
    if (!w) return tk_fail(TK_ERR_NOMEM, "gguf writer: cannot allocate");
    w->alignment = alignment;
    /* Readers assume 32 when the key is absent; any other value must be stated. */
    if (alignment != 32) {
        tk_status st = gguf_w_u32(w, "general.alignment", alignment);
        if (st != TK_OK) {
            gguf_writer_free(w);
            return st;
        }
    }
    *out = w;
    return TK_OK;
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    if (w->fp) fclose(w->fp);
    for (uint64_t i = 0; i < w->n_kv; i++) tk_free(w->keys[i]);
    for (uint64_t i = 0; i < w->n_t; i++) tk_free(w->t[i].name);
    tk_free(w->keys);
    tk_free(w->t);
    tk_free(w->meta);
    tk_free(w->path);
    tk_free(w);
}

static tk_status put_scalar(gguf_writer *w, const char *key, gguf_vtype t, uint64_t bits, int n) {
    tk_status st = begin_kv(w, key, t);
    return st == TK_OK ? buf_uint(w, bits, n) : st;
}

tk_status gguf_w_u32(gguf_writer *w, const char *key, uint32_t v) {
    return put_scalar(w, key, GGUF_T_U32, v, 4);
}
tk_status gguf_w_i32(gguf_writer *w, const char *key, int32_t v) {
    return put_scalar(w, key, GGUF_T_I32, (uint32_t)v, 4);
}
tk_status gguf_w_u64(gguf_writer *w, const char *key, uint64_t v) {
    return put_scalar(w, key, GGUF_T_U64, v, 8);
}
tk_status gguf_w_f32(gguf_writer *w, const char *key, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return put_scalar(w, key, GGUF_T_F32, u, 4);
}
tk_status gguf_w_bool(gguf_writer *w, const char *key, bool v) {
    return put_scalar(w, key, GGUF_T_BOOL, v ? 1 : 0, 1);
}

tk_status gguf_w_str(gguf_writer *w, const char *key, const char *v) {
    if (!v) return tk_fail(TK_ERR_INVALID, "gguf writer: key '%s': NULL string", key ? key : "");
    tk_status st = begin_kv(w, key, GGUF_T_STRING);
    return st == TK_OK ? buf_str(w, v, strlen(v)) : st;
}

tk_status gguf_w_arr(gguf_writer *w, const char *key, gguf_vtype elem, const void *data, uint64_t n) {
    int es = gguf_vtype_size(elem);
    if (!es)
        return tk_fail(TK_ERR_INVALID, "gguf writer: key '%s': gguf_w_arr takes numeric elements, not %s",
                       key ? key : "", gguf_vtype_name(elem));
    uint64_t bytes;
    if (!tk_mul_u64(n, (uint64_t)es, &bytes) || bytes > SIZE_MAX)
        return tk_fail(TK_ERR_RANGE, "gguf writer: key '%s': array of %" PRIu64 " elements is too large",
                       key ? key : "", n);
    if (n && !data) return tk_fail(TK_ERR_INVALID, "gguf writer: key '%s': NULL array data", key ? key : "");
    if (elem == GGUF_T_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return tk_fail(TK_ERR_INVALID,
                               "gguf writer: key '%s': bool element %" PRIu64 " is not 0 or 1", key, i);
    tk_status st = begin_kv(w, key, GGUF_T_ARRAY);
    if (st == TK_OK) st = buf_uint(w, (uint64_t)elem, 4);
    if (st == TK_OK) st = buf_uint(w, n, 8);
    /* Elements are stored little-endian; so is every host we build for (x86-64). */
    if (st == TK_OK) st = buf_put(w, data, (size_t)bytes);
    return st;
}

tk_status gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *strs, const uint64_t *lens,
                         uint64_t n) {
    if (n && (!strs || !lens))
        return tk_fail(TK_ERR_INVALID, "gguf writer: key '%s': NULL string array", key ? key : "");
    for (uint64_t i = 0; i < n; i++)
        if (!strs[i] && lens[i])
            return tk_fail(TK_ERR_INVALID, "gguf writer: key '%s': string %" PRIu64 " is NULL",
                           key ? key : "", i);
    tk_status st = begin_kv(w, key, GGUF_T_ARRAY);
    if (st == TK_OK) st = buf_uint(w, GGUF_T_STRING, 4);
    if (st == TK_OK) st = buf_uint(w, n, 8);
    for (uint64_t i = 0; i < n && st == TK_OK; i++) st = buf_str(w, strs[i] ? strs[i] : "", lens[i]);
    return st;
}

tk_status gguf_w_tensor_info(gguf_writer *w, const char *name, tk_dtype type, int n_dims, const int64_t *ne) {
    tk_status st = wfail_state(w);
    if (st != TK_OK) return st;
    if (!name || !name[0]) return tk_fail(TK_ERR_INVALID, "gguf writer: tensor name is empty");
    if (strlen(name) > 256)
        return tk_fail(TK_ERR_INVALID, "gguf writer: tensor name '%.64s...' is longer than 256", name);
    if (n_dims < 1 || n_dims > 4 || !ne)
        return tk_fail(TK_ERR_INVALID, "gguf writer: tensor '%s': n_dims %d is not in 1..4", name, n_dims);
    if (!dtype_known(type))
        return tk_fail(TK_ERR_INVALID, "gguf writer: tensor '%s': type id %d is unknown", name, (int)type);
    for (uint64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return tk_fail(TK_ERR_INVALID, "gguf writer: tensor '%s' is declared twice", name);
    wtensor t = {.type = type, .n_dims = (uint32_t)n_dims, .ne = {1, 1, 1, 1}};
    int64_t n_el = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0)
            return tk_fail(TK_ERR_INVALID, "gguf writer: tensor '%s': ne[%d] = %" PRId64 " is not positive",
                           name, d, ne[d]);
        if (!tk_mul_i64(n_el, ne[d], &n_el))
            return tk_fail(TK_ERR_RANGE, "gguf writer: tensor '%s': element count overflows", name);
        t.ne[d] = ne[d];
    }
    uint64_t row = 0;
    if (!dtype_row_bytes(type, (uint64_t)ne[0], &row))
        return tk_fail(TK_ERR_INVALID,
                       "gguf writer: tensor '%s': ne[0] = %" PRId64
                       " is not a multiple of the %s block size %d",
                       name, ne[0], dtype_name(type), dtype_block_elems(type));
    uint64_t pad, end;
    if (!tk_mul_u64(row, (uint64_t)(n_el / ne[0]), &t.nbytes) ||
        !tk_add_u64(t.nbytes, w->alignment - 1, &pad) ||
        !tk_add_u64(w->data_bytes, pad - pad % w->alignment, &end))
        return tk_fail(TK_ERR_RANGE, "gguf writer: tensor '%s': byte size overflows", name);
    t.offset = w->data_bytes;
    if (w->n_t == w->t_cap) {
        uint64_t cap = w->t_cap ? w->t_cap * 2 : 64;
        wtensor *q = tk_realloc(w->t, cap * sizeof *q);
        if (!q) return tk_fail(TK_ERR_NOMEM, "gguf writer: cannot grow the tensor list");
        w->t = q;
        w->t_cap = cap;
    }
    if (!(t.name = tk_strdup(name))) return tk_fail(TK_ERR_NOMEM, "gguf writer: cannot copy tensor name");
    w->t[w->n_t++] = t;
    w->data_bytes = end;
    return TK_OK;
}

/* ---- streaming ------------------------------------------------------------------- */

static tk_status file_put(gguf_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->fp) != n) {
        w->failed = true;
        return tk_fail(TK_ERR_IO, "%s: write failed at byte %" PRIu64 ": %s", w->path, w->pos,
                       strerror(errno));
    }
    w->pos += n;
    return TK_OK;
}

static tk_status file_uint(gguf_writer *w, uint64_t v, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i));
    return file_put(w, b, (size_t)n);
}

static tk_status file_pad(gguf_writer *w) {
    static const uint8_t zeros[256];
    uint64_t r = w->pos % w->alignment, n = r ? w->alignment - r : 0;
    tk_status st = TK_OK;
    while (n && st == TK_OK) {
        size_t k = n > sizeof zeros ? sizeof zeros : (size_t)n;
        st = file_put(w, zeros, k);
        n -= k;
    }
    return st;
}

tk_status gguf_w_begin(gguf_writer *w, const char *path) {
    if (w->fp || w->failed || w->path)
        return tk_fail(TK_ERR_INVALID, "gguf writer: gguf_w_begin called twice");
    if (!path) return tk_fail(TK_ERR_INVALID, "gguf writer: NULL path");
    if (!(w->path = tk_strdup(path))) return tk_fail(TK_ERR_NOMEM, "gguf writer: cannot copy path");
    w->fp = fopen(path, "wb");
    if (!w->fp) {
        w->failed = true;
        return tk_fail(TK_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    tk_status st = file_put(w, "GGUF", 4);
    if (st == TK_OK) st = file_uint(w, 3, 4);
    if (st == TK_OK) st = file_uint(w, w->n_t, 8);
    if (st == TK_OK) st = file_uint(w, w->n_kv, 8);
    if (st == TK_OK) st = file_put(w, w->meta, w->meta_len);
    for (uint64_t i = 0; i < w->n_t && st == TK_OK; i++) {
        const wtensor *t = &w->t[i];
        st = file_uint(w, strlen(t->name), 8);
        if (st == TK_OK) st = file_put(w, t->name, strlen(t->name));
        if (st == TK_OK) st = file_uint(w, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims && st == TK_OK; d++) st = file_uint(w, (uint64_t)t->ne[d], 8);
        if (st == TK_OK) st = file_uint(w, (uint64_t)t->type, 4);
        if (st == TK_OK) st = file_uint(w, t->offset, 8);
    }
    if (st == TK_OK) st = file_pad(w);
    return st;
}

tk_status gguf_w_tensor_data(gguf_writer *w, const void *data, uint64_t nbytes) {
    if (!w->fp || w->failed)
        return tk_fail(TK_ERR_INVALID, "gguf writer: tensor data before gguf_w_begin or after a failure");
    if (w->next >= w->n_t)
        return tk_fail(TK_ERR_INVALID, "gguf writer: more tensor data than the %" PRIu64 " declared tensors",
                       w->n_t);
    const wtensor *t = &w->t[w->next];
    if (nbytes != t->nbytes)
        return tk_fail(TK_ERR_INVALID, "gguf writer: tensor '%s': got %" PRIu64 " bytes, expected %" PRIu64,
                       t->name, nbytes, t->nbytes);
    if (nbytes > SIZE_MAX || (nbytes && !data))
        return tk_fail(TK_ERR_INVALID, "gguf writer: tensor '%s': bad data", t->name);
    tk_status st = file_put(w, data, (size_t)nbytes);
    if (st == TK_OK) st = file_pad(w);
    if (st == TK_OK) w->next++;
    return st;
}

tk_status gguf_w_finish(gguf_writer *w) {
    if (!w->fp || w->failed)
        return tk_fail(TK_ERR_INVALID, "gguf writer: finish before gguf_w_begin or after a failure");
    if (w->next != w->n_t)
        return tk_fail(TK_ERR_INVALID,
                       "gguf writer: %" PRIu64 " of %" PRIu64 " tensors written before finish", w->next,
                       w->n_t);
    FILE *fp = w->fp;
    w->fp = NULL;
    if (fclose(fp) != 0) {
        w->failed = true;
        return tk_fail(TK_ERR_IO, "%s: close failed: %s", w->path, strerror(errno));
    }
    return TK_OK;
}
