/* GGUF v2/v3: a validating reader over a read-only mapping, and a streaming writer.
 *
 * gguf_open checks every count, length, offset, alignment and type against the
 * file with overflow-safe arithmetic before anything is used; a malformed file
 * gives TK_ERR_FORMAT (or TK_ERR_UNSUPPORTED for a known but unsupported tensor
 * type) and a one-line message naming the field and value. Strings returned by
 * the reader point into the mapping and are NOT NUL-terminated (use the length);
 * tensor names are NUL-terminated copies. Everything stays valid until gguf_close.
 */
#ifndef TK_FORMAT_GGUF_H
#define TK_FORMAT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "tokamak.h"

typedef enum gguf_vtype {
    GGUF_T_U8 = 0,
    GGUF_T_I8 = 1,
    GGUF_T_U16 = 2,
    GGUF_T_I16 = 3,
    GGUF_T_U32 = 4,
    GGUF_T_I32 = 5,
    GGUF_T_F32 = 6,
    GGUF_T_BOOL = 7,
    GGUF_T_STRING = 8,
    GGUF_T_ARRAY = 9,
    GGUF_T_U64 = 10,
    GGUF_T_I64 = 11,
    GGUF_T_F64 = 12,
    GGUF_T_COUNT
} gguf_vtype;

/* Bytes of one value of a fixed-size type; 0 for strings and arrays (variable). */
int gguf_vtype_size(gguf_vtype t);

typedef struct gguf_str {
    const char *ptr; /* not NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    gguf_vtype type;
    /* scalars (by type): u for U8..U64, i for I8..I64, f for F32/F64, b, s */
    union {
        uint64_t u;
        int64_t i;
        double f;
        bool b;
        gguf_str s;
    } v;
    /* arrays: element type, count, raw element bytes (unaligned, little-endian).
     * For arrays of arrays (legal, validated) there are no element accessors. */
    gguf_vtype arr_type;
    uint64_t arr_n;
    const void *arr_data;
    const uint64_t *arr_str_off; /* (arr_n) string arrays: offset of each string's length
                                  * prefix, relative to arr_data; NULL otherwise */
} gguf_kv;

typedef struct gguf_file gguf_file;

/* path: map the file read-only. Free with gguf_close. */
tk_status gguf_open(const char *path, gguf_file **out);
/* Parse a buffer the caller keeps alive (tests, fuzzers). */
tk_status gguf_open_mem(const void *data, size_t size, gguf_file **out);
void gguf_close(gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
uint32_t gguf_alignment(const gguf_file *f);
const char *gguf_path(const gguf_file *f); /* "" for memory */
uint64_t gguf_file_size(const gguf_file *f);

int64_t gguf_n_kv(const gguf_file *f);
const gguf_kv *gguf_kv_at(const gguf_file *f, int64_t i);
const gguf_kv *gguf_find(const gguf_file *f, const char *key); /* NULL on a miss */

/* Typed lookups. _require fails on a miss (naming the key); _get returns def on
 * a miss. Both fail on a wrong type or a value that does not fit, naming the key,
 * the expected and the actual type. Integer getters accept any integer type whose
 * value fits. Status: a miss in _require is TK_ERR_NOT_FOUND, a wrong type
 * TK_ERR_FORMAT, a value that does not fit (or an index past the end) TK_ERR_RANGE. */
tk_status gguf_require_u32(const gguf_file *f, const char *key, uint32_t *out);
tk_status gguf_get_u32(const gguf_file *f, const char *key, uint32_t def, uint32_t *out);
tk_status gguf_get_i64(const gguf_file *f, const char *key, int64_t def, int64_t *out);
tk_status gguf_require_f32(const gguf_file *f, const char *key, float *out);
tk_status gguf_get_f32(const gguf_file *f, const char *key, float def, float *out);
tk_status gguf_get_bool(const gguf_file *f, const char *key, bool def, bool *out);
tk_status gguf_require_str(const gguf_file *f, const char *key, gguf_str *out);
/* *found=false and TK_OK on a miss. */
tk_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, bool *found);
/* An array whose elements are of type elem. */
tk_status gguf_require_arr(const gguf_file *f, const char *key, gguf_vtype elem, const gguf_kv **out);
/* Element i of a string array (range-checked). */
tk_status gguf_arr_str(const gguf_kv *kv, uint64_t i, gguf_str *out);
/* Numeric element i converted (range-checked; memcpy inside, so unaligned is fine). */
tk_status gguf_arr_i64(const gguf_kv *kv, uint64_t i, int64_t *out);
tk_status gguf_arr_f32(const gguf_kv *kv, uint64_t i, float *out);

int64_t gguf_n_tensors(const gguf_file *f);
const tk_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
const tk_tensor *gguf_find_tensor(const gguf_file *f, const char *name); /* NULL on a miss */

const char *gguf_vtype_name(gguf_vtype t);
bool gguf_str_eq(gguf_str s, const char *cstr);

/* ---- writer: declare metadata and tensor infos, then stream tensor data in
 * declaration order, so a 32B model never has to fit in memory. */
typedef struct gguf_writer gguf_writer;

tk_status gguf_writer_init(uint32_t alignment, gguf_writer **out); /* 0: 32 */
void gguf_writer_free(gguf_writer *w);
tk_status gguf_w_u32(gguf_writer *w, const char *key, uint32_t v);
tk_status gguf_w_i32(gguf_writer *w, const char *key, int32_t v);
tk_status gguf_w_u64(gguf_writer *w, const char *key, uint64_t v);
tk_status gguf_w_f32(gguf_writer *w, const char *key, float v);
tk_status gguf_w_bool(gguf_writer *w, const char *key, bool v);
tk_status gguf_w_str(gguf_writer *w, const char *key, const char *v);
/* Numeric array: n elements of type elem, copied. */
tk_status gguf_w_arr(gguf_writer *w, const char *key, gguf_vtype elem, const void *data, uint64_t n);
/* String array: n strings with explicit lengths (may hold NULs), copied. */
tk_status gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *strs, const uint64_t *lens,
                         uint64_t n);
tk_status gguf_w_tensor_info(gguf_writer *w, const char *name, tk_dtype type, int n_dims, const int64_t *ne);
/* Write header, metadata and tensor infos to path; then call gguf_w_tensor_data
 * once per tensor in declaration order (nbytes must match), then gguf_w_finish. */
tk_status gguf_w_begin(gguf_writer *w, const char *path);
tk_status gguf_w_tensor_data(gguf_writer *w, const void *data, uint64_t nbytes);
tk_status gguf_w_finish(gguf_writer *w);

#endif
