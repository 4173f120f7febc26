/* libFuzzer target: gguf_open_mem on arbitrary bytes, then walk every kv, every
 * array element through the accessors, every tensor's bytes, and every lookup. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "format/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f;
    if (gguf_open_mem(data, size, &f) != TK_OK) return 0;
    volatile uint64_t sink = gguf_version(f) + gguf_alignment(f) + gguf_file_size(f);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        char key[128];
        size_t kl = kv->key.len < sizeof key - 1 ? (size_t)kv->key.len : sizeof key - 1;
        memcpy(key, kv->key.ptr, kl);
        key[kl] = 0;
        (void)gguf_find(f, key); /* may miss when the key holds a NUL or was cut */
        uint32_t u;
        int64_t i64;
        float x;
        bool b;
        gguf_str s;
        (void)gguf_get_u32(f, key, 0, &u);
        (void)gguf_get_i64(f, key, 0, &i64);
        (void)gguf_get_f32(f, key, 0, &x);
        (void)gguf_get_bool(f, key, false, &b);
        (void)gguf_get_str(f, key, &s, &b);
        if (kv->type == GGUF_T_STRING)
            for (uint64_t k = 0; k < kv->v.s.len; k++) sink += (uint8_t)kv->v.s.ptr[k];
        if (kv->type != GGUF_T_ARRAY) continue;
        for (uint64_t k = 0; k < kv->arr_n; k++) {
            if (kv->arr_type == GGUF_T_STRING) {
                if (gguf_arr_str(kv, k, &s) == TK_OK)
                    for (uint64_t c = 0; c < s.len; c++) sink += (uint8_t)s.ptr[c];
            } else {
                if (gguf_arr_i64(kv, k, &i64) == TK_OK) sink += (uint64_t)i64;
                if (gguf_arr_f32(kv, k, &x) == TK_OK) sink += x > 0;
            }
        }
        (void)gguf_arr_i64(kv, kv->arr_n, &i64); /* one past the end: must be refused */
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const tk_tensor *t = gguf_tensor_at(f, i);
        if (gguf_find_tensor(f, t->name) != t) __builtin_trap();
        const uint8_t *p = t->data;
        for (uint64_t k = 0; k < t->nbytes; k += 64) sink += p[k];
        if (t->nbytes) sink += p[t->nbytes - 1];
    }
    (void)sink;
    gguf_close(f);
    return 0;
}
