/* libFuzzer target: tokenizer.json (and, after a NUL byte, tokenizer_config.json)
 * through tok_load_json; a tokenizer that loads encodes texts (fixed ones and
 * the input's own tail), decodes them whole and streamed, and formats a chat. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void roundtrip(const tk_tokenizer *t, const char *text, size_t len, bool special) {
    size_t cap = tok_encode_bound(t, len), n = 0;
    int32_t *ids = malloc((cap ? cap : 1) * sizeof *ids);
    if (!ids) return;
    if (tok_encode(t, text, len, true, special, ids, cap, &n) != TK_OK)
        __builtin_trap(); /* sized by the bound */
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok_n_vocab(t)) __builtin_trap();
    tok_stream *s;
    if (tok_stream_init(t, special, &s) == TK_OK) {
        size_t sb = tok_stream_bound(t);
        char *out = malloc(sb);
        for (size_t i = 0; out && i < n; i++)
            if (tok_stream_push(s, ids[i], out, sb) > sb) __builtin_trap();
        if (out && tok_stream_flush(s, out, sb) > sb) __builtin_trap();
        free(out);
        tok_stream_free(s);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t jl = nul ? (size_t)(nul - data) : size;
    char *cfg = NULL;
    if (nul) { /* the config is NUL-terminated text */
        size_t cl = size - jl - 1;
        cfg = malloc(cl + 1);
        if (!cfg) return 0;
        memcpy(cfg, nul + 1, cl);
        cfg[cl] = 0;
    }
    tk_tokenizer *t = NULL;
    if (tok_load_json((const char *)data, jl, cfg, &t) == TK_OK) {
        static const char *const texts[] = {"Hello, world! 123 4567 's 'LL",
                                            "<|im_start|>user\nhi<|im_end|>\n<think>x</think>",
                                            "\xff\xc0\xaf \xe4\xb8 e\xcc\x81 \xf0\x9f\x98\x80  \t\n\n x"};
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
            roundtrip(t, texts[i], strlen(texts[i]), true);
            roundtrip(t, texts[i], strlen(texts[i]), false);
        }
        size_t tail = size < 256 ? size : 256; /* the input's own bytes as text */
        roundtrip(t, (const char *)data + size - tail, tail, true);
        const tk_chat_message msgs[] = {{"system", "sys <|im_end|>"},
                                        {"user", "hi <|endoftext|>"},
                                        {"assistant", "<think>\nr\n</think>\n\na"},
                                        {"tool", "r"}};
        int32_t *ids = NULL;
        size_t n = 0;
        if (tok_chat_encode(t, msgs, 4, true, true, &ids, &n) == TK_OK)
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= tok_n_vocab(t)) __builtin_trap();
        tk_free(ids);
        (void)tok_chat_family(t);
        tok_free(t);
    }
    free(cfg);
    return 0;
}
