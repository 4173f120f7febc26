/* The store of a row group cut by a gemv's row range, shared by the
 * interleaved SIMD bodies (simd_body.h, bf16p_body.h). */
#ifndef TOKAMAK_KERNELS_X86_CUT_TILE_H
#define TOKAMAK_KERNELS_X86_CUT_TILE_H

#include <stdint.h>

/* A group of gw rows from g0 that the range [r0, r1) cuts is computed whole
 * into the scratch tile tmp (nt tokens, gw floats each); only its rows inside
 * the range go to y (token t's row r at y[t * ldy + r]), so no value depends
 * on where the range is cut. */
static inline void cut_tile_store(float *y, int64_t ldy, const float *tmp, int gw, int nt, int64_t g0,
                                  int64_t r0, int64_t r1) {
    for (int t = 0; t < nt; t++)
        for (int64_t r = g0 > r0 ? g0 : r0; r < g0 + gw && r < r1; r++)
            y[(size_t)t * (size_t)ldy + (size_t)r] = tmp[t * gw + (r - g0)];
}

#endif
