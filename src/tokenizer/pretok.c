/* Pre-tokenizer regexes: the known Split patterns, recognised by their exact
 * text (tokenizer.json) or by GGUF's tokenizer.ggml.pre name, compiled with
 * PCRE2 (UTF + Unicode properties, JIT when available).
 *
 * Why a table and not "compile whatever the file says": a pattern we have not
 * checked against Hugging Face may split text differently without any error, so
 * an unknown pattern is refused at load instead. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "tokenizer/tok_internal.h"

typedef struct pre_pattern {
    const char *canon;   /* the name tok_pre_name reports */
    const char *names;   /* GGUF tokenizer.ggml.pre values that mean this pattern, '|'-separated */
    const char *hf;      /* the regex as tokenizer.json spells it */
    const char *compile; /* what PCRE2 compiles: the same language, spelled for PCRE2 */
} pre_pattern;

/* (?i:'s|...) is spelled with ASCII classes: HF and transformers.js only fold
 * ASCII here, while PCRE2's caseless mode would also let "ſ" match "s". */
#define CONTRACTIONS "'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])"

static const pre_pattern PATTERNS[] = {
    {"qwen2", "qwen2|deepseek-r1-qwen",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
     "\\s+(?!\\S)|\\s+",
     CONTRACTIONS
     "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {"llama-bpe", "llama-bpe|llama3|smaug-bpe",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
     "\\s+(?!\\S)|\\s+",
     CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {"gpt2", "gpt2|gpt-2",
     "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
     "'(?:s|t|re|ve|m|ll|d)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
};

static bool name_in(const char *names, const char *name) {
    size_t n = strlen(name);
    for (const char *p = names; *p;) {
        const char *e = strchr(p, '|');
        size_t m = e ? (size_t)(e - p) : strlen(p);
        if (m == n && !memcmp(p, name, n)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

const char *tok_pre_from_regex(const char *regex) {
    for (size_t i = 0; i < sizeof PATTERNS / sizeof PATTERNS[0]; i++)
        if (!strcmp(regex, PATTERNS[i].hf)) return PATTERNS[i].canon;
    return NULL;
}

static void *gctx_malloc(size_t n, void *ud) {
    (void)ud;
    return tk_malloc(n ? n : 1);
}
static void gctx_free(void *p, void *ud) {
    (void)ud;
    tk_free(p);
}

tk_status tok_compile_pre(tk_tokenizer *t) {
    const pre_pattern *pp = NULL;
    for (size_t i = 0; i < sizeof PATTERNS / sizeof PATTERNS[0]; i++)
        if (name_in(PATTERNS[i].names, t->pre_name)) pp = &PATTERNS[i];
    if (!pp)
        return tk_fail(TK_ERR_UNSUPPORTED,
                       "tokenizer: pre-tokenizer '%s' is not supported (known: qwen2, llama-bpe, gpt2)",
                       t->pre_name);
    size_t cn = strlen(pp->canon);
    memcpy(t->pre_name, pp->canon, cn + 1); /* canon names are short constants */
    pcre2_general_context *g = pcre2_general_context_create(gctx_malloc, gctx_free, NULL);
    if (!g) return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    pcre2_compile_context *cc = pcre2_compile_context_create(g);
    if (!cc) {
        pcre2_general_context_free(g);
        return tk_fail(TK_ERR_NOMEM, "tokenizer: out of memory");
    }
    int err = 0;
    PCRE2_SIZE erroff = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pp->compile, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &err, &erroff, cc);
    pcre2_compile_context_free(cc);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        pcre2_general_context_free(g);
        return tk_fail(TK_ERR_INTERNAL, "tokenizer: pre-tokenizer regex: %s at %zu", (const char *)msg,
                       (size_t)erroff);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT the interpreter gives the same matches */
    t->re = re;
    t->re_gctx = g;
    return TK_OK;
}

void tok_free_pre(tk_tokenizer *t) {
    if (t->re) pcre2_code_free((pcre2_code *)t->re);
    if (t->re_gctx) pcre2_general_context_free((pcre2_general_context *)t->re_gctx);
    t->re = NULL;
    t->re_gctx = NULL;
}
