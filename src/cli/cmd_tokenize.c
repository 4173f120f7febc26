/* Placeholder until the tokenize command lands (being written now). */
#include <stdio.h>

#include "cli/cli.h"

int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tokamak tokenize: not built yet\n");
    return 1;
}
