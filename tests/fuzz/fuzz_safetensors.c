/* libFuzzer target: st_open_mem on arbitrary bytes, then walk every tensor's
 * bytes, every metadata entry and every lookup. */
#include <stddef.h>
#include <stdint.h>

#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file *f;
    if (st_open_mem(data, size, &f) != TK_OK) return 0;
    volatile uint64_t sink = st_data_bytes(f);
    for (int64_t i = 0; i < st_n_tensors(f); i++) {
        const tk_tensor *t = st_tensor_at(f, i);
        if (!st_find_tensor(f, t->name)) __builtin_trap();
        const uint8_t *p = t->data;
        for (uint64_t k = 0; k < t->nbytes; k += 64) sink += p[k];
        if (t->nbytes) sink += p[t->nbytes - 1];
        for (int d = 0; d < 4; d++) sink += (uint64_t)t->ne[d];
    }
    for (int64_t i = 0; i < st_n_meta(f); i++) {
        const char *k, *v;
        if (st_meta_at(f, i, &k, &v) != TK_OK || st_meta_find(f, k) == NULL) __builtin_trap();
        for (const char *c = v; *c; c++) sink += (uint8_t)*c;
    }
    (void)sink;
    st_close(f);
    return 0;
}
