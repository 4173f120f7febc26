/* The tiny synthetic qwen3 (F32 weights) that tests/e2e makes too, made once
 * into $TK_TMP with the CLI ($TK_CLI); NULL (the caller skips) without them.
 * Include after cmocka.h. */
#ifndef TK_TEST_TINY_MODEL_H
#define TK_TEST_TINY_MODEL_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "tokamak.h"

static inline tk_model *open_tiny(void) {
    const char *tmp = getenv("TK_TMP"), *cli = getenv("TK_CLI");
    if (!tmp || !cli) return NULL;
    char path[512], part[600], cmd[4096];
    snprintf(path, sizeof path, "%s/engine_tiny_f32.gguf", tmp);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        snprintf(part, sizeof part, "%s.%d", path, (int)getpid());
        snprintf(cmd, sizeof cmd, "'%s' synth --preset tiny --dtype f32 -o '%s' >/dev/null && mv '%s' '%s'",
                 cli, part, part, path);
        if (system(cmd) != 0) fail_msg("synth failed: %s", cmd);
    }
    tk_model *m = NULL;
    if (tk_model_open(path, NULL, &m) != TK_OK) fail_msg("open %s: %s", path, tk_last_error());
    return m;
}

#endif
