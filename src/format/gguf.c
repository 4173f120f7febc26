/* GGUF reader: one pass over the mapping with a bounds-checked cursor.
 *
 * Every count and length is checked against the bytes left before it is used,
 * so a hostile file can make us allocate at most a small multiple of its own
 * size and never read past the mapping. The writer lives in gguf_write.c.
 */
#include "gguf.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "format/fmap.h"

#define GGUF_HEADER_BYTES  24  /* magic, version, n_tensors, n_kv */
#define GGUF_MIN_KV_BYTES  14  /* key len 8 + key 1 + type 4 + smallest value 1 */
#define GGUF_MIN_TI_BYTES  33  /* name len 8 + name 1 + n_dims 4 + ne 8 + type 4 + offset 8 */
#define GGUF_MAX_NAME      256 /* tensor name bytes (llama.cpp uses 64; leave room) */
#define GGUF_MAX_ARR_DEPTH 8   /* arrays of arrays: bounded so the parser's recursion is */
#define GGUF_DEFAULT_ALIGN 32

/* Open addressing over indices (+1; 0 = empty), for duplicate checks and O(1) lookups. */
typedef struct name_index {
    uint32_t *slots; /* (cap) */
    uint64_t cap;    /* power of two, >= 2 * entries */
} name_index;

struct gguf_file {
    char *path;          /* "" for memory */
    tk_fmap map;         /* owned mapping (gguf_open); zero for gguf_open_mem */
    const uint8_t *base; /* (size) bytes */
    uint64_t size;
    uint32_t version, alignment;
    int64_t n_kv;
    gguf_kv *kvs; /* (n_kv) */
    int64_t n_tensors;
    tk_tensor *tensors;  /* (n_tensors); names are owned copies */
    uint64_t *offsets;   /* (n_tensors) offset of each tensor relative to data_start */
    uint64_t data_start; /* aligned start of the tensor data section */
    name_index kv_idx, t_idx;
};

/* ---- cursor ------------------------------------------------------------------- */

typedef struct rd {
    const uint8_t *base;
    uint64_t pos, size;
} rd;

static uint64_t rd_left(const rd *r) { return r->size - r->pos; }

/* Little-endian by bytes, so the reader does not depend on the host's order. */
static uint64_t le_load(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static bool rd_uint(rd *r, int n, uint64_t *v) {
    if (rd_left(r) < (uint64_t)n) return false;
    *v = le_load(r->base + r->pos, n);
    r->pos += (uint64_t)n;
    return true;
}

static tk_status eof_fail(const rd *r, const char *what) {
    return tk_fail(TK_ERR_FORMAT,
                   "gguf: %s at offset %" PRIu64 " runs past the end of the file (%" PRIu64 " bytes)", what,
                   r->pos, r->size);
}

static tk_status rd_u32(rd *r, uint32_t *v, const char *what) {
    uint64_t x = 0;
    if (!rd_uint(r, 4, &x)) return eof_fail(r, what);
    *v = (uint32_t)x;
    return TK_OK;
}

static tk_status rd_u64(rd *r, uint64_t *v, const char *what) {
    if (!rd_uint(r, 8, v)) return eof_fail(r, what);
    return TK_OK;
}

/* A length-prefixed string; the bytes stay in the mapping. */
static tk_status rd_str(rd *r, gguf_str *s, const char *what) {
    uint64_t len = 0;
    if (!rd_uint(r, 8, &len)) return eof_fail(r, what);
    if (len > rd_left(r))
        return tk_fail(TK_ERR_FORMAT,
                       "gguf: %s length %" PRIu64 " at offset %" PRIu64
                       " is past the end of the file (%" PRIu64 " bytes left)",
                       what, len, r->pos - 8, rd_left(r));
    s->ptr = (const char *)r->base + r->pos;
    s->len = len;
    r->pos += len;
    return TK_OK;
}

/* ---- name index ------------------------------------------------------------------ */

static uint64_t hash_bytes(const char *p, uint64_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

static tk_status index_init(name_index *ix, uint64_t n) {
    ix->cap = 16;
    while (ix->cap < 2 * n) ix->cap *= 2; /* n is bounded by the file size, so no overflow */
    ix->slots = tk_calloc(ix->cap, sizeof *ix->slots);
    if (!ix->slots)
        return tk_fail(TK_ERR_NOMEM, "gguf: cannot allocate a name index of %" PRIu64 " slots", ix->cap);
    return TK_OK;
}

typedef gguf_str (*name_of_fn)(const gguf_file *f, uint32_t i);

static gguf_str kv_name(const gguf_file *f, uint32_t i) { return f->kvs[i].key; }
static gguf_str t_name(const gguf_file *f, uint32_t i) {
    gguf_str s = {f->tensors[i].name, strlen(f->tensors[i].name)};
    return s;
}

/* Index of name, or -1. */
static int64_t index_get(const gguf_file *f, const name_index *ix, name_of_fn fn, const char *p, uint64_t n) {
    if (!ix->slots) return -1;
    for (uint64_t h = hash_bytes(p, n) & (ix->cap - 1);; h = (h + 1) & (ix->cap - 1)) {
        uint32_t s = ix->slots[h];
        if (!s) return -1;
        gguf_str k = fn(f, s - 1);
        if (k.len == n && (n == 0 || !memcmp(k.ptr, p, n))) return s - 1;
    }
}

/* False if the name is already present. */
static bool index_put(const gguf_file *f, name_index *ix, name_of_fn fn, uint32_t i) {
    gguf_str k = fn(f, i);
    uint64_t h = hash_bytes(k.ptr, k.len) & (ix->cap - 1);
    for (;; h = (h + 1) & (ix->cap - 1)) {
        uint32_t s = ix->slots[h];
        if (!s) break;
        gguf_str o = fn(f, s - 1);
        if (o.len == k.len && (k.len == 0 || !memcmp(o.ptr, k.ptr, k.len))) return false;
    }
    ix->slots[h] = i + 1;
    return true;
}

/* ---- values ------------------------------------------------------------------------- */

int gguf_vtype_size(gguf_vtype t) {
    switch (t) {
    case GGUF_T_U8:
    case GGUF_T_I8:
    case GGUF_T_BOOL:
        return 1;
    case GGUF_T_U16:
    case GGUF_T_I16:
        return 2;
    case GGUF_T_U32:
    case GGUF_T_I32:
    case GGUF_T_F32:
        return 4;
    case GGUF_T_U64:
    case GGUF_T_I64:
    case GGUF_T_F64:
        return 8;
    default:
        return 0; /* string, array: variable */
    }
}

static bool vtype_is_uint(gguf_vtype t) {
    return t == GGUF_T_U8 || t == GGUF_T_U16 || t == GGUF_T_U32 || t == GGUF_T_U64;
}
static bool vtype_is_sint(gguf_vtype t) {
    return t == GGUF_T_I8 || t == GGUF_T_I16 || t == GGUF_T_I32 || t == GGUF_T_I64;
}

const char *gguf_vtype_name(gguf_vtype t) {
    static const char *names[GGUF_T_COUNT] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                              "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < GGUF_T_COUNT ? names[t] : "unknown";
}

/* Decode one scalar of a fixed-size type at p into kv->v. */
static void scalar_decode(gguf_vtype t, const uint8_t *p, gguf_kv *kv) {
    int n = gguf_vtype_size(t);
    uint64_t raw = le_load(p, n);
    if (vtype_is_uint(t))
        kv->v.u = raw;
    else if (vtype_is_sint(t)) {
        int shift = 64 - 8 * n; /* sign-extend through the top bits */
        kv->v.i = (int64_t)(raw << shift) >> shift;
    } else if (t == GGUF_T_F32) {
        uint32_t u = (uint32_t)raw;
        float x;
        memcpy(&x, &u, 4);
        kv->v.f = x;
    } else if (t == GGUF_T_F64) {
        double x;
        memcpy(&x, &raw, 8);
        kv->v.f = x;
    } else
        kv->v.b = raw != 0;
}

static tk_status check_vtype(uint32_t t, const char *key_ptr, uint64_t key_len, const char *what) {
    if (t >= GGUF_T_COUNT)
        return tk_fail(TK_ERR_FORMAT, "gguf: key '%.*s': %s type %u is unknown (valid 0..%d)",
                       (int)(key_len > 200 ? 200 : key_len), key_ptr, what, t, GGUF_T_COUNT - 1);
    return TK_OK;
}

#define KEYFMT(kv) (int)((kv)->key.len > 200 ? 200 : (kv)->key.len), (kv)->key.ptr

/* The body of an array (after its element type and count): validated and skipped.
 * Fills arr_str_off (relative to the first element) for string arrays when offs != NULL. */
static tk_status skip_array_body(rd *r, const gguf_kv *kv, gguf_vtype et, uint64_t n, int depth,
                                 uint64_t **offs) {
    int es = gguf_vtype_size(et);
    if (es) {
        uint64_t bytes;
        if (!tk_mul_u64(n, (uint64_t)es, &bytes) || bytes > rd_left(r))
            return tk_fail(TK_ERR_FORMAT,
                           "gguf: key '%.*s': array of %" PRIu64 " %s runs past the end of the file (%" PRIu64
                           " bytes left)",
                           KEYFMT(kv), n, gguf_vtype_name(et), rd_left(r));
        if (et == GGUF_T_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (r->base[r->pos + i] > 1)
                    return tk_fail(TK_ERR_FORMAT,
                                   "gguf: key '%.*s': bool element %" PRIu64 " is %u, not 0 or 1", KEYFMT(kv),
                                   i, r->base[r->pos + i]);
        r->pos += bytes;
        return TK_OK;
    }
    if (et == GGUF_T_STRING) {
        if (n > rd_left(r) / 8) /* each string takes at least its 8-byte length */
            return tk_fail(TK_ERR_FORMAT,
                           "gguf: key '%.*s': array of %" PRIu64
                           " strings runs past the end of the file (%" PRIu64 " bytes left)",
                           KEYFMT(kv), n, rd_left(r));
        uint64_t start = r->pos, *o = NULL;
        if (offs && n) {
            o = tk_calloc(n, sizeof *o);
            if (!o)
                return tk_fail(TK_ERR_NOMEM, "gguf: key '%.*s': cannot allocate %" PRIu64 " string offsets",
                               KEYFMT(kv), n);
            *offs = o;
        }
        for (uint64_t i = 0; i < n; i++) {
            if (o) o[i] = r->pos - start;
            gguf_str s;
            if (rd_str(r, &s, "string array element") != TK_OK) {
                tk_error_prefix("key '%.*s' element %" PRIu64, KEYFMT(kv), i);
                return TK_ERR_FORMAT;
            }
        }
        return TK_OK;
    }
    /* arrays of arrays: legal in the spec; validated here, exposed without accessors */
    if (depth >= GGUF_MAX_ARR_DEPTH)
        return tk_fail(TK_ERR_FORMAT, "gguf: key '%.*s': arrays nested deeper than %d", KEYFMT(kv),
                       GGUF_MAX_ARR_DEPTH);
    if (n > rd_left(r) / 12)
        return tk_fail(TK_ERR_FORMAT,
                       "gguf: key '%.*s': array of %" PRIu64 " arrays runs past the end of the file (%" PRIu64
                       " bytes left)",
                       KEYFMT(kv), n, rd_left(r));
    for (uint64_t i = 0; i < n; i++) {
        uint32_t t2 = 0;
        uint64_t n2 = 0;
        tk_status st = rd_u32(r, &t2, "nested array type");
        if (st == TK_OK) st = check_vtype(t2, kv->key.ptr, kv->key.len, "nested array element");
        if (st == TK_OK) st = rd_u64(r, &n2, "nested array count");
        if (st == TK_OK) st = skip_array_body(r, kv, (gguf_vtype)t2, n2, depth + 1, NULL);
        if (st != TK_OK) return st;
    }
    return TK_OK;
}

static tk_status parse_kv(rd *r, int64_t idx, gguf_kv *kv) {
    tk_status st = rd_str(r, &kv->key, "key");
    if (st != TK_OK) {
        tk_error_prefix("kv %" PRId64, idx);
        return st;
    }
    if (kv->key.len == 0) return tk_fail(TK_ERR_FORMAT, "gguf: kv %" PRId64 ": key is empty", idx);
    uint32_t t = 0;
    if ((st = rd_u32(r, &t, "value type")) != TK_OK) return st;
    if ((st = check_vtype(t, kv->key.ptr, kv->key.len, "value")) != TK_OK) return st;
    kv->type = (gguf_vtype)t;
    int es = gguf_vtype_size(kv->type);
    if (es) {
        if (rd_left(r) < (uint64_t)es)
            return tk_fail(TK_ERR_FORMAT, "gguf: key '%.*s': %s value runs past the end of the file",
                           KEYFMT(kv), gguf_vtype_name(kv->type));
        if (kv->type == GGUF_T_BOOL && r->base[r->pos] > 1)
            return tk_fail(TK_ERR_FORMAT, "gguf: key '%.*s': bool value is %u, not 0 or 1", KEYFMT(kv),
                           r->base[r->pos]);
        scalar_decode(kv->type, r->base + r->pos, kv);
        r->pos += (uint64_t)es;
        return TK_OK;
    }
    if (kv->type == GGUF_T_STRING) {
        st = rd_str(r, &kv->v.s, "string value");
        if (st != TK_OK) tk_error_prefix("key '%.*s'", KEYFMT(kv));
        return st;
    }
    uint32_t et = 0;
    if ((st = rd_u32(r, &et, "array element type")) != TK_OK) return st;
    if ((st = check_vtype(et, kv->key.ptr, kv->key.len, "array element")) != TK_OK) return st;
    kv->arr_type = (gguf_vtype)et;
    if ((st = rd_u64(r, &kv->arr_n, "array count")) != TK_OK) return st;
    kv->arr_data = r->base + r->pos;
    uint64_t *offs = NULL;
    st = skip_array_body(r, kv, kv->arr_type, kv->arr_n, 1, &offs);
    kv->arr_str_off = offs; /* owned by the file even on failure, so gguf_close frees it */
    return st;
}

/* ---- open ------------------------------------------------------------------------------- */

static tk_status check_header(rd *r, gguf_file *f, uint64_t *n_tensors, uint64_t *n_kv) {
    if (r->size < GGUF_HEADER_BYTES)
        return tk_fail(TK_ERR_FORMAT, "gguf: file is %" PRIu64 " bytes, shorter than the %d-byte header",
                       r->size, GGUF_HEADER_BYTES);
    if (memcmp(r->base, "GGUF", 4) != 0)
        return tk_fail(TK_ERR_FORMAT, "gguf: bad magic %02x %02x %02x %02x (expected \"GGUF\")", r->base[0],
                       r->base[1], r->base[2], r->base[3]);
    r->pos = 4;
    uint64_t v = 0;
    rd_uint(r, 4, &v);
    f->version = (uint32_t)v;
    if (f->version == 1)
        return tk_fail(TK_ERR_UNSUPPORTED, "gguf: version 1 is not supported (only versions 2 and 3)");
    if (f->version != 2 && f->version != 3) {
        /* A big-endian writer stores the version byte-swapped: 0x03000000 for 3. */
        uint32_t sw = __builtin_bswap32(f->version);
        if (sw >= 1 && sw <= 3)
            return tk_fail(
                TK_ERR_UNSUPPORTED,
                "gguf: big-endian file (version field 0x%08x reads as %u byte-swapped) is not supported",
                f->version, sw);
        return tk_fail(TK_ERR_FORMAT, "gguf: version %u is unknown (expected 2 or 3)", f->version);
    }
    rd_uint(r, 8, n_tensors);
    rd_uint(r, 8, n_kv);
    /* Bound both counts by what the remaining bytes could hold, before allocating. */
    uint64_t left = rd_left(r);
    if (*n_kv > left / GGUF_MIN_KV_BYTES)
        return tk_fail(TK_ERR_FORMAT,
                       "gguf: n_kv %" PRIu64 " is absurd: %" PRIu64 " bytes left hold at most %" PRIu64,
                       *n_kv, left, left / GGUF_MIN_KV_BYTES);
    if (*n_tensors > left / GGUF_MIN_TI_BYTES)
        return tk_fail(TK_ERR_FORMAT,
                       "gguf: n_tensors %" PRIu64 " is absurd: %" PRIu64 " bytes left hold at most %" PRIu64,
                       *n_tensors, left, left / GGUF_MIN_TI_BYTES);
    if (*n_kv >= UINT32_MAX || *n_tensors >= UINT32_MAX) /* indices are u32 in the name index */
        return tk_fail(TK_ERR_FORMAT, "gguf: n_kv %" PRIu64 " or n_tensors %" PRIu64 " exceeds 2^32", *n_kv,
                       *n_tensors);
    if (*n_kv * GGUF_MIN_KV_BYTES + *n_tensors * GGUF_MIN_TI_BYTES > left)
        return tk_fail(TK_ERR_FORMAT,
                       "gguf: n_kv %" PRIu64 " and n_tensors %" PRIu64 " need more than the %" PRIu64
                       " bytes left",
                       *n_kv, *n_tensors, left);
    return TK_OK;
}

/* Arrays grow as entries are parsed, so a lying count costs nothing before it is caught. */
static tk_status grow(void **p, uint64_t *cap, uint64_t need, size_t elem, const char *what) {
    if (need <= *cap) return TK_OK;
    uint64_t nc = *cap ? *cap * 2 : 64;
    if (nc < need) nc = need;
    size_t bytes;
    if (!tk_mul_size((size_t)nc, elem, &bytes))
        return tk_fail(TK_ERR_NOMEM, "gguf: %s array size overflows", what);
    void *q = tk_realloc(*p, bytes);
    if (!q) return tk_fail(TK_ERR_NOMEM, "gguf: cannot grow the %s array to %" PRIu64, what, nc);
    memset((char *)q + *cap * elem, 0, (size_t)(nc - *cap) * elem);
    *p = q;
    *cap = nc;
    return TK_OK;
}

static tk_status parse_kvs(rd *r, gguf_file *f, uint64_t n_kv) {
    tk_status st;
    uint64_t cap = 0;
    f->alignment = GGUF_DEFAULT_ALIGN;
    for (uint64_t i = 0; i < n_kv; i++) {
        if ((st = grow((void **)&f->kvs, &cap, i + 1, sizeof *f->kvs, "kv")) != TK_OK) return st;
        gguf_kv *kv = &f->kvs[i];
        f->n_kv = (int64_t)i + 1; /* count it now so close frees its string offsets */
        if ((st = parse_kv(r, (int64_t)i, kv)) != TK_OK) return st;
    }
    if ((st = index_init(&f->kv_idx, n_kv)) != TK_OK) return st;
    for (uint64_t i = 0; i < n_kv; i++) {
        const gguf_kv *kv = &f->kvs[i];
        if (!index_put(f, &f->kv_idx, kv_name, (uint32_t)i))
            return tk_fail(TK_ERR_FORMAT, "gguf: key '%.*s' is duplicated (kv %" PRIu64 ")", KEYFMT(kv), i);
        if (gguf_str_eq(kv->key, "general.alignment")) {
            if (kv->type != GGUF_T_U32)
                return tk_fail(TK_ERR_FORMAT, "gguf: general.alignment has type %s, expected u32",
                               gguf_vtype_name(kv->type));
            uint64_t a = kv->v.u;
            if (a == 0 || (a & (a - 1)))
                return tk_fail(TK_ERR_FORMAT,
                               "gguf: general.alignment %" PRIu64 " is not a nonzero power of two", a);
            f->alignment = (uint32_t)a;
        }
    }
    return TK_OK;
}

static tk_status parse_tensor_info(rd *r, gguf_file *f, int64_t i) {
    tk_tensor *t = &f->tensors[i];
    gguf_str name;
    uint64_t len = 0;
    if (!rd_uint(r, 8, &len)) return eof_fail(r, "tensor name");
    if (len == 0) return tk_fail(TK_ERR_FORMAT, "gguf: tensor %" PRId64 ": name is empty", i);
    if (len > GGUF_MAX_NAME)
        return tk_fail(TK_ERR_FORMAT, "gguf: tensor %" PRId64 ": name length %" PRIu64 " exceeds %d", i, len,
                       GGUF_MAX_NAME);
    r->pos -= 8;
    tk_status st = rd_str(r, &name, "tensor name");
    if (st != TK_OK) return st;
    if (memchr(name.ptr, 0, name.len))
        return tk_fail(TK_ERR_FORMAT, "gguf: tensor %" PRId64 ": name contains a NUL byte", i);
    char *copy = tk_strndup(name.ptr, name.len);
    if (!copy) return tk_fail(TK_ERR_NOMEM, "gguf: cannot copy a tensor name");
    t->name = copy;
    f->n_tensors = i + 1; /* count it now so close frees the name */
    uint32_t nd = 0;
    if ((st = rd_u32(r, &nd, "tensor n_dims")) != TK_OK) return st;
    if (nd == 0 || nd > 4)
        return tk_fail(TK_ERR_FORMAT, "gguf: tensor '%s': n_dims %u is not in 1..4", copy, nd);
    t->n_dims = (int)nd;
    int64_t n_el = 1;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t v = 0;
        if ((st = rd_u64(r, &v, "tensor ne")) != TK_OK) return st;
        if ((int64_t)v <= 0)
            return tk_fail(TK_ERR_FORMAT, "gguf: tensor '%s': ne[%u] = %" PRId64 " is not positive", copy, d,
                           (int64_t)v);
        t->ne[d] = (int64_t)v;
        if (!tk_mul_i64(n_el, t->ne[d], &n_el))
            return tk_fail(TK_ERR_FORMAT, "gguf: tensor '%s': product of dims overflows at ne[%u] = %" PRId64,
                           copy, d, t->ne[d]);
    }
    uint32_t type = 0;
    if ((st = rd_u32(r, &type, "tensor type")) != TK_OK) return st;
    if (!dtype_known(type))
        return tk_fail(TK_ERR_FORMAT, "gguf: tensor '%s': type id %u is unknown", copy, type);
    if (!dtype_supported(type))
        return tk_fail(TK_ERR_UNSUPPORTED, "gguf: tensor '%s': type %s (id %u) is not supported", copy,
                       dtype_name(type), type);
    t->type = (tk_dtype)type;
    uint64_t row, rows = (uint64_t)(n_el / t->ne[0]);
    if (!dtype_row_bytes(t->type, (uint64_t)t->ne[0], &row)) {
        return tk_fail(TK_ERR_FORMAT,
                       "gguf: tensor '%s': ne[0] = %" PRId64 " is not a multiple of the %s block size %d",
                       copy, t->ne[0], dtype_name(type), dtype_block_elems(t->type));
    }
    if (!tk_mul_u64(row, rows, &t->nbytes))
        return tk_fail(TK_ERR_FORMAT, "gguf: tensor '%s': byte size overflows", copy);
    if ((st = rd_u64(r, &f->offsets[i], "tensor offset")) != TK_OK) return st;
    if (f->offsets[i] % f->alignment)
        return tk_fail(TK_ERR_FORMAT,
                       "gguf: tensor '%s': offset %" PRIu64 " is not a multiple of the alignment %u", copy,
                       f->offsets[i], f->alignment);
    if (!index_put(f, &f->t_idx, t_name, (uint32_t)i))
        return tk_fail(TK_ERR_FORMAT, "gguf: tensor name '%s' is duplicated (tensor %" PRId64 ")", copy, i);
    return TK_OK;
}

/* qsort_r is a GNU extension with a platform-specific signature; sorting pairs
 * keeps us portable and free of globals. */
typedef struct off_pair {
    uint64_t off;
    int64_t i;
} off_pair;
static int off_pair_cmp(const void *a, const void *b) {
    const off_pair *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static tk_status check_layout(gguf_file *f) {
    int64_t n = f->n_tensors;
    if (n == 0) return TK_OK;
    if (f->data_start > f->size)
        return tk_fail(TK_ERR_FORMAT,
                       "gguf: data section start %" PRIu64 " is past the end of the file (%" PRIu64 " bytes)",
                       f->data_start, f->size);
    uint64_t data_bytes = f->size - f->data_start;
    for (int64_t i = 0; i < n; i++) {
        tk_tensor *t = &f->tensors[i];
        if (!tk_range_ok(f->offsets[i], t->nbytes, data_bytes))
            return tk_fail(TK_ERR_FORMAT,
                           "gguf: tensor '%s': data [%" PRIu64 ", +%" PRIu64 ") is outside the %" PRIu64
                           "-byte data section",
                           t->name, f->offsets[i], t->nbytes, data_bytes);
        t->data = f->base + f->data_start + f->offsets[i];
    }
    off_pair *p = tk_calloc((size_t)n, sizeof *p);
    if (!p) return tk_fail(TK_ERR_NOMEM, "gguf: cannot allocate the layout check");
    for (int64_t i = 0; i < n; i++) p[i] = (off_pair){f->offsets[i], i};
    qsort(p, (size_t)n, sizeof *p, off_pair_cmp);
    tk_status st = TK_OK;
    for (int64_t k = 1; k < n && st == TK_OK; k++) {
        const tk_tensor *a = &f->tensors[p[k - 1].i], *b = &f->tensors[p[k].i];
        if (p[k - 1].off + a->nbytes > p[k].off) /* both in range, so no overflow */
            st = tk_fail(TK_ERR_FORMAT,
                         "gguf: tensors '%s' (offset %" PRIu64 ", %" PRIu64
                         " bytes) and '%s' (offset %" PRIu64 ") overlap",
                         a->name, p[k - 1].off, a->nbytes, b->name, p[k].off);
    }
    tk_free(p);
    return st;
}

static tk_status parse(gguf_file *f) {
    rd r = {f->base, 0, f->size};
    uint64_t n_tensors = 0, n_kv = 0;
    tk_status st = check_header(&r, f, &n_tensors, &n_kv);
    if (st == TK_OK) st = parse_kvs(&r, f, n_kv);
    if (st != TK_OK) return st;
    if ((st = index_init(&f->t_idx, n_tensors)) != TK_OK) return st;
    uint64_t cap_t = 0, cap_o = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if ((st = grow((void **)&f->tensors, &cap_t, i + 1, sizeof *f->tensors, "tensor")) != TK_OK)
            return st;
        if ((st = grow((void **)&f->offsets, &cap_o, i + 1, sizeof *f->offsets, "offset")) != TK_OK)
            return st;
        if ((st = parse_tensor_info(&r, f, (int64_t)i)) != TK_OK) return st;
    }
    uint64_t a = f->alignment;
    if (!tk_add_u64(r.pos, a - 1, &f->data_start))
        return tk_fail(TK_ERR_FORMAT, "gguf: data section start overflows");
    f->data_start -= f->data_start % a;
    return check_layout(f);
}

static tk_status open_common(gguf_file *f, gguf_file **out) {
    tk_status st = parse(f);
    if (st != TK_OK) {
        if (f->path[0]) tk_error_prefix("%s", f->path);
        gguf_close(f);
        return st;
    }
    *out = f;
    return TK_OK;
}

tk_status gguf_open_mem(const void *data, size_t size, gguf_file **out) {
    *out = NULL;
    if (!data && size) return tk_fail(TK_ERR_INVALID, "gguf: NULL buffer of %zu bytes", size);
    gguf_file *f = tk_calloc(1, sizeof *f);
    if (f) f->path = tk_strdup("");
    if (!f || !f->path) {
        tk_free(f);
        return tk_fail(TK_ERR_NOMEM, "gguf: cannot allocate a file object");
    }
    f->base = data;
    f->size = size;
    return open_common(f, out);
}

tk_status gguf_open(const char *path, gguf_file **out) {
    *out = NULL;
    if (!path) return tk_fail(TK_ERR_INVALID, "gguf: NULL path");
    gguf_file *f = tk_calloc(1, sizeof *f);
    if (f) f->path = tk_strdup(path);
    if (!f || !f->path) {
        tk_free(f);
        return tk_fail(TK_ERR_NOMEM, "gguf: cannot allocate a file object");
    }
    tk_status st = fmap_open(path, &f->map);
    if (st != TK_OK) {
        gguf_close(f);
        return st;
    }
    f->base = f->map.data;
    f->size = f->map.size;
    return open_common(f, out);
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (int64_t i = 0; i < f->n_kv; i++) tk_free((void *)f->kvs[i].arr_str_off);
    for (int64_t i = 0; i < f->n_tensors; i++) tk_free((void *)f->tensors[i].name);
    tk_free(f->kvs);
    tk_free(f->tensors);
    tk_free(f->offsets);
    tk_free(f->kv_idx.slots);
    tk_free(f->t_idx.slots);
    fmap_close(&f->map);
    tk_free(f->path);
    tk_free(f);
}

/* ---- accessors --------------------------------------------------------------------------- */

uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint32_t gguf_alignment(const gguf_file *f) { return f->alignment; }
const char *gguf_path(const gguf_file *f) { return f->path; }
uint64_t gguf_file_size(const gguf_file *f) { return f->size; }
int64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }
int64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_kv *gguf_kv_at(const gguf_file *f, int64_t i) { return i >= 0 && i < f->n_kv ? &f->kvs[i] : NULL; }
const tk_tensor *gguf_tensor_at(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_kv *gguf_find(const gguf_file *f, const char *key) {
    if (!key) return NULL;
    int64_t i = index_get(f, &f->kv_idx, kv_name, key, strlen(key));
    return i < 0 ? NULL : &f->kvs[i];
}

const tk_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    if (!name) return NULL;
    int64_t i = index_get(f, &f->t_idx, t_name, name, strlen(name));
    return i < 0 ? NULL : &f->tensors[i];
}

bool gguf_str_eq(gguf_str s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && (n == 0 || !memcmp(s.ptr, cstr, n));
}

/* ---- typed lookups --------------------------------------------------------------------------- */

static tk_status lookup(const gguf_file *f, const char *key, bool required, const gguf_kv **kv) {
    *kv = gguf_find(f, key);
    if (!*kv && required) return tk_fail(TK_ERR_NOT_FOUND, "gguf: required key '%s' is missing", key);
    return TK_OK;
}

static tk_status wrong_type(const char *key, const char *expected, gguf_vtype actual) {
    return tk_fail(TK_ERR_FORMAT, "gguf: key '%s': expected %s, found %s", key, expected,
                   gguf_vtype_name(actual));
}

/* Any integer value as a signed range [lo, hi]; false if it is not an integer. */
static bool kv_int_fits(const gguf_kv *kv, int64_t lo, uint64_t hi, uint64_t *u, int64_t *s, bool *neg) {
    if (vtype_is_uint(kv->type)) {
        *neg = false;
        *u = kv->v.u;
        return kv->v.u <= hi;
    }
    *neg = kv->v.i < 0;
    *s = kv->v.i;
    if (kv->v.i < 0) return kv->v.i >= lo;
    return (uint64_t)kv->v.i <= hi;
}

static tk_status kv_to_int(const gguf_kv *kv, const char *key, const char *tname, int64_t lo, uint64_t hi,
                           uint64_t *u, int64_t *s, bool *neg) {
    if (!vtype_is_uint(kv->type) && !vtype_is_sint(kv->type)) return wrong_type(key, tname, kv->type);
    if (!kv_int_fits(kv, lo, hi, u, s, neg)) {
        if (vtype_is_uint(kv->type))
            return tk_fail(TK_ERR_RANGE, "gguf: key '%s': value %" PRIu64 " does not fit %s", key, kv->v.u,
                           tname);
        return tk_fail(TK_ERR_RANGE, "gguf: key '%s': value %" PRId64 " does not fit %s", key, kv->v.i,
                       tname);
    }
    if (!*neg && !vtype_is_uint(kv->type)) *u = (uint64_t)*s;
    return TK_OK;
}

static tk_status get_u32(const gguf_file *f, const char *key, bool req, uint32_t def, uint32_t *out) {
    const gguf_kv *kv;
    tk_status st = lookup(f, key, req, &kv);
    if (st != TK_OK) return st;
    if (!kv) {
        *out = def;
        return TK_OK;
    }
    uint64_t u = 0;
    int64_t s = 0;
    bool neg = false;
    if ((st = kv_to_int(kv, key, "u32", 0, UINT32_MAX, &u, &s, &neg)) != TK_OK) return st;
    *out = (uint32_t)u;
    return TK_OK;
}

tk_status gguf_require_u32(const gguf_file *f, const char *key, uint32_t *out) {
    return get_u32(f, key, true, 0, out);
}
tk_status gguf_get_u32(const gguf_file *f, const char *key, uint32_t def, uint32_t *out) {
    return get_u32(f, key, false, def, out);
}

tk_status gguf_get_i64(const gguf_file *f, const char *key, int64_t def, int64_t *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) {
        *out = def;
        return TK_OK;
    }
    uint64_t u = 0;
    int64_t s = 0;
    bool neg = false;
    tk_status st = kv_to_int(kv, key, "i64", INT64_MIN, INT64_MAX, &u, &s, &neg);
    if (st != TK_OK) return st;
    *out = neg ? s : (int64_t)u;
    return TK_OK;
}

static tk_status get_f32(const gguf_file *f, const char *key, bool req, float def, float *out) {
    const gguf_kv *kv;
    tk_status st = lookup(f, key, req, &kv);
    if (st != TK_OK) return st;
    if (!kv) {
        *out = def;
        return TK_OK;
    }
    if (kv->type != GGUF_T_F32 && kv->type != GGUF_T_F64) return wrong_type(key, "f32", kv->type);
    *out = (float)kv->v.f;
    return TK_OK;
}

tk_status gguf_require_f32(const gguf_file *f, const char *key, float *out) {
    return get_f32(f, key, true, 0, out);
}
tk_status gguf_get_f32(const gguf_file *f, const char *key, float def, float *out) {
    return get_f32(f, key, false, def, out);
}

tk_status gguf_get_bool(const gguf_file *f, const char *key, bool def, bool *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) {
        *out = def;
        return TK_OK;
    }
    if (kv->type != GGUF_T_BOOL) return wrong_type(key, "bool", kv->type);
    *out = kv->v.b;
    return TK_OK;
}

static tk_status get_str(const gguf_file *f, const char *key, bool req, gguf_str *out, bool *found) {
    const gguf_kv *kv;
    tk_status st = lookup(f, key, req, &kv);
    if (found) *found = kv != NULL;
    if (st != TK_OK) return st;
    if (!kv) {
        out->ptr = "";
        out->len = 0;
        return TK_OK;
    }
    if (kv->type != GGUF_T_STRING) return wrong_type(key, "string", kv->type);
    *out = kv->v.s;
    return TK_OK;
}

tk_status gguf_require_str(const gguf_file *f, const char *key, gguf_str *out) {
    return get_str(f, key, true, out, NULL);
}
tk_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, bool *found) {
    return get_str(f, key, false, out, found);
}

tk_status gguf_require_arr(const gguf_file *f, const char *key, gguf_vtype elem, const gguf_kv **out) {
    *out = NULL;
    const gguf_kv *kv;
    tk_status st = lookup(f, key, true, &kv);
    if (st != TK_OK) return st;
    if (kv->type != GGUF_T_ARRAY) return wrong_type(key, "array", kv->type);
    if (kv->arr_type != elem)
        return tk_fail(TK_ERR_FORMAT, "gguf: key '%s': expected an array of %s, found an array of %s", key,
                       gguf_vtype_name(elem), gguf_vtype_name(kv->arr_type));
    *out = kv;
    return TK_OK;
}

static tk_status arr_check(const gguf_kv *kv, uint64_t i) {
    if (!kv || kv->type != GGUF_T_ARRAY) return tk_fail(TK_ERR_INVALID, "gguf: not an array");
    if (i >= kv->arr_n)
        return tk_fail(TK_ERR_RANGE,
                       "gguf: key '%.*s': index %" PRIu64 " is past the array's %" PRIu64 " elements",
                       KEYFMT(kv), i, kv->arr_n);
    return TK_OK;
}

tk_status gguf_arr_str(const gguf_kv *kv, uint64_t i, gguf_str *out) {
    tk_status st = arr_check(kv, i);
    if (st != TK_OK) return st;
    if (kv->arr_type != GGUF_T_STRING)
        return tk_fail(TK_ERR_FORMAT, "gguf: key '%.*s': expected an array of string, found an array of %s",
                       KEYFMT(kv), gguf_vtype_name(kv->arr_type));
    /* validated at open: the prefix and the bytes lie inside the mapping */
    const uint8_t *p = (const uint8_t *)kv->arr_data + kv->arr_str_off[i];
    out->len = le_load(p, 8);
    out->ptr = (const char *)p + 8;
    return TK_OK;
}

tk_status gguf_arr_i64(const gguf_kv *kv, uint64_t i, int64_t *out) {
    tk_status st = arr_check(kv, i);
    if (st != TK_OK) return st;
    gguf_vtype t = kv->arr_type;
    if (!vtype_is_uint(t) && !vtype_is_sint(t) && t != GGUF_T_BOOL)
        return tk_fail(TK_ERR_FORMAT, "gguf: key '%.*s': expected an integer array, found an array of %s",
                       KEYFMT(kv), gguf_vtype_name(t));
    gguf_kv tmp = {0};
    int es = gguf_vtype_size(t);
    scalar_decode(t, (const uint8_t *)kv->arr_data + i * (uint64_t)es, &tmp);
    if (t == GGUF_T_BOOL)
        *out = tmp.v.b;
    else if (vtype_is_sint(t))
        *out = tmp.v.i;
    else if (tmp.v.u > INT64_MAX)
        return tk_fail(TK_ERR_RANGE, "gguf: key '%.*s': element %" PRIu64 " = %" PRIu64 " does not fit i64",
                       KEYFMT(kv), i, tmp.v.u);
    else
        *out = (int64_t)tmp.v.u;
    return TK_OK;
}

tk_status gguf_arr_f32(const gguf_kv *kv, uint64_t i, float *out) {
    tk_status st = arr_check(kv, i);
    if (st != TK_OK) return st;
    gguf_vtype t = kv->arr_type;
    int es = gguf_vtype_size(t);
    if (!es || t == GGUF_T_BOOL)
        return tk_fail(TK_ERR_FORMAT, "gguf: key '%.*s': expected a numeric array, found an array of %s",
                       KEYFMT(kv), gguf_vtype_name(t));
    gguf_kv tmp = {0};
    scalar_decode(t, (const uint8_t *)kv->arr_data + i * (uint64_t)es, &tmp);
    if (t == GGUF_T_F32 || t == GGUF_T_F64)
        *out = (float)tmp.v.f;
    else if (vtype_is_sint(t))
        *out = (float)tmp.v.i;
    else
        *out = (float)tmp.v.u;
    return TK_OK;
}
