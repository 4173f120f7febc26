/* safetensors: a validating reader over a read-only mapping, and a writer.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of JSON (an object of
 * tensor name -> {"dtype", "shape", "data_offsets": [begin, end)} plus an optional
 * "__metadata__" string map), then the data section; offsets are relative to it.
 *
 * st_open checks the header (length within the file and at most 100 MB, JSON
 * object, nesting within cJSON's limit, no trailing bytes but spaces), every
 * tensor entry (dtype, shape, offsets present and well typed; shape x dtype size
 * equal to the byte range) and the layout (sorted by begin, the ranges tile the
 * data section exactly: no gap, no overlap, nothing left over). Names must be
 * unique. A malformed file is TK_ERR_FORMAT; a dtype other than F32/F16/BF16 or a
 * shape of more than 4 dims is TK_ERR_UNSUPPORTED; messages name the tensor and field.
 *
 * Tensors are exposed as tk_tensor in GGML order: ne[0] is the LAST (contiguous)
 * dim of the safetensors shape; a scalar (shape []) is n_dims 1, ne[0] = 1.
 * data points into the mapping and is NOT necessarily aligned to the element
 * size (the format only pads the header to 8 bytes): read with memcpy or repack.
 * Everything stays valid until st_close. Not thread-safe to close while in use;
 * concurrent readers of an open file are fine.
 */
#ifndef TK_FORMAT_SAFETENSORS_H
#define TK_FORMAT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "tokamak.h"

#define ST_MAX_HEADER (100u * 1000u * 1000u) /* bytes of JSON header, as the HF library */

typedef struct st_file st_file;

/* Map path read-only and validate it. Free with st_close. */
tk_status st_open(const char *path, st_file **out);
/* Parse a buffer the caller keeps alive until st_close (tests, fuzzers). */
tk_status st_open_mem(const void *data, size_t size, st_file **out);
void st_close(st_file *f); /* NULL: no-op */

const char *st_path(const st_file *f);    /* "" for memory */
uint64_t st_data_bytes(const st_file *f); /* size of the data section */

/* Tensors in header order. */
int64_t st_n_tensors(const st_file *f);
const tk_tensor *st_tensor_at(const st_file *f, int64_t i);          /* NULL if out of range */
const tk_tensor *st_find_tensor(const st_file *f, const char *name); /* NULL on a miss */

/* "__metadata__": string -> string. */
int64_t st_n_meta(const st_file *f);
/* Entry i (range-checked: TK_ERR_RANGE); strings owned by the file. */
tk_status st_meta_at(const st_file *f, int64_t i, const char **key, const char **value);
const char *st_meta_find(const st_file *f, const char *key); /* NULL on a miss */

/* "F32", "F16", "BF16" for the supported dtypes, NULL for others. */
const char *st_dtype_name(tk_dtype t);

/* Write n tensors (F32, F16 or BF16; data and nbytes as in tk_tensor, the
 * safetensors shape is ne reversed) in the given order, with metadata given as a
 * NULL-terminated list of key, value strings (meta may be NULL). The JSON header
 * is padded with spaces to a multiple of 8 bytes, as the HF library does.
 * TK_ERR_INVALID for a bad tensor (type, shape, nbytes, duplicate name), TK_ERR_IO
 * for a failed write. Holds whole tensors in memory: for big checkpoints stream
 * (see the synth command). */
tk_status st_write(const char *path, const tk_tensor *tensors, int64_t n, const char *const *meta);

#endif
