/* libFuzzer target: the GGUF vocabulary (tokenizer.ggml.*) through gguf_open_mem
 * and tok_load_gguf; a vocabulary that loads encodes, decodes and formats a chat. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f;
    if (gguf_open_mem(data, size, &f) != TK_OK) return 0;
    tk_tokenizer *t = NULL;
    if (tok_load_gguf(f, &t) == TK_OK) {
        static const char *const texts[] = {"hello world", " <s>hello</s> \xe2\x96\x81",
                                            "\xff\xc3\xa9 12 'll\n"};
        for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
            size_t len = strlen(texts[k]), cap = tok_encode_bound(t, len), n = 0;
            int32_t *ids = malloc((cap ? cap : 1) * sizeof *ids);
            if (!ids) break;
            /* A vocabulary with no byte fallback and no <unk> cannot encode every
             * character: refused with TK_ERR_INVALID, never anything else. */
            tk_status st = tok_encode(t, texts[k], len, true, k != 0, ids, cap, &n);
            if (st == TK_ERR_INVALID) {
                free(ids);
                continue;
            }
            if (st != TK_OK) {
                fprintf(stderr, "encode failed on a vocabulary that loaded: %s\n", tk_last_error());
                __builtin_trap();
            }
            tok_stream *s;
            if (tok_stream_init(t, true, &s) == TK_OK) {
                size_t sb = tok_stream_bound(t);
                char *out = malloc(sb);
                for (size_t i = 0; out && i < n; i++) {
                    if (ids[i] < 0 || ids[i] >= tok_n_vocab(t)) __builtin_trap();
                    if (tok_stream_push(s, ids[i], out, sb) > sb) __builtin_trap();
                }
                if (out && tok_stream_flush(s, out, sb) > sb) __builtin_trap();
                free(out);
                tok_stream_free(s);
            }
            free(ids);
        }
        const tk_chat_message msgs[] = {{"user", "hi"}, {"assistant", "a"}};
        int32_t *ids = NULL;
        size_t n = 0;
        (void)tok_chat_encode(t, msgs, 2, true, false, &ids, &n);
        tk_free(ids);
        tok_free(t);
    }
    gguf_close(f);
    return 0;
}
