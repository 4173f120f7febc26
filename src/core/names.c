#include "core/names.h"

#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "tokamak.h"

#define ROWS(a) (a), (int)(sizeof(a) / sizeof((a)[0]))

static const names_row KV_TYPE[] = {
    {"f32", TK_KV_F32},
    {"f16", TK_KV_F16},
    {"bf16", TK_KV_BF16},
    {"int8", TK_KV_INT8},
};
const names_table NAMES_KV_TYPE = {"KV type", ROWS(KV_TYPE)};

static const names_row KV_SCALE[] = {
    {"head", TK_KV_SCALE_HEAD},
    {"token", TK_KV_SCALE_TOKEN},
};
const names_table NAMES_KV_SCALE = {"KV scale", ROWS(KV_SCALE)};

static const names_row FINISH[] = {
    {"none", TK_FINISH_NONE},           {"stop", TK_FINISH_STOP},   {"length", TK_FINISH_LENGTH},
    {"cancelled", TK_FINISH_CANCELLED}, {"error", TK_FINISH_ERROR},
};
const names_table NAMES_FINISH = {"finish reason", ROWS(FINISH)};

static const names_row REPACK[] = {
    {"f32", TK_DTYPE_F32},   {"f16", TK_DTYPE_F16},   {"bf16", TK_DTYPE_BF16}, {"q8_0", TK_DTYPE_Q8_0},
    {"q4_0", TK_DTYPE_Q4_0}, {"q4_k", TK_DTYPE_Q4_K}, {"q6_k", TK_DTYPE_Q6_K},
};
const names_table NAMES_REPACK = {"weight type", ROWS(REPACK)};

bool names_find(const names_table *t, const char *s, int *value) {
    for (int i = 0; s && i < t->n; i++)
        if (!strcmp(t->rows[i].name, s)) {
            *value = t->rows[i].value;
            return true;
        }
    return false;
}

const char *names_str(const names_table *t, int value) {
    for (int i = 0; i < t->n; i++)
        if (t->rows[i].value == value) return t->rows[i].name;
    return "?";
}

char *names_list(const names_table *t, const char *sep, char *buf, size_t n) {
    size_t k = 0;
    if (n == 0) return buf;
    buf[0] = 0;
    for (int i = 0; i < t->n && k < n; i++) {
        int w = snprintf(buf + k, n - k, "%s%s", i ? sep : "", t->rows[i].name);
        if (w < 0) break;
        k += (size_t)w;
    }
    return buf;
}
