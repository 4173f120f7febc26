/* libFuzzer target: the server's request parser on arbitrary bytes. The first
 * byte picks the endpoint (completions, chat, tokenize, detokenize), the rest
 * is the body. Every accepted request must hold values the engine accepts;
 * every refusal must render as an OpenAI-form error. The same bytes also go
 * through the reasoning splitter in two pushes. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/request.h"
#include "server/think.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
    if (!ok) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    srv_kind kind = (srv_kind)(data[0] % 4);
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    srv_limits lim = {.n_vocab = 1000, .model_name = (data[0] & 4) ? "m" : NULL};
    srv_req r;
    srv_error err;
    if (srv_req_parse(body, len, kind, &lim, &r, &err)) {
        const tk_sampling *s = &r.sampling;
        check(isfinite(s->temperature) && s->temperature >= 0);
        check(s->top_p > 0 && s->top_p <= 1 && s->min_p >= 0 && s->min_p <= 1 && s->top_k >= 0);
        check(s->repetition_penalty > 0 && fabsf(s->presence_penalty) <= 2 &&
              fabsf(s->frequency_penalty) <= 2);
        check(s->n_logprobs >= 0 && s->n_logprobs <= TK_MAX_LOGPROBS && r.max_tokens >= 0);
        for (int i = 0; i < s->n_logit_bias; i++)
            check(s->logit_bias[i].token >= 0 && s->logit_bias[i].token < lim.n_vocab);
        for (int i = 0; i < r.n_prompt_ids; i++) check(r.prompt_ids[i] >= 0 && r.prompt_ids[i] < lim.n_vocab);
        check(r.n_stop <= TK_MAX_STOP);
        for (int i = 0; i < r.n_stop; i++) check(r.stop[i] && r.stop[i][0]);
        for (int i = 0; i < r.n_msgs; i++) check(r.msgs[i].role && r.msgs[i].content);
        if (kind == SRV_COMPLETION) check(r.prompt_text || r.n_prompt_ids > 0);
        if (kind == SRV_CHAT) check(r.n_msgs > 0);
        srv_req_free(&r);
    } else {
        check(err.status >= 400 && err.status < 600 && err.message[0] && err.type);
        char *js = srv_error_json(&err);
        check(js != NULL);
        free(js);
    }
    srv_think t = {0};
    srv_think_out a, b, c;
    size_t cut = len ? data[0] % (len + 1) : 0;
    if (srv_think_push(&t, body, cut, &a) && srv_think_push(&t, body + cut, len - cut, &b) &&
        srv_think_flush(&t, &c)) {
        /* nothing is lost but the tags and the newlines after them */
        check(a.n_content + a.n_reasoning + b.n_content + b.n_reasoning + c.n_content + c.n_reasoning <= len);
        free(a.content), free(a.reasoning), free(b.content), free(b.reasoning), free(c.content),
            free(c.reasoning);
    }
    return 0;
}
