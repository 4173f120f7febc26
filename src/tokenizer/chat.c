/* Chat formatting without evaluating template code: the model's template is
 * only inspected to recognise its family, and each family is written out here
 * by hand, byte for byte as its official template renders it.
 *
 *   qwen3   ChatML with think blocks (Qwen3's template, no tools)
 *   llama3  <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
 *   chatml  <|im_start|>role\ncontent<|im_end|>\n (the fallback)
 *
 * The text is built together with the byte ranges of the format's own markers
 * and encoded with tok_encode_marked, so only those become control tokens: a
 * special token written in a message is text. The result never exists as a
 * string a caller could re-encode with parse_special. BOS is prepended where
 * the vocabulary asks for it (Llama-3 yes, Qwen no). */
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/error.h"
#include "tokenizer/tok_internal.h"

typedef struct sbuf {
    char *p;
    size_t n, cap;
    tok_range *marks; /* (n_marks) the markers' bytes in p */
    size_t n_marks, cap_marks;
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

/* Template text (ASCII literals and role names). */
static void sb_put(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

/* A marker of the format: the only place a special token may match. */
static void sb_mark(sbuf *b, const char *s) {
    if (b->oom) return;
    if (b->n_marks == b->cap_marks) {
        size_t c = b->cap_marks ? 2 * b->cap_marks : 16;
        tok_range *q = tk_realloc(b->marks, c * sizeof *q);
        if (!q) {
            b->oom = true;
            return;
        }
        b->marks = q;
        b->cap_marks = c;
    }
    size_t at = b->n;
    sb_putn(b, s, strlen(s));
    if (!b->oom) b->marks[b->n_marks++] = (tok_range){at, b->n};
}

/* Message content [s, s + n): invalid UTF-8 becomes U+FFFD here, so the
 * assembled text is valid and the marks keep their offsets. */
static void sb_content(sbuf *b, const char *s, size_t n) {
    if (tok_utf8_valid(s, n)) {
        sb_putn(b, s, n);
        return;
    }
    size_t need;
    char *r = tk_mul_size(n, 3, &need) ? tk_malloc(need ? need : 1) : NULL;
    if (!r) {
        b->oom = true;
        return;
    }
    sb_putn(b, r, tok_utf8_repair(s, n, r));
    tk_free(r);
}

static void sb_content0(sbuf *b, const char *s) { sb_content(b, s, strlen(s)); }

typedef enum chat_family { CHAT_CHATML, CHAT_QWEN3, CHAT_LLAMA3 } chat_family;

static chat_family family_of(const char *tmpl) {
    if (!tmpl) return CHAT_CHATML;
    if (strstr(tmpl, "<|start_header_id|>")) return CHAT_LLAMA3;
    if (strstr(tmpl, "<|im_start|>") && (strstr(tmpl, "<think>") || strstr(tmpl, "enable_thinking")))
        return CHAT_QWEN3;
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
    sb_mark(b, "<|im_start|>");
    sb_put(b, "assistant\n");
    if (think_block) {
        const char *sb_ = rb, *se = re;
        trim_nl(&sb_, &se, true, true);
        sb_put(b, "<think>\n");
        sb_content(b, sb_, (size_t)(se - sb_));
        sb_put(b, "\n</think>\n\n");
        trim_nl(&cb, &ce, true, false);
    }
    sb_content(b, cb, (size_t)(ce - cb));
    sb_mark(b, "<|im_end|>");
    sb_put(b, "\n");
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

/* <|im_start|>role\ncontent<|im_end|>\n */
static void chatml_turn(sbuf *b, const char *role, const char *content) {
    sb_mark(b, "<|im_start|>");
    sb_put(b, role);
    sb_put(b, "\n");
    sb_content0(b, content);
    sb_mark(b, "<|im_end|>");
    sb_put(b, "\n");
}

static void format_qwen3(sbuf *b, const tk_chat_message *m, int n, bool gen, bool think) {
    /* The last user turn that is a real query (not a wrapped tool response). */
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (!strcmp(m[i].role, "user") &&
            !(starts_with(m[i].content, "<tool_response>") && ends_with(m[i].content, "</tool_response>"))) {
            last_query = i;
            break;
        }
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role, *c = m[i].content;
        if (!strcmp(role, "user") || !strcmp(role, "system")) {
            chatml_turn(b, role, c);
        } else if (!strcmp(role, "assistant")) {
            bool think_block = i > last_query && (i == n - 1 || has_reasoning(c));
            qwen3_assistant(b, c, think_block);
        } else if (!strcmp(role, "tool")) {
            if (i == 0 || strcmp(m[i - 1].role, "tool")) {
                sb_mark(b, "<|im_start|>");
                sb_put(b, "user");
            }
            sb_put(b, "\n<tool_response>\n");
            sb_content0(b, c);
            sb_put(b, "\n</tool_response>");
            if (i == n - 1 || strcmp(m[i + 1].role, "tool")) {
                sb_mark(b, "<|im_end|>");
                sb_put(b, "\n");
            }
        }
    }
    if (gen) {
        sb_mark(b, "<|im_start|>");
        sb_put(b, "assistant\n");
        if (!think) sb_put(b, "<think>\n\n</think>\n\n");
    }
}

static void format_chatml(sbuf *b, const tk_chat_message *m, int n, bool gen) {
    for (int i = 0; i < n; i++) chatml_turn(b, m[i].role, m[i].content);
    if (gen) {
        sb_mark(b, "<|im_start|>");
        sb_put(b, "assistant\n");
    }
}

static void llama3_header(sbuf *b, const char *role) {
    sb_mark(b, "<|start_header_id|>");
    sb_put(b, role);
    sb_mark(b, "<|end_header_id|>");
    sb_put(b, "\n\n");
}

static void format_llama3(sbuf *b, const tk_chat_message *m, int n, bool gen) {
    for (int i = 0; i < n; i++) {
        const char *c = m[i].content, *e = c + strlen(c);
        while (c < e && (*c == ' ' || *c == '\t' || *c == '\n' || *c == '\r')) c++; /* Jinja's | trim */
        while (e > c && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) e--;
        llama3_header(b, m[i].role);
        sb_content(b, c, (size_t)(e - c));
        sb_mark(b, "<|eot_id|>");
    }
    if (gen) llama3_header(b, "assistant");
}

const char *tok_chat_family(const tk_tokenizer *t) {
    switch (family_of(t->chat_template)) {
    case CHAT_QWEN3:
        return "qwen3";
    case CHAT_LLAMA3:
        return "llama3";
    default:
        return "chatml";
    }
}

tk_status tok_chat_encode(const tk_tokenizer *t, const tk_chat_message *msgs, int n,
                          bool add_generation_prompt, bool enable_thinking, int32_t **ids, size_t *n_ids) {
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (!t || (n > 0 && !msgs) || n < 0 || !ids || !n_ids)
        return tk_fail(TK_ERR_INVALID, "chat: bad arguments");
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return tk_fail(TK_ERR_INVALID, "chat: message %d has no role or content", i);
        bool ok = false;
        for (size_t r = 0; r < 4; r++) ok |= !strcmp(msgs[i].role, roles[r]);
        if (!ok)
            return tk_fail(TK_ERR_INVALID,
                           "chat: message %d has role '%.32s' (expected system, user, assistant or tool)", i,
                           msgs[i].role);
    }
    sbuf b = {0};
    switch (family_of(t->chat_template)) {
    case CHAT_QWEN3:
        format_qwen3(&b, msgs, n, add_generation_prompt, enable_thinking);
        break;
    case CHAT_LLAMA3:
        format_llama3(&b, msgs, n, add_generation_prompt);
        break;
    default:
        format_chatml(&b, msgs, n, add_generation_prompt);
        break;
    }
    tk_status st = TK_OK;
    int32_t *out = NULL;
    size_t cap = tok_encode_bound(t, b.n), got = 0;
    if (b.oom || cap > SIZE_MAX / sizeof *out || !(out = tk_malloc((cap ? cap : 1) * sizeof *out))) {
        st = tk_fail(TK_ERR_NOMEM, "chat: out of memory");
    } else if (!(st = tok_encode_marked(t, b.p ? b.p : "", b.n, b.marks, b.n_marks, true, out, cap, &got))) {
        int32_t *fit = tk_realloc(out, (got ? got : 1) * sizeof *out); /* give back the bound's slack */
        *ids = fit ? fit : out;
        *n_ids = got;
        out = NULL;
    }
    tk_free(out);
    tk_free(b.p);
    tk_free(b.marks);
    return st;
}
