/* libFuzzer target: model hyper-parameter validation through tk_model_open on
 * a real file. An input starting with 'H' is a config.json, written into a
 * directory whose model.safetensors holds a tiny llama (1 layer, width 16);
 * any other input is a GGUF file (first byte included), written to a memfd. A
 * model that opens is described and freed. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "model/arch.h"
#include "tokamak.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[256];    /* the HF directory, made once per process */
static char g_config[300]; /* its config.json */

static void remove_dir(void) {
    char p[300];
    snprintf(p, sizeof p, "%s/model.safetensors", g_dir);
    unlink(p);
    unlink(g_config);
    rmdir(g_dir);
}

/* Every tensor of the tiny llama config.json seeds describe, zero-filled. */
static int make_dir(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fuzz_model.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) return -1;
    atexit(remove_dir);
    snprintf(g_config, sizeof g_config, "%s/config.json", g_dir);
    tk_hparams hp = {.arch = TK_ARCH_LLAMA,
                     .n_layer = 1,
                     .n_embd = 16,
                     .n_ff = 32,
                     .n_head = 2,
                     .n_head_kv = 1,
                     .head_dim = 8,
                     .n_vocab = 32};
    static float zeros[32 * 32];
    static char names[TK_ROLE_COUNT][96];
    tk_tensor ts[TK_ROLE_COUNT];
    int n = 0;
    for (int r = 0; r < TK_ROLE_COUNT; r++) {
        if (r == TK_ROLE_Q_BIAS || r == TK_ROLE_K_BIAS || r == TK_ROLE_V_BIAS || r == TK_ROLE_Q_NORM ||
            r == TK_ROLE_K_NORM || !arch_tensor_name(TK_NAMING_HF, (tk_role)r, 0, names[n], sizeof names[n]))
            continue;
        int64_t ne[4];
        arch_tensor_shape(&hp, (tk_role)r, ne);
        ts[n] = (tk_tensor){.name = names[n],
                            .type = TK_DTYPE_F32,
                            .n_dims = ne[1] > 1 ? 2 : 1,
                            .ne = {ne[0], ne[1], 1, 1},
                            .data = zeros,
                            .nbytes = (uint64_t)(ne[0] * ne[1] * 4)};
        n++;
    }
    char p[300];
    snprintf(p, sizeof p, "%s/model.safetensors", g_dir);
    return st_write(p, ts, n, NULL) == TK_OK ? 0 : -1;
}

static void open_and_free(const char *path) {
    tk_model *m = NULL;
    if (tk_model_open(path, NULL, &m) != TK_OK) return;
    tk_model_info info;
    tk_model_get_info(m, &info);
    if (info.n_layer < 1 || info.n_ctx_train < 0) __builtin_trap();
    tk_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && data[0] == 'H') {
        if (!g_dir[0] && make_dir() != 0) __builtin_trap();
        FILE *f = fopen(g_config, "wb");
        if (!f) __builtin_trap();
        fwrite(data + 1, 1, size - 1, f);
        fclose(f);
        open_and_free(g_dir);
        return 0;
    }
    int fd = memfd_create("fuzz_model.gguf", MFD_CLOEXEC);
    if (fd < 0) __builtin_trap();
    for (size_t off = 0; off < size;) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) __builtin_trap();
        off += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    open_and_free(path);
    close(fd);
    return 0;
}
