/* Placeholder until the detokenize command lands (being written now). */
#include <stdio.h>

#include "cli/cli.h"

int cmd_detokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tokamak detokenize: not built yet\n");
    return 1;
}
