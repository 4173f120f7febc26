/* Hugging Face checkpoint directories (config.json + safetensors shards). */
#include "core/error.h"
#include "model/model_internal.h"

tk_status model_open_hf(const char *dir, const tk_model_opts *o, tk_model **out) {
    (void)o;
    *out = NULL;
    /* Waits on src/format/hf.h (the safetensors shard reader). */
    return tk_fail(TK_ERR_UNSUPPORTED, "model: %s: Hugging Face directories are not loadable yet", dir);
}
