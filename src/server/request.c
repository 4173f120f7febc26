/* JSON request bodies to validated requests. Every value is checked for type
 * and range here, so nothing that reaches the engine can fail its checks for
 * a reason the client could have been told about. */
#include "server/request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SRV_MAX_TOKENS     (1 << 24)
#define SRV_MAX_STOP_BYTES 4096
#define SRV_MAX_MSGS       4096

void srv_error_set(srv_error *err, int status, const char *type, const char *code, const char *param,
                   const char *fmt, ...) {
    err->status = status;
    err->type = type;
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

char *srv_error_json(const srv_error *err) {
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    if (!e) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(e, "message", err->message);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : "invalid_request_error");
    if (err->param[0])
        cJSON_AddStringToObject(e, "param", err->param);
    else
        cJSON_AddNullToObject(e, "param");
    if (err->code)
        cJSON_AddStringToObject(e, "code", err->code);
    else
        cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

void srv_req_free(srv_req *r) {
    if (!r) return;
    free(r->model);
    free(r->prompt_text);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_msgs; i++) {
        free(r->msgs[i].role);
        free(r->msgs[i].content);
    }
    free(r->msgs);
    free(r->bias);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

/* ---- typed field readers: false with *err set on a wrong type or range ---- */

static bool bad(srv_error *err, const char *param, const char *fmt, const char *what) {
    srv_error_set(err, 400, "invalid_request_error", NULL, param, fmt, param, what);
    return false;
}

static bool is_null(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* A number in [lo, hi] (finite). */
static bool get_num(const cJSON *o, const char *key, double lo, double hi, double *out, bool *set,
                    srv_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (set) *set = false;
    if (is_null(v)) return true;
    if (!cJSON_IsNumber(v)) return bad(err, key, "'%s' must be a number%s", "");
    double d = v->valuedouble;
    if (!isfinite(d) || d < lo || d > hi) {
        srv_error_set(err, 400, "invalid_request_error", NULL, key,
                      "'%s' must be a finite number in [%g, %g]", key, lo, hi);
        return false;
    }
    *out = d;
    if (set) *set = true;
    return true;
}

/* An integer in [lo, hi] (a JSON number with no fractional part). */
static bool get_int(const cJSON *o, const char *key, double lo, double hi, double *out, bool *set,
                    srv_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (set) *set = false;
    if (is_null(v)) return true;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!isfinite(d) || d != floor(d) || d < lo || d > hi) {
        srv_error_set(err, 400, "invalid_request_error", NULL, key, "'%s' must be an integer in [%.0f, %.0f]",
                      key, lo, hi);
        return false;
    }
    *out = d;
    if (set) *set = true;
    return true;
}

static bool get_bool(const cJSON *o, const char *key, bool *out, srv_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (is_null(v)) return true;
    if (!cJSON_IsBool(v)) return bad(err, key, "'%s' must be a boolean%s", "");
    *out = cJSON_IsTrue(v);
    return true;
}

/* A token id list [0, n_vocab); *ids malloc'd (NULL for an empty list). */
static bool get_ids(const cJSON *arr, const char *param, int n_vocab, int32_t **ids, int *n, srv_error *err) {
    int k = cJSON_GetArraySize(arr);
    if (k > SRV_MAX_TOKENS) return bad(err, param, "'%s' holds too many tokens%s", "");
    int32_t *out = k ? malloc((size_t)k * sizeof *out) : NULL;
    if (k && !out) {
        srv_error_set(err, 500, "server_error", NULL, param, "out of memory");
        return false;
    }
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        if (!isfinite(d) || d != floor(d)) {
            free(out);
            return bad(err, param, "'%s' must hold integer token ids%s", "");
        }
        if (d < 0 || d >= n_vocab) {
            free(out);
            srv_error_set(err, 400, "invalid_request_error", NULL, param,
                          "token id %.0f in '%s' is outside the vocabulary [0, %d)", d, param, n_vocab);
            return false;
        }
        out[i++] = (int32_t)d;
    }
    *ids = out;
    *n = i;
    return true;
}

static char *dup_str(const char *s, srv_error *err) {
    char *d = strdup(s);
    if (!d) srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    return d;
}

/* ---- the pieces of a request ------------------------------------------------ */

/* prompt: "text", [ids], ["text"] or [[ids]]; one prompt per request. */
static bool parse_prompt(const cJSON *v, const char *param, const srv_limits *lim, srv_req *r,
                         srv_error *err) {
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 &&
        (cJSON_IsString(v->child) || cJSON_IsArray(v->child)))
        v = v->child; /* a batch of one */
    if (cJSON_IsString(v)) {
        r->prompt_len = strlen(v->valuestring);
        return (r->prompt_text = dup_str(v->valuestring, err)) != NULL;
    }
    if (cJSON_IsArray(v)) {
        if (v->child && (cJSON_IsString(v->child) || cJSON_IsArray(v->child))) {
            srv_error_set(err, 400, "invalid_request_error", NULL, param,
                          "'%s' holds %d prompts; this server takes one prompt per request", param,
                          cJSON_GetArraySize(v));
            return false;
        }
        if (!get_ids(v, param, lim->n_vocab, &r->prompt_ids, &r->n_prompt_ids, err)) return false;
        if (r->n_prompt_ids == 0) return bad(err, param, "'%s' is empty%s", "");
        return true;
    }
    return bad(err, param, "'%s' must be a string or a list of token ids%s", "");
}

static bool parse_messages(const cJSON *v, srv_req *r, srv_error *err) {
    if (!cJSON_IsArray(v)) return bad(err, "messages", "'%s' must be a list of messages%s", "");
    int n = cJSON_GetArraySize(v);
    if (n == 0) return bad(err, "messages", "'%s' is empty%s", "");
    if (n > SRV_MAX_MSGS) return bad(err, "messages", "'%s' holds too many messages%s", "");
    r->msgs = calloc((size_t)n, sizeof *r->msgs);
    if (!r->msgs) {
        srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, v) {
        srv_msg *out = &r->msgs[r->n_msgs];
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", r->n_msgs);
        if (!cJSON_IsObject(m)) return bad(err, param, "'%s' must be an object%s", "");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role)) return bad(err, param, "'%s' needs a string 'role'%s", "");
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer")) rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant")) {
            srv_error_set(err, 400, "invalid_request_error", NULL, param,
                          "'%s' has role '%.64s'; expected system, developer, user or assistant%s", param,
                          role->valuestring,
                          !strcmp(role->valuestring, "tool") ? " (tool calls are not supported)" : "");
            return false;
        }
        if (cJSON_GetObjectItemCaseSensitive(m, "tool_calls") &&
            !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(m, "tool_calls"))) {
            srv_error_set(err, 400, "invalid_request_error", NULL, param,
                          "'%s' holds tool_calls; tool calls are not supported", param);
            return false;
        }
        if (!(out->role = dup_str(rs, err))) return false;
        r->n_msgs++; /* from here the message is owned by r */
        if (is_null(content) && !strcmp(rs, "assistant")) {
            if (!(out->content = dup_str("", err))) return false;
        } else if (cJSON_IsString(content)) {
            if (!(out->content = dup_str(content->valuestring, err))) return false;
        } else if (cJSON_IsArray(content)) {
            /* content parts: text only */
            size_t total = 1;
            const cJSON *p;
            cJSON_ArrayForEach(p, content) {
                const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
                if (!cJSON_IsObject(p) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text") ||
                    !cJSON_IsString(tx)) {
                    srv_error_set(
                        err, 400, "invalid_request_error", NULL, param,
                        "'%s' content parts must be {\"type\": \"text\", \"text\": ...}; only text is "
                        "supported",
                        param);
                    return false;
                }
                total += strlen(tx->valuestring);
            }
            if (!(out->content = malloc(total))) {
                srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
                return false;
            }
            out->content[0] = 0;
            size_t at = 0;
            cJSON_ArrayForEach(p, content) {
                const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
                size_t l = strlen(t);
                memcpy(out->content + at, t, l + 1);
                at += l;
            }
        } else {
            return bad(err, param, "'%s' needs 'content' as a string or a list of text parts%s", "");
        }
    }
    return true;
}

static bool parse_stop(const cJSON *v, srv_req *r, srv_error *err) {
    if (is_null(v)) return true;
    if (cJSON_IsString(v)) {
        if (!v->valuestring[0]) return true; /* "" stops nothing */
    } else if (!cJSON_IsArray(v)) {
        return bad(err, "stop", "'%s' must be a string or a list of strings%s", "");
    }
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > TK_MAX_STOP) {
        srv_error_set(err, 400, "invalid_request_error", NULL, "stop", "'stop' holds %d strings; at most %d",
                      cJSON_GetArraySize(v), TK_MAX_STOP);
        return false;
    }
    const cJSON *s;
    const cJSON *one = cJSON_IsString(v) ? v : NULL;
    for (s = one ? one : v->child; s; s = one ? NULL : s->next) {
        if (!cJSON_IsString(s)) return bad(err, "stop", "'%s' must hold strings%s", "");
        size_t l = strlen(s->valuestring);
        if (l == 0) continue;
        if (l > SRV_MAX_STOP_BYTES) {
            srv_error_set(err, 400, "invalid_request_error", NULL, "stop",
                          "a stop string of %zu bytes; at most %d", l, SRV_MAX_STOP_BYTES);
            return false;
        }
        if (!(r->stop[r->n_stop] = dup_str(s->valuestring, err))) return false;
        r->n_stop++;
    }
    return true;
}

static bool parse_logit_bias(const cJSON *v, const srv_limits *lim, srv_req *r, srv_error *err) {
    if (is_null(v)) return true;
    if (!cJSON_IsObject(v)) return bad(err, "logit_bias", "'%s' must be an object of token id -> bias%s", "");
    int n = cJSON_GetArraySize(v);
    if (n == 0) return true;
    if (n > lim->n_vocab) return bad(err, "logit_bias", "'%s' holds more entries than the vocabulary%s", "");
    r->bias = calloc((size_t)n, sizeof *r->bias);
    if (!r->bias) {
        srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        char *end;
        long id = strtol(e->string, &end, 10);
        if (!e->string[0] || *end || end == e->string) {
            srv_error_set(err, 400, "invalid_request_error", NULL, "logit_bias",
                          "'logit_bias' key '%.64s' is not a token id", e->string);
            return false;
        }
        if (id < 0 || id >= lim->n_vocab) {
            srv_error_set(err, 400, "invalid_request_error", NULL, "logit_bias",
                          "'logit_bias' token id %ld is outside the vocabulary [0, %d)", id, lim->n_vocab);
            return false;
        }
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble < -100 ||
            e->valuedouble > 100) {
            srv_error_set(err, 400, "invalid_request_error", NULL, "logit_bias",
                          "'logit_bias' values must be numbers in [-100, 100]");
            return false;
        }
        /* -100 bans the token, as OpenAI documents. */
        float b = e->valuedouble <= -100 ? -INFINITY : (float)e->valuedouble;
        r->bias[r->sampling.n_logit_bias++] = (tk_logit_bias){.token = (int32_t)id, .bias = b};
    }
    r->sampling.logit_bias = r->bias;
    return true;
}

/* Fields that ask for what this server does not do: refuse them clearly rather than ignore them. */
static bool refuse_unsupported(const cJSON *root, srv_kind kind, srv_error *err) {
    static const char *const tools[] = {"tools", "tool_choice", "functions", "function_call"};
    for (size_t i = 0; i < sizeof tools / sizeof tools[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, tools[i]);
        if (!is_null(v) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0) &&
            !(cJSON_IsString(v) && !strcmp(v->valuestring, "none"))) {
            srv_error_set(err, 400, "invalid_request_error", "unsupported_parameter", tools[i],
                          "'%s' is not supported: this server does not do tool or function calling",
                          tools[i]);
            return false;
        }
    }
    double d = 1;
    if (!get_int(root, "n", 1, 1, &d, NULL, err)) {
        srv_error_set(err, 400, "invalid_request_error", "unsupported_parameter", "n",
                      "'n' must be 1: this server returns one choice per request");
        return false;
    }
    if (!get_int(root, "best_of", 1, 1, &d, NULL, err)) {
        srv_error_set(err, 400, "invalid_request_error", "unsupported_parameter", "best_of",
                      "'best_of' must be 1");
        return false;
    }
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (!is_null(rf)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text")) {
            srv_error_set(
                err, 400, "invalid_request_error", "unsupported_parameter", "response_format",
                "'response_format' must be {\"type\": \"text\"}: structured output is not supported");
            return false;
        }
    }
    if (kind == SRV_COMPLETION) {
        bool echo = false;
        if (!get_bool(root, "echo", &echo, err)) return false;
        if (echo) {
            srv_error_set(err, 400, "invalid_request_error", "unsupported_parameter", "echo",
                          "'echo' is not supported");
            return false;
        }
        const cJSON *sfx = cJSON_GetObjectItemCaseSensitive(root, "suffix");
        if (!is_null(sfx) && !(cJSON_IsString(sfx) && !sfx->valuestring[0])) {
            srv_error_set(err, 400, "invalid_request_error", "unsupported_parameter", "suffix",
                          "'suffix' is not supported");
            return false;
        }
    }
    return true;
}

static bool parse_generation(const cJSON *root, const srv_limits *lim, srv_req *r, srv_error *err) {
    double d;
    bool set;
    tk_sampling *s = &r->sampling;
    if (!refuse_unsupported(root, r->kind, err)) return false;
    if (!get_bool(root, "stream", &r->stream, err)) return false;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (!is_null(so)) {
        if (!cJSON_IsObject(so)) return bad(err, "stream_options", "'%s' must be an object%s", "");
        if (!get_bool(so, "include_usage", &r->include_usage, err)) return false;
    }
    /* max_completion_tokens is the newer name; either works, the newer wins. */
    if (!get_int(root, "max_tokens", 1, SRV_MAX_TOKENS, &d, &set, err)) return false;
    if (set) r->max_tokens = (int)d;
    if (!get_int(root, "max_completion_tokens", 1, SRV_MAX_TOKENS, &d, &set, err)) return false;
    if (set) r->max_tokens = (int)d;
    if (r->kind == SRV_COMPLETION && !cJSON_GetObjectItemCaseSensitive(root, "max_tokens"))
        r->max_tokens = 16; /* OpenAI's completions default */
    if (!get_num(root, "temperature", 0, 100, &d, &set, err)) return false;
    if (set) s->temperature = (float)d;
    if (!get_num(root, "top_p", 0, 1, &d, &set, err)) return false;
    if (set) {
        if (d <= 0) {
            srv_error_set(err, 400, "invalid_request_error", NULL, "top_p", "'top_p' must be in (0, 1]");
            return false;
        }
        s->top_p = (float)d;
    }
    if (!get_int(root, "top_k", -1, 1e9, &d, &set, err)) return false;
    if (set) s->top_k = d < 0 ? 0 : (int)d; /* -1 and 0: off */
    if (!get_num(root, "min_p", 0, 1, &d, &set, err)) return false;
    if (set) s->min_p = (float)d;
    if (!get_num(root, "presence_penalty", -2, 2, &d, &set, err)) return false;
    if (set) s->presence_penalty = (float)d;
    if (!get_num(root, "frequency_penalty", -2, 2, &d, &set, err)) return false;
    if (set) s->frequency_penalty = (float)d;
    if (!get_num(root, "repetition_penalty", 0, 100, &d, &set, err)) return false;
    if (set) {
        if (d <= 0) {
            srv_error_set(err, 400, "invalid_request_error", NULL, "repetition_penalty",
                          "'repetition_penalty' must be > 0 (1: off)");
            return false;
        }
        s->repetition_penalty = (float)d;
    }
    /* Seeds are integers a double holds exactly; negative ones are as good as any. */
    if (!get_int(root, "seed", -9007199254740992.0, 9007199254740992.0, &d, &set, err)) return false;
    if (set) s->seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
    r->seed_set = set;
    if (!get_bool(root, "ignore_eos", &r->ignore_eos, err)) return false;
    if (!parse_stop(cJSON_GetObjectItemCaseSensitive(root, "stop"), r, err)) return false;
    if (!parse_logit_bias(cJSON_GetObjectItemCaseSensitive(root, "logit_bias"), lim, r, err)) return false;
    /* logprobs: an integer count for completions; a boolean plus top_logprobs for chat. */
    if (r->kind == SRV_COMPLETION) {
        if (!get_int(root, "logprobs", 0, TK_MAX_LOGPROBS, &d, &set, err)) return false;
        if (set) {
            s->logprobs = true;
            s->n_logprobs = (int)d;
        }
    } else {
        if (!get_bool(root, "logprobs", &s->logprobs, err)) return false;
        if (!get_int(root, "top_logprobs", 0, TK_MAX_LOGPROBS, &d, &set, err)) return false;
        if (set) {
            if (!s->logprobs && d > 0) {
                srv_error_set(err, 400, "invalid_request_error", NULL, "top_logprobs",
                              "'top_logprobs' needs 'logprobs': true");
                return false;
            }
            s->n_logprobs = (int)d;
        }
        const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
        if (!is_null(kw)) {
            if (!cJSON_IsObject(kw)) return bad(err, "chat_template_kwargs", "'%s' must be an object%s", "");
            if (!get_bool(kw, "enable_thinking", &r->enable_thinking, err)) {
                snprintf(err->param, sizeof err->param, "chat_template_kwargs.enable_thinking");
                return false;
            }
        }
    }
    return true;
}

bool srv_req_parse(const char *body, size_t len, srv_kind kind, const srv_limits *lim, srv_req *out,
                   srv_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->kind = kind;
    out->enable_thinking = true;
    out->add_special = true;
    tk_sampling_default(&out->sampling);
    out->sampling.temperature = 1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        srv_error_set(err, 400, "invalid_request_error", "invalid_json", NULL,
                      "the request body is not valid JSON (near byte %zu)", at);
        return false;
    }
    /* Nothing but whitespace may follow the value. */
    for (const char *p = end; p && p < body + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            srv_error_set(err, 400, "invalid_request_error", "invalid_json", NULL,
                          "the request body is not valid JSON (trailing bytes at %zu)", (size_t)(p - body));
            return false;
        }
    bool ok = false;
    if (!cJSON_IsObject(root)) {
        srv_error_set(err, 400, "invalid_request_error", NULL, NULL,
                      "the request body must be a JSON object");
        goto done;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!is_null(model)) {
        if (!cJSON_IsString(model)) {
            bad(err, "model", "'%s' must be a string%s", "");
            goto done;
        }
        if (lim->model_name && strcmp(model->valuestring, lim->model_name)) {
            srv_error_set(err, 400, "invalid_request_error", "model_not_found", "model",
                          "the model '%.128s' does not exist; this server serves '%.128s'",
                          model->valuestring, lim->model_name);
            goto done;
        }
        if (!(out->model = dup_str(model->valuestring, err))) goto done;
    }
    const cJSON *v;
    switch (kind) {
    case SRV_COMPLETION:
        v = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        if (is_null(v)) {
            bad(err, "prompt", "'%s' is required%s", "");
            goto done;
        }
        if (!parse_prompt(v, "prompt", lim, out, err) || !parse_generation(root, lim, out, err)) goto done;
        break;
    case SRV_CHAT:
        if (!parse_messages(cJSON_GetObjectItemCaseSensitive(root, "messages"), out, err) ||
            !parse_generation(root, lim, out, err))
            goto done;
        break;
    case SRV_TOKENIZE: {
        /* vLLM names the text 'prompt', llama.cpp 'content'. */
        const char *key = "prompt";
        v = cJSON_GetObjectItemCaseSensitive(root, key);
        if (is_null(v)) v = cJSON_GetObjectItemCaseSensitive(root, key = "content");
        if (!cJSON_IsString(v)) {
            bad(err, key, "'%s' must be a string (the text to tokenize)%s", "");
            goto done;
        }
        if (!get_bool(root, "add_special_tokens", &out->add_special, err)) goto done;
        out->prompt_len = strlen(v->valuestring);
        if (!(out->prompt_text = dup_str(v->valuestring, err))) goto done;
        break;
    }
    case SRV_DETOKENIZE:
        v = cJSON_GetObjectItemCaseSensitive(root, "tokens");
        if (!cJSON_IsArray(v)) {
            bad(err, "tokens", "'%s' must be a list of token ids%s", "");
            goto done;
        }
        if (!get_ids(v, "tokens", lim->n_vocab, &out->prompt_ids, &out->n_prompt_ids, err)) goto done;
        break;
    }
    ok = true;
done:
    cJSON_Delete(root);
    if (!ok) srv_req_free(out);
    return ok;
}
