/* Portable kernel bodies, static inline so that each cpu_kern_*.c compiles
 * them under its own target (the compiler vectorises them there). Included
 * only by cpu_kern_*.c. */
#ifndef LMX_CPU_GENERIC_H
#define LMX_CPU_GENERIC_H

#include <stddef.h>

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

/* Attention blocks through the path's own dot and axpy. */
#define GEN_ATTN(SUFFIX, DOT, AXPY)                                                                \
    static void attn_scores_##SUFFIX(const float *q, const float *k, size_t stride, int nb, int hd, float *s) \
    {                                                                                              \
        for (int b = 0; b < nb; b++)                                                               \
            s[b] = DOT(q, k + (size_t)b * stride, hd);                                             \
    }                                                                                              \
    static void attn_accum_##SUFFIX(float *acc, const float *v, size_t stride, const float *p, int nb, int hd) \
    {                                                                                              \
        for (int b = 0; b < nb; b++)                                                               \
            AXPY(acc, p[b], v + (size_t)b * stride, hd);                                           \
    }

#endif
