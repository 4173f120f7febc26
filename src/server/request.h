/* Request bodies of the OpenAI-compatible endpoints: JSON text in, a validated
 * request (or an OpenAI-form error) out. A pure function of its inputs (no
 * model, no engine), so it can be fuzzed and unit-tested on its own. */
#ifndef TK_SERVER_REQUEST_H
#define TK_SERVER_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokamak.h"

typedef enum srv_kind { SRV_COMPLETION, SRV_CHAT, SRV_TOKENIZE, SRV_DETOKENIZE } srv_kind;

/* What a request is checked against. */
typedef struct srv_limits {
    int n_vocab;            /* token ids must be < n_vocab */
    const char *model_name; /* the served name; a request naming another model is refused */
} srv_limits;

/* An error in OpenAI's shape: {"error":{"message","type","param","code"}}. */
typedef struct srv_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", ... (static) */
    const char *code; /* static or NULL */
    char param[64];   /* "" when none */
    char message[512];
} srv_error;

typedef struct srv_msg {
    char *role;    /* system, user, assistant ("developer" becomes system) */
    char *content; /* text parts joined */
} srv_msg;

typedef struct srv_req {
    srv_kind kind;
    char *model; /* as named in the request, NULL if absent */
    bool stream, include_usage;
    /* The prompt: text (completions, tokenize) or ids (completions, detokenize). */
    char *prompt_text;
    size_t prompt_len;
    int32_t *prompt_ids; /* (n_prompt_ids) */
    int n_prompt_ids;
    srv_msg *msgs; /* (n_msgs) chat */
    int n_msgs;
    bool enable_thinking; /* chat_template_kwargs.enable_thinking (default true) */
    bool add_special;     /* tokenize: add_special_tokens (default true) */
    int max_tokens;       /* 0: until the context is full */
    tk_sampling sampling; /* logit_bias points into bias; temperature 1 unless given (OpenAI's default);
                           * logprobs: the request's (returned with n_logprobs alternatives) */
    bool seed_set;        /* false: the caller picks a fresh seed (no seed, no repeatable output) */
    tk_logit_bias *bias;  /* (sampling.n_logit_bias) */
    char *stop[TK_MAX_STOP];
    int n_stop;
    bool ignore_eos;
} srv_req;

/* Parse and validate body (len bytes, need not be NUL-terminated) for the
 * endpoint kind. On success fills *out (free with srv_req_free) and returns
 * true; on failure fills *err (status 400) and leaves *out empty. */
bool srv_req_parse(const char *body, size_t len, srv_kind kind, const srv_limits *lim, srv_req *out,
                   srv_error *err);
void srv_req_free(srv_req *r);

/* Fill *err (printf-style message). */
void srv_error_set(srv_error *err, int status, const char *type, const char *code, const char *param,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The error as its JSON body (tk_malloc'd, NUL-terminated), NULL without memory. */
char *srv_error_json(const srv_error *err);

#endif
