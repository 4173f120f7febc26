/* The command-line option table (src/cli/opts.c, compiled in here: the CLI is
 * not part of the library): kinds, ranges, names from the enum tables, the
 * "--name=value" form, operands, the given-options record, and the checks
 * across options. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
// clang-format off
#include <cmocka.h>
// clang-format on

#include "cli/opts.c"

typedef struct own_args {
    int n;
    const char *out;
    bool flag;
    double x;
} own_args;

static const cli_opt OWN_ROWS[] = {
    {.kind = CLI_SECTION, .name = "own"},
    {.name = "-n",
     .arg = "N",
     .help = "count",
     .kind = CLI_INT,
     .off = offsetof(own_args, n),
     .lo = 0,
     .hi = 10},
    {.name = "--out",
     .alias = "-o",
     .arg = "F",
     .help = "out",
     .kind = CLI_STR,
     .off = offsetof(own_args, out)},
    {.name = "--flag", .help = "flag", .kind = CLI_FLAG, .off = offsetof(own_args, flag)},
    {.name = "--x",
     .arg = "X",
     .help = "x",
     .kind = CLI_DOUBLE,
     .off = offsetof(own_args, x),
     .lo = 0,
     .hi = 1,
     .flags = CLI_LO_OPEN},
    {0},
};

static const cli_cmd CMD = {
    "test", "usage: test", CLI_G_MODEL | CLI_G_ENGINE | CLI_G_SAMPLING, OWN_ROWS, NULL, 1, NULL};

/* Parse the words of line (space separated, at most 38). */
static int parse(cli_opts *o, own_args *a, const char *line) {
    static char buf[512];
    char *argv[40] = {"test"};
    int argc = 1;
    snprintf(buf, sizeof buf, "%s", line);
    for (char *t = strtok(buf, " "); t && argc < 39; t = strtok(NULL, " ")) argv[argc++] = t;
    memset(a, 0, sizeof *a);
    cli_opts_init(o, &CMD, a);
    return cli_opts_parse(o, argc, argv);
}

static void test_opts_values(void **state) {
    (void)state;
    cli_opts o;
    own_args a;
    assert_int_equal(
        parse(&o, &a,
              "-m m.gguf -n 3 --out=f --flag --kv-type int8 --kv-scale token --seed 18446744073709551615"
              " --top-p 1 --kv-mem 2G --block-size 32 --repack q8_0 file"),
        CLI_GO_ON);
    assert_string_equal(o.model_path, "m.gguf");
    assert_int_equal(a.n, 3);
    assert_string_equal(a.out, "f");
    assert_true(a.flag);
    assert_int_equal(o.engine.kv_type, TK_KV_INT8);
    assert_int_equal(o.engine.kv_scale, TK_KV_SCALE_TOKEN);
    assert_true(o.sampling.seed == UINT64_MAX);
    assert_true(o.sampling.top_p == 1.0f);
    assert_true(o.engine.kv_mem == (size_t)2 << 30);
    assert_int_equal(o.engine.block_size, 32);
    assert_int_equal(o.model.repack, TK_WEIGHTS_Q8_0);
    assert_int_equal(o.n_operands, 1);
    assert_string_equal(o.operands[0], "file");
    assert_true(cli_opts_given(&o, "--kv-type"));
    assert_true(cli_opts_given(&o, "-o")); /* by its alias */
    assert_false(cli_opts_given(&o, "--ctx"));
    assert_int_equal(o.engine.ctx, 4096); /* defaults stay */
    assert_int_equal(parse(&o, &a, "--kv-mem 512"), CLI_GO_ON);
    assert_true(o.engine.kv_mem == (size_t)512 << 20); /* a bare number is MiB */
    assert_int_equal(parse(&o, &a, "--kv-mem 64k --presence-penalty -2 -t 1"), CLI_GO_ON);
    assert_true(o.engine.kv_mem == 64 << 10);
    assert_true(o.sampling.presence_penalty == -2.0f);
    assert_int_equal(o.engine.n_threads, 1);
}

static void test_opts_rejects(void **state) {
    (void)state;
    cli_opts o;
    own_args a;
    const char *bad[] = {
        "-n 11",
        "-n -1",
        "-n 1x",
        "-n",
        "--seed -1",
        "--seed +1",
        "--seed 1e3",
        "--kv-type int4",
        "--kv-scale x",
        "--block-size 24",
        "--block-size 8",
        "--block-size 512",
        "--top-p 0",
        "--x 0",
        "--x 1.5",
        "--x nan",
        "--temp inf",
        "--kv-mem 0",
        "--kv-mem 1T",
        "--kv-mem -1",
        "--bogus",
        "--flag=1",
        "a b",
        "--threads 2000",
        "--repack q5_1",
        "--step-ms 0",
        "--step-tokens 1",
        "--ctx 0",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = parse(&o, &a, bad[i]);
        if (rc != 2) fail_msg("'%s' parsed (rc %d)", bad[i], rc);
    }
    /* the step budget holds every running decode: fine once --max-batch fits */
    assert_int_equal(parse(&o, &a, "--step-tokens 4 --max-batch 4"), CLI_GO_ON);
    assert_int_equal(parse(&o, &a, "--step-tokens 0"), CLI_GO_ON);
    assert_int_equal(parse(&o, &a, "-- -n"), CLI_GO_ON); /* after --, words are operands */
    assert_string_equal(o.operands[0], "-n");
}

static void test_opts_threads_capped(void **state) {
    (void)state;
    cli_opts o;
    own_args a;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    assert_int_equal(parse(&o, &a, "--threads 1024"), CLI_GO_ON);
    assert_int_equal(o.engine.n_threads, cores < 1024 ? (int)cores : 1024);
    assert_int_equal(parse(&o, &a, "--threads 0"), CLI_GO_ON);
    assert_int_equal(o.engine.n_threads, 0);
}

static void test_opts_groups(void **state) {
    (void)state;
    static const cli_cmd narrow = {"narrow", "usage: narrow", CLI_G_THREADS, NULL, NULL, 0, NULL};
    cli_opts o;
    char *argv1[] = {"narrow", "--kv-type", "f32"};
    cli_opts_init(&o, &narrow, NULL);
    assert_int_equal(cli_opts_parse(&o, 3, argv1), 2); /* a group not taken is unknown */
    char *argv2[] = {"narrow", "--pin"};
    cli_opts_init(&o, &narrow, NULL);
    assert_int_equal(cli_opts_parse(&o, 2, argv2), CLI_GO_ON);
    assert_true(o.engine.pin_threads);
}

static void test_opts_ids(void **state) {
    (void)state;
    int32_t *ids = NULL;
    int n = 0;
    assert_true(cli_parse_ids("1,2, 3\n4", &ids, &n));
    assert_int_equal(n, 4);
    assert_int_equal(ids[3], 4);
    tk_free(ids);
    const char *bad[] = {"", " , ", "1,-2", "1,2x", "2147483648", "+1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (cli_parse_ids(bad[i], &ids, &n)) fail_msg("'%s' parsed", bad[i]);
}

static void test_opts_int_list(void **state) {
    (void)state;
    int v[4] = {0}, n = 0;
    assert_true(cli_parse_int_list("1,8,32", 1, 32, 4, v, &n));
    assert_int_equal(n, 3);
    assert_int_equal(v[0], 1);
    assert_int_equal(v[2], 32);
    assert_true(cli_parse_int_list("7", 1, 32, 1, v, &n));
    assert_int_equal(n, 1);
    assert_int_equal(v[0], 7);
    const char *bad[] = {
        "", ",", "1,", ",1", "1,,2", "0", "33", "1,2x", "1;2", "1,2,3,4,5", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (cli_parse_int_list(bad[i], 1, 32, 4, v, &n)) fail_msg("'%s' parsed", bad[i]);
    double r[3] = {0};
    assert_true(cli_parse_real_list("0.5,2,1e3", 3, r, &n));
    assert_int_equal(n, 3);
    assert_true(r[0] == 0.5 && r[2] == 1000.0);
    const char *bad_r[] = {"", "0", "-1", "0.5,", "1,,2", "inf", "nan", "1x", "1,2,3,4"};
    for (size_t i = 0; i < sizeof bad_r / sizeof bad_r[0]; i++)
        if (cli_parse_real_list(bad_r[i], 3, r, &n)) fail_msg("'%s' parsed as reals", bad_r[i]);
}

static void test_opts_names(void **state) {
    (void)state;
    int v = -1;
    char buf[64];
    for (int i = 0; i < NAMES_KV_TYPE.n; i++) {
        const names_row *r = &NAMES_KV_TYPE.rows[i];
        assert_true(names_find(&NAMES_KV_TYPE, r->name, &v));
        assert_int_equal(v, r->value);
        assert_string_equal(names_str(&NAMES_KV_TYPE, r->value), r->name);
    }
    assert_false(names_find(&NAMES_KV_TYPE, "int4", &v));
    assert_string_equal(names_str(&NAMES_KV_SCALE, 99), "?");
    assert_string_equal(names_list(&NAMES_KV_TYPE, ", ", buf, sizeof buf), "f32, f16, bf16, int8");
    assert_string_equal(names_list(&NAMES_KV_TYPE, ",", buf, 6), "f32,f"); /* cut, terminated */
    /* a table kept by the enum itself: the library's tk_weight_type names */
    assert_string_equal(names_list(&NAMES_WEIGHTS, " ", buf, sizeof buf),
                        "keep f32 f16 bf16 q8_0 q4_0 q4_k q6_k");
    assert_true(names_find(&NAMES_WEIGHTS, "q4_k", &v));
    assert_int_equal(v, TK_WEIGHTS_Q4_K);
    assert_string_equal(names_str(&NAMES_WEIGHTS, TK_WEIGHTS_KEEP), "keep");
    assert_false(names_find(&NAMES_WEIGHTS, "q5_1", &v));
}

static void test_opts_help(void **state) {
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    cli_opts_usage(&CMD, f);
    fclose(f);
    assert_non_null(strstr(text, "\nown:\n  -n N "));
    assert_non_null(strstr(text, "  --kv-type T  "));
    assert_non_null(strstr(text, " KV cache type (default f16): f32, f16, bf16, int8\n"));
    assert_non_null(strstr(text, "\nmodel:\n"));
    assert_non_null(strstr(text, "\nengine:\n"));
    assert_non_null(strstr(text, "\nsampling:\n"));
    assert_null(strstr(strstr(text, "\nengine:\n") + 1, "\nengine:\n")); /* one engine heading */
    free(text);
}

/* Rows shared by two subcommands (own_shared): parsed into the same struct,
 * listed after the subcommand's own rows. */
static const cli_opt SHARED_ROWS[] = {
    {.kind = CLI_SECTION, .name = "shared"},
    {.name = "--z",
     .arg = "Z",
     .help = "a shared number",
     .kind = CLI_DOUBLE,
     .off = offsetof(own_args, x),
     .hi = 5},
    {0},
};

static void test_opts_own_shared(void **state) {
    (void)state;
    static const cli_cmd two = {"two", "usage: two", 0, OWN_ROWS, NULL, 0, SHARED_ROWS};
    own_args a = {0};
    cli_opts o;
    cli_opts_init(&o, &two, &a);
    char *argv[] = {"two", "-n", "3", "--z", "2.5"};
    assert_int_equal(cli_opts_parse(&o, 5, argv), CLI_GO_ON);
    assert_int_equal(a.n, 3);
    assert_true(a.x == 2.5);
    assert_true(cli_opts_given(&o, "--z"));
    char *argv2[] = {"two", "--z", "9"};
    assert_int_equal(cli_opts_parse(&o, 3, argv2), 2); /* the shared row's range holds */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    cli_opts_usage(&two, f);
    fclose(f);
    const char *own = strstr(text, "\nown:\n"), *shared = strstr(text, "\nshared:\n  --z Z ");
    assert_non_null(own);
    assert_non_null(shared);
    assert_true(own < shared);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opts_own_shared), cmocka_unit_test(test_opts_values),
        cmocka_unit_test(test_opts_rejects),    cmocka_unit_test(test_opts_threads_capped),
        cmocka_unit_test(test_opts_groups),     cmocka_unit_test(test_opts_ids),
        cmocka_unit_test(test_opts_int_list),   cmocka_unit_test(test_opts_names),
        cmocka_unit_test(test_opts_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
