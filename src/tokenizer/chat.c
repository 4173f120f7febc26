/* Chat formatting without evaluating template code: the model's template is
 * only inspected to recognise its family, and each family is written out here
 * by hand, byte for byte as its official template renders it.
 *
 *   qwen3   ChatML with think blocks (Qwen3's template, no tools)
 *   llama3  <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
 *   chatml  <|im_start|>role\ncontent<|im_end|>\n (the fallback)
 *
 * The result holds no BOS text: encode it with tok_encode(add_bos=true,
 * parse_special=true), which adds BOS only where the vocabulary asks for it
 * (Llama-3 yes, Qwen no). */
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "tokenizer/tok_internal.h"

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_putn(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *q = tk_realloc(b->p, c);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_put(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

typedef enum chat_family { CHAT_CHATML, CHAT_QWEN3, CHAT_LLAMA3 } chat_family;

static chat_family family_of(const char *tmpl) {
    if (!tmpl) return CHAT_CHATML;
    if (strstr(tmpl, "<|start_header_id|>")) return CHAT_LLAMA3;
    if (strstr(tmpl, "<|im_start|>") && (strstr(tmpl, "<think>") || strstr(tmpl, "enable_thinking"))) return CHAT_QWEN3;
    return CHAT_CHATML;
}

static bool starts_with(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }
static bool ends_with(const char *s, const char *p) {
    size_t n = strlen(s), m = strlen(p);
    return n >= m && !strcmp(s + n - m, p);
}

/* [b, e) with '\n' trimmed from the chosen sides (Python's str.strip('\n')). */
static void trim_nl(const char **b, const char **e, bool left, bool right) {
    while (left && *b < *e && **b == '\n') (*b)++;
    while (right && *e > *b && (*e)[-1] == '\n') (*e)--;
}

/* Find the last occurrence of needle in [b, e). */
static const char *rfind(const char *b, const char *e, const char *needle) {
    size_t m = strlen(needle);
    if ((size_t)(e - b) < m) return NULL;
    for (const char *p = e - m;; p--) {
        if (!memcmp(p, needle, m)) return p;
        if (p == b) return NULL;
    }
}

static void qwen3_assistant(sbuf *b, const char *content, bool think_block) {
    /* Split an inline <think>...</think> off the content, as the template does
     * with content.split('</think>'). */
    const char *cb = content, *ce = content + strlen(content);
    const char *rb = "", *re = rb;
    const char *close = strstr(content, "</think>");
    if (close) {
        const char *last = rfind(content, ce, "</think>");
        cb = last + strlen("</think>");
        trim_nl(&cb, &ce, true, false);
        rb = content;
        re = close; /* split('</think>')[0] */
        trim_nl(&rb, &re, false, true);
        const char *open = rfind(rb, re, "<think>");
        if (open) rb = open + strlen("<think>"); /* .split('<think>')[-1] */
        trim_nl(&rb, &re, true, false);
    }
    sb_put(b, "<|im_start|>assistant\n");
    if (think_block) {
        const char *sb_ = rb, *se = re;
        trim_nl(&sb_, &se, true, true);
        sb_put(b, "<think>\n");
        sb_putn(b, sb_, (size_t)(se - sb_));
        sb_put(b, "\n</think>\n\n");
        trim_nl(&cb, &ce, true, false);
    }
    sb_putn(b, cb, (size_t)(ce - cb));
    sb_put(b, "<|im_end|>\n");
}

static bool has_reasoning(const char *content) {
    const char *close = strstr(content, "</think>");
    if (!close) return false;
    const char *rb = content, *re = close;
    trim_nl(&rb, &re, false, true);
    const char *open = rfind(rb, re, "<think>");
    if (open) rb = open + strlen("<think>");
    trim_nl(&rb, &re, true, false);
    return re > rb;
}

static void format_qwen3(sbuf *b, const tk_chat_msg *m, int n, bool gen, bool think) {
    int first = 0;
    if (n > 0 && !strcmp(m[0].role, "system")) {
        sb_put(b, "<|im_start|>system\n");
        sb_put(b, m[0].content);
        sb_put(b, "<|im_end|>\n");
    }
    /* The last user turn that is a real query (not a wrapped tool response). */
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (!strcmp(m[i].role, "user") &&
            !(starts_with(m[i].content, "<tool_response>") && ends_with(m[i].content, "</tool_response>"))) {
            last_query = i;
            break;
        }
    for (int i = first; i < n; i++) {
        const char *role = m[i].role, *c = m[i].content;
        if (!strcmp(role, "user") || (!strcmp(role, "system") && i != 0)) {
            sb_put(b, "<|im_start|>");
            sb_put(b, role);
            sb_put(b, "\n");
            sb_put(b, c);
            sb_put(b, "<|im_end|>\n");
        } else if (!strcmp(role, "assistant")) {
            bool think_block = i > last_query && (i == n - 1 || has_reasoning(c));
            qwen3_assistant(b, c, think_block);
        } else if (!strcmp(role, "tool")) {
            if (i == 0 || strcmp(m[i - 1].role, "tool")) sb_put(b, "<|im_start|>user");
            sb_put(b, "\n<tool_response>\n");
            sb_put(b, c);
            sb_put(b, "\n</tool_response>");
            if (i == n - 1 || strcmp(m[i + 1].role, "tool")) sb_put(b, "<|im_end|>\n");
        }
    }
    if (gen) {
        sb_put(b, "<|im_start|>assistant\n");
        if (!think) sb_put(b, "<think>\n\n</think>\n\n");
    }
}

static void format_chatml(sbuf *b, const tk_chat_msg *m, int n, bool gen) {
    for (int i = 0; i < n; i++) {
        sb_put(b, "<|im_start|>");
        sb_put(b, m[i].role);
        sb_put(b, "\n");
        sb_put(b, m[i].content);
        sb_put(b, "<|im_end|>\n");
    }
    if (gen) sb_put(b, "<|im_start|>assistant\n");
}

static void format_llama3(sbuf *b, const tk_chat_msg *m, int n, bool gen) {
    for (int i = 0; i < n; i++) {
        const char *c = m[i].content, *e = c + strlen(c);
        while (c < e && (*c == ' ' || *c == '\t' || *c == '\n' || *c == '\r')) c++; /* Jinja's | trim */
        while (e > c && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) e--;
        sb_put(b, "<|start_header_id|>");
        sb_put(b, m[i].role);
        sb_put(b, "<|end_header_id|>\n\n");
        sb_putn(b, c, (size_t)(e - c));
        sb_put(b, "<|eot_id|>");
    }
    if (gen) sb_put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

tk_status tok_chat_format(const tk_tokenizer *t, const tk_chat_msg *msgs, int n, bool add_generation_prompt,
                          bool enable_thinking, char **out) {
    *out = NULL;
    if (!t || (n > 0 && !msgs) || n < 0) return tk_fail(TK_ERR_INVALID, "tok_chat_format: bad arguments");
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) return tk_fail(TK_ERR_INVALID, "chat: message %d has no role or content", i);
        bool ok = false;
        for (size_t r = 0; r < 4; r++) ok |= !strcmp(msgs[i].role, roles[r]);
        if (!ok)
            return tk_fail(TK_ERR_INVALID, "chat: message %d has role '%.32s' (expected system, user, assistant or tool)",
                           i, msgs[i].role);
    }
    sbuf b = {0};
    switch (family_of(t->chat_template)) {
    case CHAT_QWEN3: format_qwen3(&b, msgs, n, add_generation_prompt, enable_thinking); break;
    case CHAT_LLAMA3: format_llama3(&b, msgs, n, add_generation_prompt); break;
    default: format_chatml(&b, msgs, n, add_generation_prompt); break;
    }
    sb_put(&b, ""); /* a valid empty string when there is nothing to format */
    if (b.oom) {
        tk_free(b.p);
        return tk_fail(TK_ERR_NOMEM, "chat: out of memory");
    }
    *out = b.p;
    return TK_OK;
}
