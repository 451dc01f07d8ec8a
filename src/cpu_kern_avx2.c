/* The AVX2 path (with FMA and F16C): 8 floats a vector. */
#include "cpu_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include "cpu_generic.h"

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 ld_bf16(const uint16_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const void *)p)), 16));
}
static inline __m256 ld_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const void *)p)); }
static inline __m256 ld_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
static inline float el_bf16(const uint16_t *p) { return lmx_bf16_to_f32(*p); }
static inline float el_f16(const uint16_t *p) { return h2f(*p); }
static inline float el_f32(const float *p) { return *p; }

/* One x row (decode, GEN_FLOAT_MATVEC1): out[q * ors] = w[q * ws .. + K)
 * . x for q < S (S <= MV_STREAMS, a constant where inlined), one weight
 * row a stream, all read side by side; each row summed exactly as alone. */
#define MATVEC_ROWS(NAME, T, LD, EL)                                                               \
    static inline __attribute__((always_inline)) void NAME(const T *w, size_t ws, int K, const float *x, \
                                                           float *out, size_t ors, int S)          \
    {                                                                                              \
        __m256 a[MV_STREAMS][4];                                                                   \
        for (int q = 0; q < S; q++)                                                                \
            a[q][0] = a[q][1] = a[q][2] = a[q][3] = _mm256_setzero_ps();                           \
        int k = 0;                                                                                 \
        for (; k + 32 <= K; k += 32) {                                                             \
            __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);                   \
            __m256 x2 = _mm256_loadu_ps(x + k + 16), x3 = _mm256_loadu_ps(x + k + 24);             \
            for (int q = 0; q < S; q++) {                                                          \
                const T *wq = w + q * ws + k;                                                      \
                for (size_t l = 0; l < 32 * sizeof(T); l += 64)                                    \
                    prefetch((const char *)wq + l, PREFETCH_FLOAT);                                \
                a[q][0] = _mm256_fmadd_ps(LD(wq), x0, a[q][0]);                                    \
                a[q][1] = _mm256_fmadd_ps(LD(wq + 8), x1, a[q][1]);                                \
                a[q][2] = _mm256_fmadd_ps(LD(wq + 16), x2, a[q][2]);                               \
                a[q][3] = _mm256_fmadd_ps(LD(wq + 24), x3, a[q][3]);                               \
            }                                                                                      \
        }                                                                                          \
        for (; k + 8 <= K; k += 8) {                                                               \
            __m256 xv = _mm256_loadu_ps(x + k);                                                    \
            for (int q = 0; q < S; q++)                                                            \
                a[q][0] = _mm256_fmadd_ps(LD(w + q * ws + k), xv, a[q][0]);                        \
        }                                                                                          \
        for (int q = 0; q < S; q++) {                                                              \
            float s = hsum(_mm256_add_ps(_mm256_add_ps(a[q][0], a[q][1]), _mm256_add_ps(a[q][2], a[q][3]))); \
            for (int kk = k; kk < K; kk++)                                                         \
                s += EL(w + q * ws + kk) * x[kk];                                                  \
            out[q * ors] = s;                                                                      \
        }                                                                                          \
    }

/* Float weights: with one x row, the rows r0..r1 cut into MV_STREAMS
 * parts (rows left over one at a time); with more, one weight row at a
 * time, read once for up to 4 x rows. */
#define MATVEC_FLOAT(NAME, T, LD, EL)                                                              \
    MATVEC_ROWS(NAME##_rows, T, LD, EL)                                                            \
    static void NAME(const T *wd, int K, int r0, int r1, const float *x, int n, float *out, int ldo) \
    {                                                                                              \
        if (n == 1) {                                                                              \
            GEN_FLOAT_MATVEC1(NAME##_rows, wd, K, r0, r1, x, out);                                 \
            return;                                                                                \
        }                                                                                          \
        for (int r = r0; r < r1; r++) {                                                            \
            const T *w = wd + (size_t)r * K;                                                       \
            __m256 acc[4];                                                                         \
            for (int i = 0; i < 4; i++)                                                            \
                acc[i] = _mm256_setzero_ps();                                                      \
            int k = 0;                                                                             \
            for (; k + 8 <= K; k += 8) {                                                           \
                __m256 wv = LD(w + k);                                                             \
                for (int i = 0; i < n; i++)                                                        \
                    acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (size_t)i * K + k), acc[i]);  \
            }                                                                                      \
            for (int i = 0; i < n; i++) {                                                          \
                float s = hsum(acc[i]);                                                            \
                for (int kk = k; kk < K; kk++)                                                     \
                    s += EL(w + kk) * x[(size_t)i * K + kk];                                       \
                out[(size_t)i * ldo + r] = s;                                                      \
            }                                                                                      \
        }                                                                                          \
    }

MATVEC_FLOAT(mv_bf16, uint16_t, ld_bf16, el_bf16)
MATVEC_FLOAT(mv_f16, uint16_t, ld_f16, el_f16)
MATVEC_FLOAT(mv_f32, float, ld_f32, el_f32)

/* Quantized rows against x quantized per group (lmx_cpu_x), 32 elements a
 * step: vpmaddubsw (unsigned weights times signed x, pairs summed in int16)
 * and vpmaddwd to int32, per group one conversion and one FMA. q4's pairs
 * stay below 2 * 15 * 127; q8's would overflow int16 (2 * 255 * 127), so
 * q8 runs on q - 128, by magnitude |q - 128| <= 128 with its sign moved onto
 * x, and adds 128 * sum(xq) per group back. P weight rows (r + q * part,
 * q < P) times N rows of x, P * N <= 4, both constants where inlined;
 * decode's P = 4 reads four rows far apart side by side, as MATVEC_FLOAT.
 * Sum (q, i) goes to out[i * ldo + q * part]. */
static inline __attribute__((always_inline)) void mv_quant(const lmx_cpu_weight *w, int r, size_t part,
                                                           const lmx_cpu_x *x, float *out, int ldo, const int P,
                                                           const int N)
{
    int K = w->cols, G = w->group, ng = K / G, q4 = w->kind == LMX_WK_Q4;
    size_t row_bytes = (size_t)K / (q4 ? 2 : 1);
    const __m128i low4 = _mm_set1_epi8(15);
    const __m256i ones = _mm256_set1_epi16(1), bias8 = _mm256_set1_epi8((char)0x80);
    const uint8_t *qr[4];
    const uint16_t *sc[4], *bi[4];
    __m256 acc[4]; /* index q * N + i */
    float bsum[4];
    for (int q = 0; q < P; q++) {
        size_t rq = (size_t)r + q * part;
        qr[q] = (const uint8_t *)w->data + rq * row_bytes;
        sc[q] = w->scales + rq * ng;
        bi[q] = w->biases + rq * ng;
    }
    for (int a = 0; a < P * N; a++)
        acc[a] = _mm256_setzero_ps(), bsum[a] = 0;
    for (int g = 0; g < ng; g++) {
        __m256i d[4];
        for (int a = 0; a < P * N; a++)
            d[a] = _mm256_setzero_si256();
        for (int c = g * G; c < (g + 1) * G; c += 32) {
            const int8_t *xc = x->xq + c;
            for (int q = 0; q < P; q++) {
                prefetch(qr[q] + c / (q4 ? 2 : 1), PREFETCH_QUANT);
                if (q4) { /* low nibbles (evens), then high (odds), as xq is ordered */
                    __m128i b = _mm_loadu_si128((const void *)(qr[q] + c / 2));
                    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(b, low4)),
                                                        _mm_and_si128(_mm_srli_epi16(b, 4), low4), 1);
                    for (int i = 0; i < N; i++) {
                        __m256i p = _mm256_maddubs_epi16(v, _mm256_loadu_si256((const void *)(xc + (size_t)i * K)));
                        d[q * N + i] = _mm256_add_epi32(d[q * N + i], _mm256_madd_epi16(p, ones));
                    }
                } else {
                    __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const void *)(qr[q] + c)), bias8);
                    __m256i mag = _mm256_abs_epi8(v);
                    for (int i = 0; i < N; i++) {
                        __m256i sx = _mm256_sign_epi8(_mm256_loadu_si256((const void *)(xc + (size_t)i * K)), v);
                        d[q * N + i] =
                            _mm256_add_epi32(d[q * N + i], _mm256_madd_epi16(_mm256_maddubs_epi16(mag, sx), ones));
                    }
                }
            }
        }
        for (int q = 0; q < P; q++) {
            float s = h2f(sc[q][g]), b = h2f(bi[q][g]);
            for (int i = 0; i < N; i++) {
                size_t o = (size_t)i * ng + (size_t)g;
                /* q8: s * (q . xq) = s * ((q - 128) . xq) + 128 * s * sum(xq) */
                float xd = x->xd[o], sb = q4 ? b : b + 128.0f * s;
                int a = q * N + i;
                acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[a]), _mm256_set1_ps(s * xd), acc[a]);
                bsum[a] += xd * sb * (float)x->xqsum[o];
            }
        }
    }
    for (int q = 0; q < P; q++)
        for (int i = 0; i < N; i++)
            out[(size_t)i * ldo + q * part] = hsum(acc[q * N + i]) + bsum[q * N + i];
}

static void matvec_avx2(const lmx_cpu_weight *w, int r0, int r1, const lmx_cpu_x *x, int n, float *out,
                        int ldo)
{
    switch (w->kind) {
    case LMX_WK_BF16: mv_bf16(w->data, w->cols, r0, r1, x->x, n, out, ldo); break;
    case LMX_WK_F16: mv_f16(w->data, w->cols, r0, r1, x->x, n, out, ldo); break;
    case LMX_WK_F32: mv_f32(w->data, w->cols, r0, r1, x->x, n, out, ldo); break;
    default:
        GEN_QUANT_MATVEC(mv_quant, w, r0, r1, x, n, out, ldo);
        break;
    }
}

static void decode_avx2(const lmx_cpu_weight *w, int r, float *dst)
{
    int K = w->cols, k = 0;
    const uint16_t *s = (const uint16_t *)w->data + (size_t)r * K;
    if (w->kind == LMX_WK_BF16) {
        for (; k + 8 <= K; k += 8)
            _mm256_storeu_ps(dst + k, ld_bf16(s + k));
    } else if (w->kind == LMX_WK_F16) {
        for (; k + 8 <= K; k += 8)
            _mm256_storeu_ps(dst + k, ld_f16(s + k));
    } else {
        gen_decode(w, r, dst);
        return;
    }
    for (; k < K; k++)
        dst[k] = w->kind == LMX_WK_BF16 ? lmx_bf16_to_f32(s[k]) : h2f(s[k]);
}

enum { MR = 6, NX = 16 };

static inline void store_col(float *out, int ldo, int r, int i0, int nx, __m256 v)
{
    float t[8];
    _mm256_storeu_ps(t, v);
    for (int i = 0; i < 8 && i0 + i < nx; i++)
        out[(size_t)(i0 + i) * ldo + r] = t[i];
}

/* 6 weight rows x 16 x rows: 12 accumulators of the 16 ymm registers. */
static void tile_avx2(const float *wt, int ldw, int mr, int K, const float *xt, int ldx, int nx, float *out, int ldo)
{
    const float *w0 = wt, *w1 = wt + ldw, *w2 = wt + 2 * (size_t)ldw, *w3 = wt + 3 * (size_t)ldw;
    const float *w4 = wt + 4 * (size_t)ldw, *w5 = wt + 5 * (size_t)ldw;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
           c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int k = 0; k < K; k++) {
        const float *xk = xt + (size_t)k * ldx;
        __m256 x0 = _mm256_loadu_ps(xk), x1 = _mm256_loadu_ps(xk + 8), b;
#define ROW2(R)                                                                                    \
    b = _mm256_broadcast_ss(w##R + k);                                                             \
    c##R##0 = _mm256_fmadd_ps(b, x0, c##R##0);                                                     \
    c##R##1 = _mm256_fmadd_ps(b, x1, c##R##1);
        ROW2(0) ROW2(1) ROW2(2) ROW2(3) ROW2(4) ROW2(5)
#undef ROW2
    }
    __m256 c[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (mr == MR) { /* each x row's 6 outputs are adjacent: one gather and one store a row */
        float t[MR][NX];
        for (int r = 0; r < MR; r++) {
            _mm256_storeu_ps(t[r], c[r][0]);
            _mm256_storeu_ps(t[r] + 8, c[r][1]);
        }
        const __m256i col = _mm256_setr_epi32(0, NX, 2 * NX, 3 * NX, 4 * NX, 5 * NX, 0, 0);
        const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
        for (int i = 0; i < nx; i++)
            _mm256_maskstore_ps(out + (size_t)i * ldo, six, _mm256_i32gather_ps(&t[0][i], col, 4));
        return;
    }
    for (int r = 0; r < mr; r++) {
        store_col(out, ldo, r, 0, nx, c[r][0]);
        if (nx > 8)
            store_col(out, ldo, r, 8, nx, c[r][1]);
    }
}

/* a . b and y += a * x, over float32 or (the KV cache) float16 b and x */
#define DOT_AXPY(SUFFIX, T, LD, EL)                                                                \
    static float dot_##SUFFIX(const float *a, const T *b, int n)                                   \
    {                                                                                              \
        __m256 s0 = _mm256_setzero_ps(), s1 = s0;                                                  \
        int i = 0;                                                                                 \
        for (; i + 16 <= n; i += 16) {                                                             \
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), LD(b + i), s0);                           \
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), LD(b + i + 8), s1);                   \
        }                                                                                          \
        float s = hsum(_mm256_add_ps(s0, s1));                                                     \
        for (; i < n; i++)                                                                         \
            s += a[i] * EL(b + i);                                                                 \
        return s;                                                                                  \
    }                                                                                              \
    static void axpy_##SUFFIX(float *y, float a, const T *x, int n)                                \
    {                                                                                              \
        __m256 av = _mm256_set1_ps(a);                                                             \
        int i = 0;                                                                                 \
        for (; i + 8 <= n; i += 8)                                                                 \
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, LD(x + i), _mm256_loadu_ps(y + i)));       \
        for (; i < n; i++)                                                                         \
            y[i] += a * EL(x + i);                                                                 \
    }

DOT_AXPY(avx2, float, ld_f32, el_f32)
DOT_AXPY(f16_avx2, uint16_t, ld_f16, el_f16)

static void scale_avx2(float *y, float a, int n)
{
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(av, _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] *= a;
}

GEN_ATTN(gen, float, dot_avx2, axpy_avx2)
GEN_ATTN(gen_f16, uint16_t, dot_f16_avx2, axpy_f16_avx2)

/* Lane j: the sum of a[j]'s lanes. */
static inline __m256 hsum8(const __m256 a[8])
{
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* Decode attention with the 16 ymm registers: eight keys scored at once
 * (each q load serves eight rows, one horizontal reduction for all eight)
 * when head_dim is a multiple of 8; the accumulator kept in registers 64
 * elements at a time, across the block, when it is a multiple of 64 (not
 * loaded and stored back every key); each row prefetched PREFETCH_KV
 * ahead. Other sizes take the GEN_ATTN kernels. Against those the cache
 * read 1.05-1.11x as fast for float32 and 1.16-1.32x for float16; neither
 * half alone was faster (bench/RESULTS.md, session 25). */
#define ATTN8(SUFFIX, T, LD, GEN)                                                                  \
    static void attn_scores_##SUFFIX(const float *q, const T *k, size_t stride, int nb, int hd, float *s) \
    {                                                                                              \
        int b = 0;                                                                                 \
        for (; hd % 8 == 0 && b + 8 <= nb; b += 8) {                                               \
            const T *kb = k + (size_t)b * stride;                                                  \
            for (int j = 0; j < 8; j++)                                                            \
                for (size_t l = 0; l < (size_t)hd * sizeof(T); l += 64)                            \
                    prefetch((const char *)(kb + (size_t)j * stride) + l, PREFETCH_KV);              \
            __m256 a[8];                                                                           \
            for (int j = 0; j < 8; j++)                                                            \
                a[j] = _mm256_setzero_ps();                                                        \
            for (int d = 0; d < hd; d += 8) {                                                      \
                __m256 qv = _mm256_loadu_ps(q + d);                                                \
                for (int j = 0; j < 8; j++)                                                        \
                    a[j] = _mm256_fmadd_ps(qv, LD(kb + (size_t)j * stride + d), a[j]);             \
            }                                                                                      \
            _mm256_storeu_ps(s + b, hsum8(a));                                                     \
        }                                                                                          \
        attn_scores_##GEN(q, k + (size_t)b * stride, stride, nb - b, hd, s + b);                   \
    }                                                                                              \
    static void attn_accum_##SUFFIX(float *acc, const T *v, size_t stride, const float *p, int nb, int hd) \
    {                                                                                              \
        if (hd % 64) {                                                                             \
            attn_accum_##GEN(acc, v, stride, p, nb, hd);                                           \
            return;                                                                                \
        }                                                                                          \
        for (int d0 = 0; d0 < hd; d0 += 64) {                                                      \
            __m256 av[8];                                                                          \
            for (int i = 0; i < 8; i++)                                                            \
                av[i] = _mm256_loadu_ps(acc + d0 + 8 * i);                                         \
            for (int b = 0; b < nb; b++) {                                                         \
                __m256 pb = _mm256_set1_ps(p[b]);                                                  \
                const T *vb = v + (size_t)b * stride + d0;                                         \
                for (int l = 0; l < 64 * (int)sizeof(T); l += 64)                                  \
                    prefetch((const char *)vb + l, PREFETCH_KV);                                   \
                for (int i = 0; i < 8; i++)                                                        \
                    av[i] = _mm256_fmadd_ps(pb, LD(vb + 8 * i), av[i]);                            \
            }                                                                                      \
            for (int i = 0; i < 8; i++)                                                            \
                _mm256_storeu_ps(acc + d0 + 8 * i, av[i]);                                         \
        }                                                                                          \
    }

ATTN8(avx2, float, ld_f32, gen)
ATTN8(f16_avx2, uint16_t, ld_f16, gen_f16)

static const lmx_cpu_kernels avx2 = {
    .path = LMX_CPU_AVX2,
    .q4_chunk = 32,
    .matvec = matvec_avx2,
    .quant_x = gen_quant_x,
    .quant_rows = gen_quant_rows,
    .decode = decode_avx2,
    .tile_mr = MR,
    .tile_nx = NX,
    .tile = tile_avx2,
    .attn_scores = attn_scores_avx2,
    .attn_accum = attn_accum_avx2,
    .attn_scores_f16 = attn_scores_f16_avx2,
    .attn_accum_f16 = attn_accum_f16_avx2,
    .gated_act = gen_gated_act,
    .softmax_exp = gen_softmax_exp,
    .dot = dot_avx2,
    .axpy = axpy_avx2,
    .scale = scale_avx2,
};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const lmx_cpu_kernels *lmx_cpu_kernels_avx2(void) { return &avx2; }

#else
const lmx_cpu_kernels *lmx_cpu_kernels_avx2(void) { return NULL; }
#endif
