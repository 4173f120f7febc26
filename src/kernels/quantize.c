/* Weight quantizers that know which input channels matter: each format block
 * (32 elements for Q8_0/Q4_0, 256 for the K formats) is quantized with its
 * range clipped to f x (min, max) for f on a grid, and the f whose
 * importance-weighted squared error sum_j imp[j] (x[j] - q[j])^2 is least is
 * kept. imp[j] is the mean square of input channel j over calibration
 * activations, so the error weighed is the expected output error of a matmul
 * (diagonal approximation). f = 1 is plain round to nearest, so the search
 * never does worse than kern_quantize_row on that error. */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"

/* Range factors tried: 1.0 down to 0.72 (values beyond saturate). */
#define CLIP_STEPS 15
#define CLIP_STEP  0.02f

double kern_weighted_error(const float *x, const float *q, const float *imp, int64_t k) {
    double e = 0.0;
    for (int64_t j = 0; j < k; j++) {
        double d = (double)x[j] - (double)q[j];
        e += (imp ? (double)imp[j] : 1.0) * d * d;
    }
    return e;
}

bool kern_quantize_row_imp(tk_dtype t, const float *x, const float *imp, void *out, int64_t k) {
    if (!imp || (t != TK_DTYPE_Q8_0 && t != TK_DTYPE_Q4_0 && t != TK_DTYPE_Q4_K && t != TK_DTYPE_Q6_K))
        return kern_quantize_row(t, x, out, k);
    const tk_kernels *K = kernels_default();
    const int64_t qk = dtype_block_elems(t);
    const size_t bb = dtype_block_bytes(t);
    if (k < 0 || k % qk) return false;
    float xc[TK_QK_K], dq[TK_QK_K];
    uint8_t
        cand[sizeof(tk_block_q6_k) > sizeof(tk_block_q4_k) ? sizeof(tk_block_q6_k) : sizeof(tk_block_q4_k)];
    for (int64_t b = 0; b < k / qk; b++) {
        const float *v = x + b * qk, *w = imp + b * qk;
        uint8_t *o = (uint8_t *)out + (size_t)b * bb;
        float mn = 0.0f, mx = 0.0f;
        for (int64_t j = 0; j < qk; j++) {
            mn = fminf(mn, v[j]);
            mx = fmaxf(mx, v[j]);
        }
        /* symmetric formats clip both sides to the larger magnitude */
        if (t != TK_DTYPE_Q4_K) mx = fmaxf(mx, -mn), mn = -mx;
        double best = INFINITY;
        for (int s = 0; s < CLIP_STEPS; s++) {
            float f = 1.0f - CLIP_STEP * (float)s, lo = f * mn, hi = f * mx;
            for (int64_t j = 0; j < qk; j++) xc[j] = v[j] < lo ? lo : v[j] > hi ? hi : v[j];
            kern_quantize_row(t, xc, cand, qk);
            K->dequant_row[t](cand, dq, qk);
            double e = kern_weighted_error(v, dq, w, qk);
            if (e < best) {
                best = e;
                memcpy(o, cand, bb);
            }
        }
    }
    return true;
}
