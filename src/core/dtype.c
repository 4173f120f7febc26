#include "dtype.h"

#include <string.h>

_Static_assert(sizeof(tk_block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(tk_block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(tk_block_q4_k) == 144, "q4_k block");
_Static_assert(sizeof(tk_block_q6_k) == 210, "q6_k block");
_Static_assert(sizeof(tk_block_q8_k) == 292, "q8_k block");

typedef struct {
    const char *name;
    int elems;
    size_t bytes;
    bool supported;
} dtype_row;

static const dtype_row TABLE[TK_DTYPE_COUNT] = {
    [0] = {"f32", 1, 4, true},          [1] = {"f16", 1, 2, true},
    [2] = {"q4_0", 32, 18, true},       [3] = {"q4_1", 32, 20, false},
    [6] = {"q5_0", 32, 22, false},      [7] = {"q5_1", 32, 24, false},
    [8] = {"q8_0", 32, 34, true},       [9] = {"q8_1", 32, 36, false},
    [10] = {"q2_k", 256, 84, false},    [11] = {"q3_k", 256, 110, false},
    [12] = {"q4_k", 256, 144, true},    [13] = {"q5_k", 256, 176, false},
    [14] = {"q6_k", 256, 210, true},    [15] = {"q8_k", 256, 292, false},
    [16] = {"iq2_xxs", 256, 66, false}, [17] = {"iq2_xs", 256, 74, false},
    [18] = {"iq3_xxs", 256, 98, false}, [19] = {"iq1_s", 256, 50, false},
    [20] = {"iq4_nl", 32, 18, false},   [21] = {"iq3_s", 256, 110, false},
    [22] = {"iq2_s", 256, 82, false},   [23] = {"iq4_xs", 256, 136, false},
    [24] = {"i8", 1, 1, false},         [25] = {"i16", 1, 2, false},
    [26] = {"i32", 1, 4, false},        [27] = {"i64", 1, 8, false},
    [28] = {"f64", 1, 8, false},        [29] = {"iq1_m", 256, 56, false},
    [30] = {"bf16", 1, 2, true},        [34] = {"tq1_0", 256, 54, false},
    [35] = {"tq2_0", 256, 66, false},
};

bool dtype_known(uint32_t id) { return id < TK_DTYPE_COUNT && TABLE[id].name != NULL; }
bool dtype_supported(uint32_t id) { return dtype_known(id) && TABLE[id].supported; }
const char *dtype_name(uint32_t id) { return dtype_known(id) ? TABLE[id].name : "unknown"; }

int dtype_from_name(const char *s) {
    for (int i = 0; i < TK_DTYPE_COUNT; i++)
        if (TABLE[i].name && TABLE[i].supported && !strcmp(TABLE[i].name, s)) return i;
    return -1;
}

int dtype_block_elems(tk_dtype t) { return dtype_known(t) ? TABLE[t].elems : 0; }
size_t dtype_block_bytes(tk_dtype t) { return dtype_known(t) ? TABLE[t].bytes : 0; }

bool dtype_row_bytes(tk_dtype t, uint64_t n, uint64_t *bytes) {
    if (!dtype_known(t)) return false;
    uint64_t be = (uint64_t)TABLE[t].elems;
    if (n % be) return false;
    return !__builtin_mul_overflow(n / be, (uint64_t)TABLE[t].bytes, bytes);
}

float tk_f16_to_f32(tk_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0)
            u = sign;
        else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31)
        u = sign | 0x7f800000 | (man << 13);
    else
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

tk_f16 tk_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffff;
    if (ax >= 0x7f800000) return (tk_f16)(sign | 0x7c00 | (ax > 0x7f800000 ? 0x200 : 0));
    if (ax >= 0x477ff000) return (tk_f16)(sign | 0x7c00); /* rounds to inf */
    if (ax < 0x38800000) {                                /* subnormal or zero in half */
        if (ax < 0x33000000) return (tk_f16)sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (tk_f16)(sign | r);
    }
    uint32_t r = ax - 0x38000000; /* rebias 127 -> 15 */
    uint32_t h = r >> 13, rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (tk_f16)(sign | h);
}

tk_bf16 tk_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (tk_bf16)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (tk_bf16)(u >> 16);
}
