/* Portable kernel bodies, static inline so that each cpu_kern_*.c compiles
 * them under its own target (the compiler vectorises them there). Included
 * only by cpu_kern_*.c. */
#ifndef LMX_CPU_GENERIC_H
#define LMX_CPU_GENERIC_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "dtype.h"

static inline float gen_h2f(uint16_t h) { return lmx_f16_to_f32(h); }

/* Row r of w as float32, natural element order. */
static inline void gen_decode(const lmx_cpu_weight *w, int r, float *dst)
{
    int K = w->cols;
    size_t base = (size_t)r * (size_t)K;
    switch (w->kind) {
    case LMX_WK_F32: {
        const float *s = (const float *)w->data + base;
        for (int k = 0; k < K; k++)
            dst[k] = s[k];
        return;
    }
    case LMX_WK_BF16: {
        const uint16_t *s = (const uint16_t *)w->data + base;
        for (int k = 0; k < K; k++) {
            uint32_t u = (uint32_t)s[k] << 16;
            memcpy(dst + k, &u, 4);
        }
        return;
    }
    case LMX_WK_F16: {
        const uint16_t *s = (const uint16_t *)w->data + base;
        for (int k = 0; k < K; k++)
            dst[k] = gen_h2f(s[k]);
        return;
    }
    case LMX_WK_Q8:
    case LMX_WK_Q4: {
        int bits = w->kind == LMX_WK_Q8 ? 8 : 4, G = w->group, ng = K / G;
        const uint8_t *q = (const uint8_t *)w->data + base * (size_t)bits / 8;
        const uint16_t *sc = w->scales + (size_t)r * ng, *bi = w->biases + (size_t)r * ng;
        for (int g = 0; g < ng; g++) {
            float s = gen_h2f(sc[g]), b = gen_h2f(bi[g]);
            float *d = dst + (size_t)g * G;
            if (bits == 8) {
                const uint8_t *qg = q + (size_t)g * G;
                for (int k = 0; k < G; k++)
                    d[k] = s * (float)qg[k] + b;
            } else {
                const uint8_t *qg = q + (size_t)g * G / 2;
                for (int k = 0; k < G / 2; k++) {
                    d[2 * k] = s * (float)(qg[k] & 15) + b;
                    d[2 * k + 1] = s * (float)(qg[k] >> 4) + b;
                }
            }
        }
        return;
    }
    }
}

static inline int8_t gen_round8(float t) { return (int8_t)(int)(t + (t >= 0 ? 0.5f : -0.5f)); }

/* One row of x for the q8/q4 matvec (lmx_cpu_x): per group of G, the step
 * max |x| / 127, x / step rounded half away from zero, and the sum of the
 * rounded values; with C > 0 (q4; C <= 128, a multiple of 2) every run of C
 * values (the row's last run shorter) stored evens, then odds. G is 32 or
 * 64. The maximum 16 wide, so that the loop vectorises. */
static inline void gen_quant_x(const float *x, int K, int G, int C, int8_t *xq, float *xd, int32_t *xqsum)
{
    for (int g = 0; g < K / G; g++) {
        const float *xg = x + (size_t)g * G;
        int8_t *d = xq + (size_t)g * G;
        float amax[16] = {0};
        for (int k = 0; k < G; k += 16)
            for (int l = 0; l < 16; l++) {
                float a = fabsf(xg[k + l]);
                amax[l] = a > amax[l] ? a : amax[l];
            }
        float m = 0;
        for (int l = 0; l < 16; l++)
            m = amax[l] > m ? amax[l] : m;
        float inv = m > 0 ? 127.0f / m : 0;
        int32_t qs = 0;
        for (int k = 0; k < G; k++) {
            d[k] = gen_round8(xg[k] * inv);
            qs += d[k];
        }
        xd[g] = m / 127.0f;
        xqsum[g] = qs;
    }
    for (int c = 0; C && c < K; c += C) { /* pairs (even, odd) as 16-bit words: low bytes, then high */
        int L = K - c < C ? K - c : C;
        uint16_t u[64];
        for (int e = 0; e < L / 2; e++)
            u[e] = (uint16_t)((uint8_t)xq[c + 2 * e] | (uint8_t)xq[c + 2 * e + 1] << 8);
        for (int e = 0; e < L / 2; e++) {
            xq[c + e] = (int8_t)(u[e] & 255);
            xq[c + L / 2 + e] = (int8_t)(u[e] >> 8);
        }
    }
}

/* lmx_cpu_kernels.quant_x_fine: gen_quant_x's xq, then what it rounded
 * off in steps of 1/128, so that x keeps about 15 bits (q8 prefill on the
 * integer tile: 8 bits would put x's rounding, as large as q8's own, into
 * every product; docs/quantization.md). The step's division is exact. */
static inline void gen_quant_x_fine(const float *x, int K, int G, int8_t *xq, int8_t *xr, float *xd, int32_t *xqsum)
{
    gen_quant_x(x, K, G, 0, xq, xd, xqsum);
    for (int g = 0; g < K / G; g++) {
        float inv = xd[g] > 0 ? 1.0f / xd[g] : 0;
        int32_t s = 0;
        for (int k = g * G; k < (g + 1) * G; k++) {
            xr[k] = gen_round8((x[k] * inv - (float)xq[k]) * 128.0f);
            s += xr[k];
        }
        xd[g] /= 128.0f;
        xqsum[g] = 128 * xqsum[g] + s;
    }
}

/* e^x for x in [-87, 88] (clamped), within ~2 ulp: x = n ln2 + r, e^r
 * by its Taylor polynomial to r^7 (|r| <= ln2 / 2), 2^n put in the
 * exponent bits. Plain arithmetic, so that the loops calling it vectorise
 * (libm's expf does not). */
static inline float gen_exp(float x)
{
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    const float big = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (x * 1.44269504f + big) - big;
    float r = (x - n * 0.693359375f) + n * 2.12194440e-4f; /* ln2 in two parts */
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &e, 4);
    return p * two_n;
}

/* g[i] = act(g[i]) * u[i]: SiLU x sigmoid(x), or GELU's tanh form, which
 * is x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)). */
static inline void gen_gated_act(float *g, const float *u, size_t n, int gelu)
{
    const float c = 2 * 0.7978845608028654f;
    for (size_t i = 0; i < n; i++) {
        float x = g[i], a = gelu ? c * (x + 0.044715f * x * x * x) : x;
        g[i] = x / (1.0f + gen_exp(-a)) * u[i];
    }
}

/* The kernel table's softmax_exp. */
static inline float gen_softmax_exp(float *s, float m, int n)
{
    for (int i = 0; i < n; i++) /* vectorises; the sum after it, in order, does not */
        s[i] = s[i] == -INFINITY ? 0.0f : gen_exp(s[i] - m);
    float sum = 0;
    for (int i = 0; i < n; i++)
        sum += s[i];
    return sum;
}

/* One group of G source elements as float32: the kind is switched on once
 * a group, so that the copy loops vectorise. */
static inline void gen_load_group(const lmx_cpu_weight *w, size_t i, int G, float *v)
{
    const uint16_t *h = (const uint16_t *)w->data + i;
    switch (w->kind) {
    case LMX_WK_BF16:
        for (int k = 0; k < G; k++)
            v[k] = lmx_bf16_to_f32(h[k]);
        return;
    case LMX_WK_F16:
        for (int k = 0; k < G; k++)
            v[k] = lmx_f16_to_f32(h[k]);
        return;
    default: memcpy(v, (const float *)w->data + i, (size_t)G * sizeof *v);
    }
}

/* The group's minimum and maximum, 16 lanes wide so that the loop
 * vectorises (G is a multiple of 16). */
static inline void gen_min_max(const float *v, int G, float *lo, float *hi)
{
    float l[16], h[16];
    for (int j = 0; j < 16; j++)
        l[j] = h[j] = v[j];
    for (int k = 16; k < G; k += 16)
        for (int j = 0; j < 16; j++) {
            l[j] = v[k + j] < l[j] ? v[k + j] : l[j];
            h[j] = v[k + j] > h[j] ? v[k + j] : h[j];
        }
    *lo = l[0], *hi = h[0];
    for (int j = 1; j < 16; j++) {
        *lo = l[j] < *lo ? l[j] : *lo;
        *hi = h[j] > *hi ? h[j] : *hi;
    }
}

/* lmx_quant_rows (quant.h), compiled under each path's target. */
static inline void gen_quant_rows(const lmx_cpu_weight *src, const lmx_cpu_weight *dst, int r0, int r1)
{
    int K = src->cols, G = dst->group, ng = K / G, bits = dst->kind == LMX_WK_Q8 ? 8 : 4;
    int qmax = (1 << bits) - 1;
    float v[64]; /* groups are 32 or 64 */
    uint8_t qv[64];
    for (int r = r0; r < r1; r++) {
        uint8_t *q = (uint8_t *)dst->data + (size_t)r * (size_t)K * (size_t)bits / 8;
        uint16_t *sc = (uint16_t *)dst->scales + (size_t)r * ng, *bi = (uint16_t *)dst->biases + (size_t)r * ng;
        for (int g = 0; g < ng; g++) {
            float lo, hi;
            gen_load_group(src, (size_t)r * K + (size_t)g * G, G, v);
            gen_min_max(v, G, &lo, &hi);
            uint16_t bh = lmx_f32_to_f16(lo), sh = lmx_f32_to_f16((hi - lo) / (float)qmax);
            float b = lmx_f16_to_f32(bh), s = lmx_f16_to_f32(sh), fmax = (float)qmax;
            sc[g] = sh;
            bi[g] = bh;
            for (int k = 0; k < G; k++) {
                /* round half up; t below -0.5 only from float16 rounding of b */
                float t = s > 0 ? (v[k] - b) / s + 0.5f : 0;
                t = t < 0 ? 0 : t > fmax ? fmax : t;
                qv[k] = (uint8_t)(int)t;
            }
            if (bits == 8)
                memcpy(q + (size_t)g * G, qv, (size_t)G);
            else
                for (int k = 0; k < G / 2; k++)
                    q[(size_t)g * G / 2 + k] = (uint8_t)(qv[2 * k] | qv[2 * k + 1] << 4);
        }
    }
}

enum { MV_STREAMS = 4 }; /* decode matvec: streams a thread */

/* Decode streams the weights once: the SIMD paths prefetch this many
 * bytes ahead of each stream (on top of the hardware's), which keeps more
 * reads in flight. Measured (bench/RESULTS.md): 4 KB ahead, the earlier
 * distance, was slower on the Zen 5 machine than no prefetch at all for
 * bf16 (huge pages); float weights are fastest 1 KB ahead, q8 (malloc'd,
 * 4 KB pages) 2 KB ahead, 1 KB slower there (AVX-512, session 23). The
 * AVX2 path with these distances: two-thread decode 1.14x (bf16) and
 * 1.13x (q8) faster than without (session 25). Decode attention streams
 * each KV head's keys, then its values, a row at a time: 2 KB ahead (with
 * the block's softmax vectorised) the AVX-512 kernels read the cache at
 * 1.3-1.4x the rate without (session 25; 1 KB the same, 4 and 8 KB no
 * better). */
enum { PREFETCH_FLOAT = 1024, PREFETCH_QUANT = 2048, PREFETCH_KV = 2048 };

/* The line `ahead` bytes past p into every cache level (prefetcht0).
 * always_inline: a call left out of line is dropped as free of side
 * effects (gcc 12 did so in mv_quant, which then prefetched nothing). */
static inline __attribute__((always_inline)) void prefetch(const void *p, int ahead)
{
    __builtin_prefetch((const char *)p + ahead, 0, 3);
}

/* Decode's float matvec over rows r0..r1 of wd (K a row) with one x row:
 * ROWS(w, ws, K, x, out, ors, S) being a path's always-inline kernel of S
 * weight rows ws elements apart, the rows cut into MV_STREAMS parts and
 * row i of every part read at once (four streams a thread), rows left
 * over one at a time. */
#define GEN_FLOAT_MATVEC1(ROWS, wd, K, r0, r1, x, out)                                             \
    do {                                                                                           \
        size_t part_ = (size_t)((r1) - (r0)) / MV_STREAMS;                                         \
        for (int r_ = (r0); r_ < (r0) + (int)part_; r_++)                                          \
            ROWS((wd) + (size_t)r_ * (K), part_ * (K), K, x, (out) + r_, part_, MV_STREAMS);       \
        for (int r_ = (r0) + MV_STREAMS * (int)part_; r_ < (r1); r_++)                             \
            ROWS((wd) + (size_t)r_ * (K), 0, K, x, (out) + r_, 0, 1);                              \
    } while (0)

/* The q8/q4 matvec's calls, MV(w, r, part, x, out, ldo, P, N) being a
 * path's always-inline kernel of P weight rows (r + q * part) times N rows
 * of x: one x row (decode) reads four rows far apart side by side (four
 * streams a thread; rows left over one at a time), more x rows one weight
 * row at a time; P and N constants at every call. */
#define GEN_QUANT_MATVEC(MV, w, r0, r1, x, n, out, ldo)                                            \
    do {                                                                                           \
        if ((n) == 1) {                                                                            \
            size_t part_ = (size_t)((r1) - (r0)) / MV_STREAMS;                                     \
            for (int r_ = (r0); r_ < (r0) + (int)part_; r_++)                                      \
                MV(w, r_, part_, x, (out) + r_, ldo, MV_STREAMS, 1);                               \
            for (int r_ = (r0) + MV_STREAMS * (int)part_; r_ < (r1); r_++)                         \
                MV(w, r_, 0, x, (out) + r_, ldo, 1, 1);                                            \
        } else {                                                                                   \
            for (int r_ = (r0); r_ < (r1); r_++)                                                   \
                if ((n) == 2)                                                                      \
                    MV(w, r_, 0, x, (out) + r_, ldo, 1, 2);                                        \
                else if ((n) == 3)                                                                 \
                    MV(w, r_, 0, x, (out) + r_, ldo, 1, 3);                                        \
                else                                                                               \
                    MV(w, r_, 0, x, (out) + r_, ldo, 1, 4);                                        \
        }                                                                                          \
    } while (0)

/* Attention blocks of keys and values of element type T (float, or
 * uint16_t for float16) through the path's own dot and axpy over T. */
#define GEN_ATTN(SUFFIX, T, DOT, AXPY)                                                             \
    static void attn_scores_##SUFFIX(const float *q, const T *k, size_t stride, int nb, int hd, float *s) \
    {                                                                                              \
        for (int b = 0; b < nb; b++)                                                               \
            s[b] = DOT(q, k + (size_t)b * stride, hd);                                             \
    }                                                                                              \
    static void attn_accum_##SUFFIX(float *acc, const T *v, size_t stride, const float *p, int nb, int hd) \
    {                                                                                              \
        for (int b = 0; b < nb; b++)                                                               \
            AXPY(acc, p[b], v + (size_t)b * stride, hd);                                           \
    }

#endif
