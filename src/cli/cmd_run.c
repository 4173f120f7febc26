/* Placeholder until the run command lands (being written now). */
#include <stdio.h>

#include "cli/cli.h"

int cmd_run(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tokamak run: not built yet\n");
    return 1;
}
