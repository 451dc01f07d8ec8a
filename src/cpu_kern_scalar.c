/* The portable path: plain C on any architecture, and the reference the
 * SIMD paths are tested against. */
#include <string.h>

#include "cpu_generic.h"

static inline float el_f32(float x) { return x; }

/* a . b and y += a * x, over float32 or (the KV cache) float16 b and x */
#define DOT_AXPY(SUFFIX, T, EL)                                                                    \
    static float dot_##SUFFIX(const float *a, const T *b, int n)                                   \
    {                                                                                              \
        float acc[8] = {0};                                                                        \
        int i = 0;                                                                                 \
        for (; i + 8 <= n; i += 8)                                                                 \
            for (int k = 0; k < 8; k++)                                                            \
                acc[k] += a[i + k] * EL(b[i + k]);                                                 \
        float s = 0;                                                                               \
        for (; i < n; i++)                                                                         \
            s += a[i] * EL(b[i]);                                                                  \
        for (int k = 0; k < 8; k++)                                                                \
            s += acc[k];                                                                           \
        return s;                                                                                  \
    }                                                                                              \
    static void axpy_##SUFFIX(float *y, float a, const T *x, int n)                                \
    {                                                                                              \
        for (int i = 0; i < n; i++)                                                                \
            y[i] += a * EL(x[i]);                                                                  \
    }

DOT_AXPY(scalar, float, el_f32)
DOT_AXPY(f16_scalar, uint16_t, gen_h2f)

static void scale_scalar(float *y, float a, int n)
{
    for (int i = 0; i < n; i++)
        y[i] *= a;
}

enum { CHUNK = 256 };

/* Quantized rows against x quantized per group (lmx_cpu_x): exact integer
 * dot products per group, scaled and biased in float. */
static void matvec_quant(const lmx_cpu_weight *w, int r0, int r1, const lmx_cpu_x *x, int n, float *out,
                         int ldo)
{
    int K = w->cols, G = w->group, ng = K / G, q4 = w->kind == LMX_WK_Q4;
    size_t row_bytes = (size_t)K / (q4 ? 2 : 1);
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)w->data + (size_t)r * row_bytes;
        const uint16_t *sc = w->scales + (size_t)r * ng, *bi = w->biases + (size_t)r * ng;
        for (int i = 0; i < n; i++) {
            float acc = 0;
            for (int g = 0; g < ng; g++) {
                const int8_t *xg = x->xq + (size_t)i * K + (size_t)g * G;
                int32_t d = 0;
                for (int k = 0; k < G; k++)
                    d += (q4 ? (q[(g * G + k) / 2] >> (4 * (k & 1))) & 15 : q[g * G + k]) * xg[k];
                size_t o = (size_t)i * ng + (size_t)g;
                acc += x->xd[o] * (gen_h2f(sc[g]) * (float)d + gen_h2f(bi[g]) * (float)x->xqsum[o]);
            }
            out[(size_t)i * ldo + r] = acc;
        }
    }
}

/* Decodes the weight row a chunk at a time into a stack buffer and dots it
 * with every x row, so each weight is read once. */
static void matvec_scalar(const lmx_cpu_weight *w, int r0, int r1, const lmx_cpu_x *x, int n, float *out,
                          int ldo)
{
    int K = w->cols;
    if (w->kind == LMX_WK_Q8 || w->kind == LMX_WK_Q4) {
        matvec_quant(w, r0, r1, x, n, out, ldo);
        return;
    }
    float row[CHUNK];
    lmx_cpu_weight one = *w;
    for (int r = r0; r < r1; r++) {
        float acc[4] = {0};
        if (w->kind == LMX_WK_F32) {
            const float *wr = (const float *)w->data + (size_t)r * K;
            for (int i = 0; i < n; i++)
                acc[i] = dot_scalar(wr, x->x + (size_t)i * K, K);
        } else if (K <= CHUNK) {
            gen_decode(w, r, row);
            for (int i = 0; i < n; i++)
                acc[i] = dot_scalar(row, x->x + (size_t)i * K, K);
        } else {
            /* a view of one chunk of the row as a one-row matrix (f16/bf16) */
            for (int k0 = 0; k0 < K; k0 += CHUNK) {
                int len = K - k0 < CHUNK ? K - k0 : CHUNK;
                one.cols = len;
                one.rows = 1;
                one.data = (const uint16_t *)w->data + (size_t)r * K + (size_t)k0;
                gen_decode(&one, 0, row);
                for (int i = 0; i < n; i++)
                    acc[i] += dot_scalar(row, x->x + (size_t)i * K + k0, len);
            }
        }
        for (int i = 0; i < n; i++)
            out[(size_t)i * ldo + r] = acc[i];
    }
}

enum { MR = 4, NX = 8 };

static void tile_scalar(const float *wt, int ldw, int mr, int K, const float *xt, int ldx, int nx, float *out, int ldo)
{
    float acc[MR][NX] = {{0}};
    for (int k = 0; k < K; k++) {
        const float *xk = xt + (size_t)k * ldx;
        for (int r = 0; r < MR; r++) {
            float wv = wt[(size_t)r * ldw + k];
            for (int i = 0; i < NX; i++)
                acc[r][i] += wv * xk[i];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int i = 0; i < nx; i++)
            out[(size_t)i * ldo + r] = acc[r][i];
}

GEN_ATTN(scalar, float, dot_scalar, axpy_scalar)
GEN_ATTN(f16_scalar, uint16_t, dot_f16_scalar, axpy_f16_scalar)

static const lmx_cpu_kernels scalar = {
    .path = LMX_CPU_SCALAR,
    .q4_chunk = 2,
    .matvec = matvec_scalar,
    .quant_x = gen_quant_x,
    .quant_rows = gen_quant_rows,
    .decode = gen_decode,
    .tile_mr = MR,
    .tile_nx = NX,
    .tile = tile_scalar,
    .attn_scores = attn_scores_scalar,
    .attn_accum = attn_accum_scalar,
    .attn_scores_f16 = attn_scores_f16_scalar,
    .attn_accum_f16 = attn_accum_f16_scalar,
    .gated_act = gen_gated_act,
    .softmax_exp = gen_softmax_exp,
    .dot = dot_scalar,
    .axpy = axpy_scalar,
    .scale = scale_scalar,
};

const lmx_cpu_kernels *lmx_cpu_kernels_scalar(void) { return &scalar; }

const lmx_cpu_kernels *lmx_cpu_kernels_for(lmx_cpu_path p)
{
    switch (p) {
    case LMX_CPU_AMX: return lmx_cpu_kernels_amx();
    case LMX_CPU_AVX512: return lmx_cpu_kernels_avx512();
    case LMX_CPU_AVX2: return lmx_cpu_kernels_avx2();
    default: return lmx_cpu_kernels_scalar();
    }
}
