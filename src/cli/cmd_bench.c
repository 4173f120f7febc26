/* Placeholder until the bench command lands (being written now). */
#include <stdio.h>

#include "cli/cli.h"

int cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tokamak bench: not built yet\n");
    return 1;
}
