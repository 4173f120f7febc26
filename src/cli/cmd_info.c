/* Placeholder until the info command lands (being written now). */
#include <stdio.h>

#include "cli/cli.h"

int cmd_info(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tokamak info: not built yet\n");
    return 1;
}
