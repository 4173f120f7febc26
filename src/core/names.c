#include "core/names.h"

#include <stdio.h>
#include <string.h>

#include "tokamak.h"

#define ROWS(a) (a), (int)(sizeof(a) / sizeof((a)[0]))

static const names_row KV_TYPE[] = {
    {"f32", TK_KV_F32},
    {"f16", TK_KV_F16},
    {"bf16", TK_KV_BF16},
    {"int8", TK_KV_INT8},
};
const names_table NAMES_KV_TYPE = {"KV type", ROWS(KV_TYPE), NULL};

static const names_row KV_SCALE[] = {
    {"head", TK_KV_SCALE_HEAD},
    {"token", TK_KV_SCALE_TOKEN},
};
const names_table NAMES_KV_SCALE = {"KV scale", ROWS(KV_SCALE), NULL};

static const names_row SPEC[] = {
    {"off", TK_SPEC_OFF},
    {"ngram", TK_SPEC_NGRAM},
    {"draft", TK_SPEC_DRAFT},
};
const names_table NAMES_SPEC = {"speculation mode", ROWS(SPEC), NULL};

static const names_row FINISH[] = {
    {"none", TK_FINISH_NONE},           {"stop", TK_FINISH_STOP},   {"length", TK_FINISH_LENGTH},
    {"cancelled", TK_FINISH_CANCELLED}, {"error", TK_FINISH_ERROR},
};
const names_table NAMES_FINISH = {"finish reason", ROWS(FINISH), NULL};

static const char *weight_name(int v) { return tk_weight_type_name((tk_weight_type)v); }
/* every value tk_weight_type_name names (64: room for types added later) */
const names_table NAMES_WEIGHTS = {"weight type", NULL, 64, weight_name};

/* Row i's name and value (NULL name for a value the enum does not name). */
static const char *row_name(const names_table *t, int i, int *value) {
    if (t->rows) {
        *value = t->rows[i].value;
        return t->rows[i].name;
    }
    *value = i;
    return t->name(i);
}

bool names_find(const names_table *t, const char *s, int *value) {
    for (int i = 0; s && i < t->n; i++) {
        int v;
        const char *name = row_name(t, i, &v);
        if (name && !strcmp(name, s)) {
            *value = v;
            return true;
        }
    }
    return false;
}

const char *names_str(const names_table *t, int value) {
    for (int i = 0; i < t->n; i++) {
        int v;
        const char *name = row_name(t, i, &v);
        if (name && v == value) return name;
    }
    return "?";
}

char *names_list(const names_table *t, const char *sep, char *buf, size_t n) {
    size_t k = 0;
    if (n == 0) return buf;
    buf[0] = 0;
    for (int i = 0; i < t->n && k < n; i++) {
        int v;
        const char *name = row_name(t, i, &v);
        if (!name) continue;
        int w = snprintf(buf + k, n - k, "%s%s", k ? sep : "", name);
        if (w < 0) break;
        k += (size_t)w;
    }
    return buf;
}
