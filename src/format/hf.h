/* A Hugging Face checkpoint directory: config.json plus safetensors weights,
 * either one model.safetensors or shards listed by model.safetensors.index.json.
 *
 * hf_open parses config.json (kept as a cJSON tree and as raw text), reads the
 * index if present (its weight_map names the shard of every tensor), maps every
 * shard with st_open (which validates it) and checks that each tensor the index
 * lists is in its shard. Shard names must be plain file names: one holding a
 * path separator ("/" or "\\"), or equal to "." or "..", is TK_ERR_FORMAT
 * naming it, so an index cannot reach outside the directory ("a..b.safetensors"
 * is a plain name). A tensor present in two shards is TK_ERR_FORMAT. A FIFO,
 * device or directory where a file should be is refused without reading it
 * (fmap_open). Every error message names the file or directory it is about.
 * Tensors are exposed in GGML order (see safetensors.h) and stay valid until
 * hf_close.
 */
#ifndef TK_FORMAT_HF_H
#define TK_FORMAT_HF_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "tokamak.h"

struct cJSON;
typedef struct hf_ckpt hf_ckpt;

#define HF_MAX_JSON (100u * 1000u * 1000u) /* bytes of config.json or the index */

/* TK_ERR_IO when config.json or the weights cannot be read (naming the path),
 * TK_ERR_FORMAT for bad JSON or an inconsistent index, and whatever st_open
 * reports for a bad shard (prefixed with its path). Free with hf_close. */
tk_status hf_open(const char *dir, hf_ckpt **out);
void hf_close(hf_ckpt *h); /* NULL: no-op */

const char *hf_dir(const hf_ckpt *h);
/* The parsed config.json (an object), owned by h. */
const struct cJSON *hf_config(const hf_ckpt *h);
/* The raw config.json text (NUL-terminated), owned by h. */
const char *hf_config_json(const hf_ckpt *h, size_t *len);

/* All tensors of all shards, sorted by name. */
int64_t hf_n_tensors(const hf_ckpt *h);
const tk_tensor *hf_tensor_at(const hf_ckpt *h, int64_t i);          /* NULL if out of range */
const tk_tensor *hf_find_tensor(const hf_ckpt *h, const char *name); /* NULL on a miss */

/* Shards in the order first named by the index (one for model.safetensors). */
int hf_n_shards(const hf_ckpt *h);
const char *hf_shard_name(const hf_ckpt *h, int i); /* NULL if out of range */

#endif
