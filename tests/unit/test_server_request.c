/* The server's pure parts: request JSON to validated requests (defaults, the
 * OpenAI spellings, refusals with the parameter named) and the Qwen3 reasoning
 * splitter over text cut at every byte. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/request.h"
#include "server/think.h"

static const srv_limits LIM = {.n_vocab = 100, .model_name = "m"};

static bool parse(const char *js, srv_kind kind, srv_req *r, srv_error *e) {
    return srv_req_parse(js, strlen(js), kind, &LIM, r, e);
}

static void test_server_request_defaults_and_values(void **state) {
    (void)state;
    srv_req r;
    srv_error e;
    assert_true(parse("{\"prompt\": \"hi\"}", SRV_COMPLETION, &r, &e));
    assert_string_equal(r.prompt_text, "hi");
    assert_int_equal(r.max_tokens, 16); /* the completions default */
    assert_false(r.stream || r.seed_set);
    assert_true(r.sampling.temperature == 1.0f && r.sampling.top_p == 1.0f && r.sampling.top_k == 0);
    srv_req_free(&r);
    assert_true(parse("{\"model\":\"m\",\"prompt\":[[3,4]],\"max_tokens\":5,\"top_k\":-1,\"seed\":-1,"
                      "\"logit_bias\":{\"7\":-100,\"8\":1.5},\"stop\":\"x\",\"logprobs\":2,\"stream\":true,"
                      "\"stream_options\":{\"include_usage\":true}}",
                      SRV_COMPLETION, &r, &e));
    assert_int_equal(r.n_prompt_ids, 2);
    assert_int_equal(r.prompt_ids[1], 4);
    assert_int_equal(r.max_tokens, 5);
    assert_int_equal(r.sampling.top_k, 0);
    assert_true(r.seed_set && r.sampling.seed == UINT64_MAX);
    assert_int_equal(r.sampling.n_logit_bias, 2);
    assert_true(isinf(r.sampling.logit_bias[0].bias) && r.sampling.logit_bias[0].bias < 0);
    assert_true(r.sampling.logit_bias[1].bias == 1.5f);
    assert_int_equal(r.n_stop, 1);
    assert_true(r.sampling.logprobs && r.sampling.n_logprobs == 2 && r.stream && r.include_usage);
    srv_req_free(&r);
    /* chat: developer is system, text parts are joined, max_completion_tokens wins, no default length */
    assert_true(parse(
        "{\"messages\":[{\"role\":\"developer\",\"content\":\"s\"},{\"role\":\"user\",\"content\":"
        "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],"
        "\"max_tokens\":3,\"max_completion_tokens\":4,\"chat_template_kwargs\":{\"enable_thinking\":false}}",
        SRV_CHAT, &r, &e));
    assert_int_equal(r.n_msgs, 2);
    assert_string_equal(r.msgs[0].role, "system");
    assert_string_equal(r.msgs[1].content, "ab");
    assert_int_equal(r.max_tokens, 4);
    assert_false(r.enable_thinking);
    srv_req_free(&r);
    assert_true(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", SRV_CHAT, &r, &e));
    assert_int_equal(r.max_tokens, 0);
    assert_true(r.enable_thinking);
    srv_req_free(&r);
    assert_true(parse("{\"content\":\"t\",\"add_special_tokens\":false}", SRV_TOKENIZE, &r, &e));
    assert_string_equal(r.prompt_text, "t");
    assert_false(r.add_special);
    srv_req_free(&r);
}

static void test_server_request_refusals(void **state) {
    (void)state;
    static const struct {
        const char *js;
        srv_kind kind;
        const char *param;
    } T[] = {
        {"{\"prompt\":\"a\"", SRV_COMPLETION, ""},
        {"{\"prompt\":\"a\"} x", SRV_COMPLETION, ""},
        {"{\"prompt\":[100]}", SRV_COMPLETION, "prompt"},
        {"{\"prompt\":\"a\",\"model\":\"other\"}", SRV_COMPLETION, "model"},
        {"{\"prompt\":\"a\",\"max_tokens\":0}", SRV_COMPLETION, "max_tokens"},
        {"{\"prompt\":\"a\",\"temperature\":1e400}", SRV_COMPLETION, "temperature"},
        {"{\"prompt\":\"a\",\"top_p\":0}", SRV_COMPLETION, "top_p"},
        {"{\"prompt\":\"a\",\"n\":3}", SRV_COMPLETION, "n"},
        {"{\"prompt\":\"a\",\"echo\":true}", SRV_COMPLETION, "echo"},
        {"{\"prompt\":\"a\",\"logit_bias\":{\"100\":1}}", SRV_COMPLETION, "logit_bias"},
        {"{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}",
         SRV_COMPLETION, "stop"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", SRV_CHAT, "messages[0]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{}]}", SRV_CHAT, "tools"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", SRV_CHAT, "logprobs"},
        {"{\"tokens\":[1,-1]}", SRV_DETOKENIZE, "tokens"},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        srv_req r;
        srv_error e;
        if (parse(T[i].js, T[i].kind, &r, &e)) fail_msg("accepted: %s", T[i].js);
        assert_int_equal(e.status, 400);
        if (strcmp(e.param, T[i].param)) fail_msg("%s: param '%s', want '%s'", T[i].js, e.param, T[i].param);
        assert_true(e.message[0] != 0);
        char *js = srv_error_json(&e);
        assert_non_null(strstr(js, "\"error\":{\"message\":"));
        free(js);
        assert_null(r.prompt_text); /* nothing left to free */
    }
}

/* Split text pushed in two pieces cut at `cut`, then flushed. */
static void split(const char *text, size_t cut, char *content, char *reasoning) {
    srv_think t = {0};
    srv_think_out o[3];
    size_t n = strlen(text);
    assert_true(srv_think_push(&t, text, cut, &o[0]));
    assert_true(srv_think_push(&t, text + cut, n - cut, &o[1]));
    assert_true(srv_think_flush(&t, &o[2]));
    content[0] = reasoning[0] = 0;
    for (int i = 0; i < 3; i++) {
        if (o[i].content) strcat(content, o[i].content);
        if (o[i].reasoning) strcat(reasoning, o[i].reasoning);
        free(o[i].content);
        free(o[i].reasoning);
    }
}

static void test_server_think_split_anywhere(void **state) {
    (void)state;
    static const struct {
        const char *in, *content, *reasoning;
    } T[] = {
        {"<think>\nI ponder </thin k\n</think>\n\nThe answer.", "The answer.", "I ponder </thin k\n"},
        {"plain answer <think>", "plain answer <think>", ""},
        {"<thin", "<thin", ""},
        {"<think>\nunfinished </th", "", "unfinished </th"},
        {"<think></think>x", "x", ""},
        {"<<think>", "<<think>", ""},
    };
    char c[256], r[256];
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        for (size_t cut = 0; cut <= strlen(T[i].in); cut++) {
            split(T[i].in, cut, c, r);
            if (strcmp(c, T[i].content) || strcmp(r, T[i].reasoning))
                fail_msg("'%s' cut at %zu: content '%s' reasoning '%s'", T[i].in, cut, c, r);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_request_defaults_and_values),
        cmocka_unit_test(test_server_request_refusals),
        cmocka_unit_test(test_server_think_split_anywhere),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
