/* Placeholder until the synth command lands (being written now). */
#include <stdio.h>

#include "cli/cli.h"

int cmd_synth(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tokamak synth: not built yet\n");
    return 1;
}
