#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "tokamak.h"

#include "tk_git_commit.h" /* generated at build time: TK_GIT_COMMIT */

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} subcommand;

static const subcommand CMDS[] = {
    {"synth", cmd_synth, "write a synthetic model (real Qwen3 shapes, seeded weights)"},
    {"info", cmd_info, "show a model's shapes, bytes per token and TPOT floor"},
    {"run", cmd_run, "generate from one or many prompts"},
    {"chat", cmd_chat, "a conversation in the terminal, in the model's chat format"},
    {"tokenize", cmd_tokenize, "text to token ids"},
    {"detokenize", cmd_detokenize, "token ids to text"},
    {"bench", cmd_bench, "TTFT/TPOT/ITL/throughput and the bandwidth roofline"},
    {"profile", cmd_profile, "time per stage of a batched decode step against its floor"},
    {"kvcheck", cmd_kvcheck, "top-1 agreement and KL of int8/bf16/f16 KV against f32 KV"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server (completions, chat, metrics)"},
    {"loadgen", cmd_loadgen, "TTFT/TPOT/ITL/throughput of any OpenAI-compatible server, over HTTP"},
    {"quantize", cmd_quantize,
     "convert a HF directory or GGUF to GGUF (bf16, q8_0, q6_k, q4_k, q4_0, q4_k_m)"},
    {"eval", cmd_eval, "perplexity, and KL / top-1 / output length against a reference model"},
};

static void usage(FILE *f) {
    fprintf(f,
            "tokamak %s (%s): a decode-first LLM inference engine\n\nusage: tokamak <command> [options]\n\n",
            TK_VERSION, TK_GIT_COMMIT);
    for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++)
        fprintf(f, "  %-11s %s\n", CMDS[i].name, CMDS[i].help);
    fprintf(f, "\n'tokamak <command> --help' for a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("tokamak %s (%s)\n", TK_VERSION, TK_GIT_COMMIT);
        return 0;
    }
    for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++)
        if (!strcmp(argv[1], CMDS[i].name)) return CMDS[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tokamak: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
