/* `tokamak run --prompts FILE | --parallel N`: many prompts through the engine
 * together (continuous batching), streaming each request's text tagged by its
 * number, then a summary with per-request TTFT and TPOT and total throughput.
 * cmd_run calls run_many when it sees --prompts or --parallel; argv[0] is "run".
 * Returns the process exit code (0 ok, 1 runtime error, 2 usage error). */
#ifndef TK_CLI_RUN_MANY_H
#define TK_CLI_RUN_MANY_H

#include <stdbool.h>

int run_many(int argc, char **argv);
/* True when argv asks for the many-prompt path (--prompts or --parallel). */
bool run_many_wanted(int argc, char **argv);

#endif
