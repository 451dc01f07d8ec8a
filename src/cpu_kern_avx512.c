/* The AVX-512 path (F, BW, VL, VNNI with FMA and F16C): 16 floats a vector. */
#include "cpu_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu_amx.h"
#include "dtype.h"

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif

#include "cpu_generic.h"

static inline __mmask16 tail_mask(int n) { return (__mmask16)((1u << n) - 1u); }

static inline __m512 ld_bf16(const uint16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)p)), 16));
}
static inline __m512 ld_bf16_tail(const uint16_t *p, int n)
{
    __m256i v = _mm256_maskz_loadu_epi16(tail_mask(n), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}
static inline __m512 ld_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const void *)p)); }
static inline __m512 ld_f16_tail(const uint16_t *p, int n)
{
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(n), p));
}
static inline __m512 ld_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 ld_f32_tail(const float *p, int n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* One x row (decode, GEN_FLOAT_MATVEC1): out[q * ors] = w[q * ws .. + K)
 * . x for q < S (S <= MV_STREAMS, a constant where inlined), one weight
 * row a stream, all read side by side, each with its prefetch: Gemma3-1B
 * bf16 decode on two threads went from 9.6-11.2 to 13.8-17.3 tok/s
 * (same-run A/B; 8 parts 13.0-14.5, 4 adjacent rows at once 8.2-9.0, 4
 * parts without the prefetch 11.5-13.7). Each row is summed exactly as
 * alone (four accumulators over 64-element steps, 16-element steps, the
 * tail). */
#define MATVEC_ROWS(NAME, T, LD, LDT)                                                              \
    static inline __attribute__((always_inline)) void NAME(const T *w, size_t ws, int K, const float *x, \
                                                           float *out, size_t ors, int S)          \
    {                                                                                              \
        __m512 a[MV_STREAMS][4];                                                                   \
        for (int q = 0; q < S; q++)                                                                \
            a[q][0] = a[q][1] = a[q][2] = a[q][3] = _mm512_setzero_ps();                           \
        int k = 0;                                                                                 \
        for (; k + 64 <= K; k += 64) {                                                             \
            __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);                  \
            __m512 x2 = _mm512_loadu_ps(x + k + 32), x3 = _mm512_loadu_ps(x + k + 48);             \
            for (int q = 0; q < S; q++) {                                                          \
                const T *wq = w + q * ws + k;                                                      \
                for (size_t l = 0; l < 64 * sizeof(T); l += 64)                                    \
                    prefetch((const char *)wq + l, PREFETCH_FLOAT);                                \
                a[q][0] = _mm512_fmadd_ps(LD(wq), x0, a[q][0]);                                    \
                a[q][1] = _mm512_fmadd_ps(LD(wq + 16), x1, a[q][1]);                               \
                a[q][2] = _mm512_fmadd_ps(LD(wq + 32), x2, a[q][2]);                               \
                a[q][3] = _mm512_fmadd_ps(LD(wq + 48), x3, a[q][3]);                               \
            }                                                                                      \
        }                                                                                          \
        for (; k + 16 <= K; k += 16) {                                                             \
            __m512 xv = _mm512_loadu_ps(x + k);                                                    \
            for (int q = 0; q < S; q++)                                                            \
                a[q][0] = _mm512_fmadd_ps(LD(w + q * ws + k), xv, a[q][0]);                        \
        }                                                                                          \
        if (k < K) {                                                                               \
            __m512 xt = ld_f32_tail(x + k, K - k);                                                 \
            for (int q = 0; q < S; q++)                                                            \
                a[q][1] = _mm512_fmadd_ps(LDT(w + q * ws + k, K - k), xt, a[q][1]);                \
        }                                                                                          \
        for (int q = 0; q < S; q++)                                                                \
            out[q * ors] = _mm512_reduce_add_ps(                                                   \
                _mm512_add_ps(_mm512_add_ps(a[q][0], a[q][1]), _mm512_add_ps(a[q][2], a[q][3])));  \
    }

/* Float weights: with one x row, the rows r0..r1 cut into MV_STREAMS
 * parts (rows left over one at a time); with more, one weight row at a
 * time, read once for up to 4 x rows. */
#define MATVEC_FLOAT(NAME, T, LD, LDT)                                                             \
    MATVEC_ROWS(NAME##_rows, T, LD, LDT)                                                           \
    static void NAME(const T *wd, int K, int r0, int r1, const float *x, int n, float *out, int ldo) \
    {                                                                                              \
        if (n == 1) {                                                                              \
            GEN_FLOAT_MATVEC1(NAME##_rows, wd, K, r0, r1, x, out);                                 \
            return;                                                                                \
        }                                                                                          \
        for (int r = r0; r < r1; r++) {                                                            \
            const T *w = wd + (size_t)r * K;                                                       \
            __m512 acc[4];                                                                         \
            for (int i = 0; i < 4; i++)                                                            \
                acc[i] = _mm512_setzero_ps();                                                      \
            int k = 0;                                                                             \
            for (; k + 16 <= K; k += 16) {                                                         \
                __m512 wv = LD(w + k);                                                             \
                for (int i = 0; i < n; i++)                                                        \
                    acc[i] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (size_t)i * K + k), acc[i]);  \
            }                                                                                      \
            if (k < K) {                                                                           \
                __m512 wv = LDT(w + k, K - k);                                                     \
                for (int i = 0; i < n; i++)                                                        \
                    acc[i] = _mm512_fmadd_ps(wv, ld_f32_tail(x + (size_t)i * K + k, K - k), acc[i]); \
            }                                                                                      \
            for (int i = 0; i < n; i++)                                                            \
                out[(size_t)i * ldo + r] = _mm512_reduce_add_ps(acc[i]);                           \
        }                                                                                          \
    }

MATVEC_FLOAT(mv_bf16, uint16_t, ld_bf16, ld_bf16_tail)
MATVEC_FLOAT(mv_f16, uint16_t, ld_f16, ld_f16_tail)
MATVEC_FLOAT(mv_f32, float, ld_f32, ld_f32_tail)

static inline float hsum256(__m256 v)
{
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* The weights of group 64 (elements c .. c + 63 of the row) as unsigned
 * bytes in xq's order; of group 32, the lower 32 bytes and zeros. */
static inline __m512i ld_q(const uint8_t *q, int c, int q4, int G)
{
    if (!q4)
        return _mm512_maskz_loadu_epi8(G >= 64 ? ~0ull : 0xffffffffull, q + c);
    const __m256i low4 = _mm256_set1_epi8(15);
    if (G >= 64) { /* low nibbles (evens), then high (odds) */
        __m256i b = _mm256_loadu_si256((const void *)(q + c / 2));
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b, low4)),
                                  _mm256_and_si256(_mm256_srli_epi16(b, 4), low4), 1);
    }
    __m128i b = _mm_loadu_si128((const void *)(q + c / 2));
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(b, _mm256_castsi256_si128(low4))),
                                        _mm_and_si128(_mm_srli_epi16(b, 4), _mm256_castsi256_si128(low4)), 1);
    return _mm512_zextsi256_si512(v);
}

/* Quantized rows against x quantized per group (lmx_cpu_x): P weight rows
 * (r + q * part, q < P) times N rows of x, P * N <= 4, both constants
 * where inlined (so the arrays below live in registers). Per group one
 * vpdpbusd (unsigned weights times signed x, four products a lane, exact
 * in int32), one conversion and one FMA with scale * step; steps and the
 * bias terms 8 groups at a time. Each weight is read, and q4 split into
 * nibbles, once for all N rows of x; P > 1 (decode) reads P rows far
 * apart side by side, as MATVEC_FLOAT. Sum (q, i) goes to out[i * ldo +
 * q * part]. */
static inline __attribute__((always_inline)) void mv_quant(const lmx_cpu_weight *w, int r, size_t part,
                                                           const lmx_cpu_x *x, float *out, int ldo, const int P,
                                                           const int N)
{
    int K = w->cols, G = w->group, ng = K / G, q4 = w->kind == LMX_WK_Q4;
    size_t row_bytes = (size_t)K / (q4 ? 2 : 1);
    const int8_t *xq = x->xq;
    const float *xd = x->xd;
    const int32_t *qs = x->xqsum;
    __mmask64 xmask = G >= 64 ? ~0ull : 0xffffffffull;
    const uint8_t *qr[4];
    const uint16_t *sc[4], *bi[4];
    __m512 acc[4], acc2[4]; /* index q * N + i */
    __m256 bacc[4];
    for (int q = 0; q < P; q++) {
        size_t rq = (size_t)r + q * part;
        qr[q] = (const uint8_t *)w->data + rq * row_bytes;
        sc[q] = w->scales + rq * ng;
        bi[q] = w->biases + rq * ng;
        /* the scales and biases are streams of their own, four rows ahead
         * (the weights' prefetch does not reach them): Qwen3-0.6B q8 decode
         * on two threads ~7% faster (bench/RESULTS.md, session 23) */
        prefetch(sc[q] + 4 * ng, 0);
        prefetch(bi[q] + 4 * ng, 0);
    }
    for (int a = 0; a < P * N; a++)
        acc[a] = acc2[a] = _mm512_setzero_ps(), bacc[a] = _mm256_setzero_ps();
    for (int g0 = 0; g0 < ng; g0 += 8) {
        int m = ng - g0 < 8 ? ng - g0 : 8;
        __mmask8 mk = (__mmask8)((1u << m) - 1u);
        float sd[4][8];
        for (int q = 0; q < P; q++) {
            __m256 s8 = _mm256_cvtph_ps(_mm_maskz_loadu_epi16(mk, sc[q] + g0));
            __m256 b8 = _mm256_cvtph_ps(_mm_maskz_loadu_epi16(mk, bi[q] + g0));
            for (int i = 0; i < N; i++) {
                size_t o = (size_t)i * ng + (size_t)g0;
                __m256 d8 = _mm256_maskz_loadu_ps(mk, xd + o);
                _mm256_storeu_ps(sd[q * N + i], _mm256_mul_ps(s8, d8));
                __m256 qs8 = _mm256_cvtepi32_ps(_mm256_maskz_loadu_epi32(mk, qs + o));
                bacc[q * N + i] = _mm256_fmadd_ps(_mm256_mul_ps(b8, d8), qs8, bacc[q * N + i]);
            }
        }
        int j = 0;
        if (q4 && G == 64) /* two groups a load: xq in runs of 128 */
            for (; j + 1 < m; j += 2) {
                int c = (g0 + j) * G;
                for (int q = 0; q < P; q++) {
                    prefetch(qr[q] + c / 2, PREFETCH_QUANT);
                    __m512i b = _mm512_loadu_si512(qr[q] + c / 2), f = _mm512_set1_epi8(15);
                    __m512i lo = _mm512_and_si512(b, f), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), f);
                    for (int i = 0; i < N; i++) {
                        const int8_t *xi = xq + (size_t)i * K + c;
                        __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xi));
                        d = _mm512_dpbusd_epi32(d, hi, _mm512_loadu_si512(xi + 64)); /* lanes 0-7: group j */
                        int a = q * N + i;
                        __m512 s = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(sd[a][j])),
                                                                       _mm256_castps_pd(_mm256_set1_ps(sd[a][j + 1])), 1));
                        if (j & 2)
                            acc2[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc2[a]);
                        else
                            acc[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc[a]);
                    }
                }
            }
        for (; j < m; j++) {
            int c = (g0 + j) * G;
            for (int q = 0; q < P; q++) {
                prefetch(qr[q] + c / (q4 ? 2 : 1), PREFETCH_QUANT);
                __m512i v = ld_q(qr[q], c, q4, G);
                for (int i = 0; i < N; i++) {
                    __m512i xv = _mm512_maskz_loadu_epi8(xmask, xq + (size_t)i * K + c);
                    __m512 d = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), v, xv));
                    int a = q * N + i;
                    if (j & 1) /* two chains of FMAs */
                        acc2[a] = _mm512_fmadd_ps(d, _mm512_set1_ps(sd[a][j]), acc2[a]);
                    else
                        acc[a] = _mm512_fmadd_ps(d, _mm512_set1_ps(sd[a][j]), acc[a]);
                }
            }
        }
    }
    for (int q = 0; q < P; q++)
        for (int i = 0; i < N; i++) {
            int a = q * N + i;
            out[(size_t)i * ldo + q * part] =
                _mm512_reduce_add_ps(_mm512_add_ps(acc[a], acc2[a])) + hsum256(bacc[a]);
        }
}

static void matvec_avx512(const lmx_cpu_weight *w, int r0, int r1, const lmx_cpu_x *x, int n, float *out,
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

/* Quantized row r: per group s * q + b, 16 elements a step; q4's bytes
 * widened to 16 bits, low nibble to the low byte and high to the high, so
 * that the bytes come out in element order. */
static void decode_quant(const lmx_cpu_weight *w, int r, float *dst)
{
    int K = w->cols, G = w->group, ng = K / G, q4 = w->kind == LMX_WK_Q4;
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r * K / (q4 ? 2 : 1);
    const uint16_t *sc = w->scales + (size_t)r * ng, *bi = w->biases + (size_t)r * ng;
    for (int g = 0; g < ng; g++) {
        __m512 s = _mm512_set1_ps(h2f(sc[g])), b = _mm512_set1_ps(h2f(bi[g]));
        for (int c = g * G; c < (g + 1) * G; c += 32) {
            __m256i v; /* 32 values as bytes, in order */
            if (q4) {
                __m256i h = _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)(q + c / 2)));
                v = _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(15)),
                                    _mm256_slli_epi16(_mm256_srli_epi16(h, 4), 8));
            } else {
                v = _mm256_loadu_si256((const void *)(q + c));
            }
            __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(v)));
            __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(v, 1)));
            _mm512_storeu_ps(dst + c, _mm512_fmadd_ps(s, lo, b));
            _mm512_storeu_ps(dst + c + 16, _mm512_fmadd_ps(s, hi, b));
        }
    }
}

static void decode_avx512(const lmx_cpu_weight *w, int r, float *dst)
{
    int K = w->cols, k = 0;
    const uint16_t *s = (const uint16_t *)w->data + (size_t)r * K;
    if (w->kind == LMX_WK_Q8 || w->kind == LMX_WK_Q4) {
        decode_quant(w, r, dst);
        return;
    } else if (w->kind == LMX_WK_BF16) {
        for (; k + 16 <= K; k += 16)
            _mm512_storeu_ps(dst + k, ld_bf16(s + k));
    } else if (w->kind == LMX_WK_F16) {
        for (; k + 16 <= K; k += 16)
            _mm512_storeu_ps(dst + k, ld_f16(s + k));
    } else {
        gen_decode(w, r, dst);
        return;
    }
    for (; k < K; k++)
        dst[k] = w->kind == LMX_WK_BF16 ? lmx_bf16_to_f32(s[k]) : h2f(s[k]);
}

enum { MR = 8, NX = 32 };

static inline void store_col(float *out, int ldo, int r, int i0, int nx, __m512 v)
{
    float t[16];
    _mm512_storeu_ps(t, v);
    for (int i = 0; i < 16 && i0 + i < nx; i++)
        out[(size_t)(i0 + i) * ldo + r] = t[i];
}

/* 8 weight rows x 32 x rows: 16 accumulators; per k two loads of x and
 * eight broadcast weights. */
static void tile_avx512(const float *wt, int ldw, int mr, int K, const float *xt, int ldx, int nx, float *out, int ldo)
{
    const float *w0 = wt, *w1 = wt + ldw, *w2 = wt + 2 * (size_t)ldw, *w3 = wt + 3 * (size_t)ldw;
    const float *w4 = wt + 4 * (size_t)ldw, *w5 = wt + 5 * (size_t)ldw, *w6 = wt + 6 * (size_t)ldw,
                *w7 = wt + 7 * (size_t)ldw;
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
           c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    if (nx > 16) {
        for (int k = 0; k < K; k++) {
            const float *xk = xt + (size_t)k * ldx;
            __m512 x0 = _mm512_loadu_ps(xk), x1 = _mm512_loadu_ps(xk + 16), b;
#define ROW2(R)                                                                                    \
    b = _mm512_set1_ps(w##R[k]);                                                                   \
    c##R##0 = _mm512_fmadd_ps(b, x0, c##R##0);                                                     \
    c##R##1 = _mm512_fmadd_ps(b, x1, c##R##1);
            ROW2(0) ROW2(1) ROW2(2) ROW2(3) ROW2(4) ROW2(5) ROW2(6) ROW2(7)
#undef ROW2
        }
    } else {
        for (int k = 0; k < K; k++) {
            __m512 x0 = _mm512_loadu_ps(xt + (size_t)k * ldx);
            c00 = _mm512_fmadd_ps(_mm512_set1_ps(w0[k]), x0, c00);
            c10 = _mm512_fmadd_ps(_mm512_set1_ps(w1[k]), x0, c10);
            c20 = _mm512_fmadd_ps(_mm512_set1_ps(w2[k]), x0, c20);
            c30 = _mm512_fmadd_ps(_mm512_set1_ps(w3[k]), x0, c30);
            c40 = _mm512_fmadd_ps(_mm512_set1_ps(w4[k]), x0, c40);
            c50 = _mm512_fmadd_ps(_mm512_set1_ps(w5[k]), x0, c50);
            c60 = _mm512_fmadd_ps(_mm512_set1_ps(w6[k]), x0, c60);
            c70 = _mm512_fmadd_ps(_mm512_set1_ps(w7[k]), x0, c70);
        }
    }
    __m512 c[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31},
                       {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71}};
    if (mr == MR) { /* each x row's 8 outputs are adjacent: one gather and one store a row */
        float t[MR][NX];
        for (int r = 0; r < MR; r++) {
            _mm512_storeu_ps(t[r], c[r][0]);
            _mm512_storeu_ps(t[r] + 16, c[r][1]);
        }
        const __m256i col = _mm256_setr_epi32(0, NX, 2 * NX, 3 * NX, 4 * NX, 5 * NX, 6 * NX, 7 * NX);
        for (int i = 0; i < nx; i++)
            _mm256_storeu_ps(out + (size_t)i * ldo, _mm256_i32gather_ps(&t[0][i], col, 4));
        return;
    }
    for (int r = 0; r < mr; r++) {
        store_col(out, ldo, r, 0, nx, c[r][0]);
        if (nx > 16)
            store_col(out, ldo, r, 16, nx, c[r][1]);
    }
}

/* The integer GEMM tile (qgemm) of q8/q4 weights: QMR weight rows,
 * repacked once a call so that one 64-byte vector holds 4 consecutive
 * weights of 16 rows (row r's at bytes 4r .. 4r + 3; q4 widened to bytes),
 * against QNX rows of x at a time, whose 4 bytes at a time are broadcast:
 * per group 2 x QNX int32 sums of vpdpbusd (unsigned weights times signed
 * x, exact; q8: 128 * (q . xq) + q . xr, below 2^28), then into float as
 * the matvec does: += step * (scale * sum + bias * xqsum). */
enum { QMR = 32, QV = QMR / 16, QNX = 6 };

/* v[c] lane r = v[r] lane c, for 16 vectors of 16 int32. */
static inline void transpose16(__m512i v[16])
{
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) { /* in each 128-bit block: elements 0-1, 2-3 of rows i, i + 1 */
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* v[i + e], block l: element 4l + e of rows i .. i + 3 */
        v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int e = 0; e < 4; e++) { /* element 4l + e: block l of v[e], v[4 + e], v[8 + e], v[12 + e] */
        __m512i a = _mm512_shuffle_i32x4(v[e], v[4 + e], 0x88), b = _mm512_shuffle_i32x4(v[e], v[4 + e], 0xdd);
        __m512i c = _mm512_shuffle_i32x4(v[8 + e], v[12 + e], 0x88), d = _mm512_shuffle_i32x4(v[8 + e], v[12 + e], 0xdd);
        t[e] = _mm512_shuffle_i32x4(a, c, 0x88);
        t[4 + e] = _mm512_shuffle_i32x4(b, d, 0x88);
        t[8 + e] = _mm512_shuffle_i32x4(a, c, 0xdd);
        t[12 + e] = _mm512_shuffle_i32x4(b, d, 0xdd);
    }
    for (int i = 0; i < 16; i++)
        v[i] = t[i];
}

/* Elements c .. c + 63 of a quantized row as bytes in order (only c ..
 * c + 31 with half, the rest zero); q4's nibbles widened as decode_quant. */
static inline __m512i ld_row64(const uint8_t *q, int c, int q4, int half)
{
    if (!q4)
        return _mm512_maskz_loadu_epi8(half ? 0xffffffffull : ~0ull, q + c);
    __m256i b = _mm256_maskz_loadu_epi8(half ? 0xffffu : ~0u, q + c / 2);
    __m512i h = _mm512_cvtepu8_epi16(b);
    return _mm512_or_si512(_mm512_and_si512(h, _mm512_set1_epi16(15)), _mm512_slli_epi16(_mm512_srli_epi16(h, 4), 8));
}

/* Rows r0 .. r0 + mr (zero rows up to QMR) into wq, vector (j, v) at
 * (j * QV + v) * 64 holding weights 4j .. 4j + 3 of rows 16v .. 16v + 15,
 * and their scales and biases as float, ws[g * QMR + r]. */
static void qgemm_pack(const lmx_cpu_weight *w, int r0, int mr, uint8_t *wq, float *ws, float *wb)
{
    int K = w->cols, ng = K / w->group, q4 = w->kind == LMX_WK_Q4;
    size_t rb = (size_t)K / (q4 ? 2 : 1);
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r0 * rb;
    for (int v = 0; v < QV; v++)
        for (int c = 0; c < K; c += 64) {
            __m512i t[16];
            int half = K - c < 64; /* K is a multiple of 32 */
            for (int r = 0; r < 16; r++) {
                int row = 16 * v + r;
                t[r] = row < mr ? ld_row64(q + (size_t)row * rb, c, q4, half) : _mm512_setzero_si512();
            }
            transpose16(t);
            for (int j = 0; j < (half ? 8 : 16); j++)
                _mm512_store_si512(wq + ((size_t)(c / 4 + j) * QV + v) * 64, t[j]);
        }
    for (int g = 0; g < ng; g++)
        for (int r = 0; r < QMR; r++) {
            size_t o = (size_t)(r0 + r) * ng + g;
            ws[g * QMR + r] = r < mr ? h2f(w->scales[o]) : 0.0f;
            wb[g * QMR + r] = r < mr ? h2f(w->biases[o]) : 0.0f;
        }
}

/* s += the repacked weights' quads j0 .. j1 times one panel's x. */
static inline __attribute__((always_inline)) void qgemm_dot(__m512i s[QV][QNX], const uint8_t *wq,
                                                            const int32_t *xq, int j0, int j1)
{
    for (int j = j0; j < j1; j++) {
        __m512i wv[QV];
        for (int v = 0; v < QV; v++)
            wv[v] = _mm512_load_si512(wq + ((size_t)j * QV + v) * 64);
        for (int i = 0; i < QNX; i++) {
            __m512i xv = _mm512_set1_epi32(xq[(size_t)j * QNX + i]);
            for (int v = 0; v < QV; v++)
                s[v][i] = _mm512_dpbusd_epi32(s[v][i], wv[v], xv);
        }
    }
}

/* The repacked rows against one panel of x (lmx_cpu_xpanels; xr NULL or
 * the panel's lo): QV x QNX accumulators of each kind in registers over
 * all of K; writes nx rows of out, the rows' lanes masked by m. */
static void qgemm_block(const uint8_t *wq, const float *ws, const float *wb, int K, int G, const int32_t *xq,
                        const int32_t *xr, const float *xd, const float *xb, float *out, int ldo,
                        const __mmask16 m[QV], int nx)
{
    __m512 acc[QV][QNX];
    for (int v = 0; v < QV; v++)
        for (int i = 0; i < QNX; i++)
            acc[v][i] = _mm512_setzero_ps();
    for (int g = 0; g < K / G; g++) {
        __m512i s[QV][QNX];
        for (int v = 0; v < QV; v++)
            for (int i = 0; i < QNX; i++)
                s[v][i] = _mm512_setzero_si512();
        qgemm_dot(s, wq, xq, g * G / 4, (g + 1) * G / 4);
        if (xr) {
            for (int v = 0; v < QV; v++)
                for (int i = 0; i < QNX; i++)
                    s[v][i] = _mm512_slli_epi32(s[v][i], 7);
            qgemm_dot(s, wq, xr, g * G / 4, (g + 1) * G / 4);
        }
        for (int i = 0; i < QNX; i++) {
            __m512 d = _mm512_set1_ps(xd[g * QNX + i]), e = _mm512_set1_ps(xb[g * QNX + i]);
            for (int v = 0; v < QV; v++) {
                __m512 sd = _mm512_mul_ps(_mm512_loadu_ps(ws + g * QMR + 16 * v), d);
                acc[v][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[v][i]), sd, acc[v][i]);
                acc[v][i] = _mm512_fmadd_ps(_mm512_loadu_ps(wb + g * QMR + 16 * v), e, acc[v][i]);
            }
        }
    }
    for (int i = 0; i < QNX; i++) /* constant indices: acc stays in registers */
        for (int v = 0; v < QV && i < nx; v++)
            _mm512_mask_storeu_ps(out + (size_t)i * ldo + 16 * v, m[v], acc[v][i]);
}

static void qgemm_avx512(const lmx_cpu_weight *w, int r0, const lmx_cpu_xpanels *x, int n, float *out, int ldo,
                         void *scratch)
{
    int K = w->cols, ng = K / w->group, mr = w->rows - r0 < QMR ? w->rows - r0 : QMR;
    uint8_t *wq = scratch;
    float *ws = (float *)(wq + (size_t)QMR * K), *wb = ws + (size_t)QMR * ng;
    __mmask16 m[QV];
    for (int v = 0; v < QV; v++) {
        int left = mr - 16 * v;
        m[v] = left >= 16 ? 0xffff : left > 0 ? tail_mask(left) : 0;
    }
    qgemm_pack(w, r0, mr, wq, ws, wb);
    for (int p = 0; p * QNX < n; p++) {
        size_t o = (size_t)p * QNX;
        qgemm_block(wq, ws, wb, K, w->group, x->q + o * K / 4, x->lo ? x->lo + o * K / 4 : NULL, x->d + o * ng,
                    x->b + o * ng, out + o * ldo, ldo, m, n - p * QNX < QNX ? n - p * QNX : QNX);
    }
}

/* The bf16 GEMM tile (lmx_load_options.prefill_bf16): vdpbf16ps takes two
 * bf16 products a lane, at twice the float32 FMA rate. BMR weight rows,
 * repacked so that one vector holds a pair of k of 16 rows, against BNX
 * rows of x, whose pair of k is broadcast: BV x BNX float32 sums in
 * registers over all of K. These functions run only where the CPU has
 * AVX-512 BF16 (lmx_cpu_avx512_bf16): compiled for it on top of the file's
 * target. */
enum { BMR = 32, BV = BMR / 16, BNX = 12 };
#define BF16_TARGET __attribute__((target("avx512bf16")))

/* Rows 0 .. rows of w (at most BMR, K bf16 each; zero rows after) as
 * wp[(j * BV + v) * 16 + r] = elements 2j, 2j + 1 of row 16v + r (one
 * uint32 as they lie; an odd K's last pair padded with 0). */
static void bf16_pack_w(const uint16_t *w, int K, int rows, uint32_t *wp)
{
    int K2 = (K + 1) / 2;
    for (int v = 0; v < BV; v++)
        for (int c = 0; c < K; c += 32) { /* 32 elements: 16 pairs */
            __m512i t[16];
            __mmask32 m = K - c < 32 ? (__mmask32)((1ull << (K - c)) - 1) : ~(__mmask32)0;
            for (int r = 0; r < 16; r++) {
                int row = 16 * v + r;
                t[r] = row < rows ? _mm512_maskz_loadu_epi16(m, w + (size_t)row * K + c) : _mm512_setzero_si512();
            }
            transpose16(t);
            for (int j = 0; j < 16 && c / 2 + j < K2; j++)
                _mm512_store_si512(wp + ((size_t)(c / 2 + j) * BV + v) * 16, t[j]);
        }
}

/* Rows 0 .. rows of x (at most BNX; zero rows after) rounded to bf16 as
 * one panel: xp[j * BNX + i] = elements 2j, 2j + 1 of row i, 16 pairs of
 * every row at a time through transpose16 (BNX <= 16), whose vector j
 * then holds pair j of the rows in its first BNX lanes (a scatter a row
 * cost ~3 cycles an element). vcvtne2ps2bf16 rounds to nearest even, as
 * lmx_f32_to_bf16, but flushes denormals to zero (they weigh nothing in a
 * sum). */
BF16_TARGET static void bf16_pack_x(const float *x, int K, int rows, uint32_t *xp)
{
    int K2 = (K + 1) / 2;
    for (int c = 0; c < K; c += 32) {
        int left = K - c;
        __m512i t[16];
        for (int i = 0; i < 16; i++) {
            __m512 x0 = _mm512_setzero_ps(), x1 = x0;
            if (i < rows) {
                x0 = ld_f32_tail(x + (size_t)i * K + c, left < 16 ? left : 16);
                x1 = left > 16 ? ld_f32_tail(x + (size_t)i * K + c + 16, left < 32 ? left - 16 : 16) : x1;
            }
            t[i] = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
        }
        transpose16(t);
        for (int j = 0; j < 16 && c / 2 + j < K2; j++)
            _mm512_mask_storeu_epi32(xp + (size_t)(c / 2 + j) * BNX, tail_mask(BNX), t[j]);
    }
}

/* out[i * ldo + r] = wp's row r . xp's row i, for r < mr, i < nx (wp and
 * xp as packed above). */
BF16_TARGET static void bf16_tile(const uint32_t *wp, int mr, int K, const uint32_t *xp, int nx, float *out,
                                  int ldo)
{
    __m512 acc[BV][BNX];
    for (int v = 0; v < BV; v++)
        for (int i = 0; i < BNX; i++)
            acc[v][i] = _mm512_setzero_ps();
    for (int j = 0; j < (K + 1) / 2; j++) {
        __m512bh wv[BV];
        for (int v = 0; v < BV; v++)
            wv[v] = (__m512bh)_mm512_load_si512(wp + ((size_t)j * BV + v) * 16);
        for (int i = 0; i < BNX; i++) {
            __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xp[(size_t)j * BNX + i]);
            for (int v = 0; v < BV; v++)
                acc[v][i] = _mm512_dpbf16_ps(acc[v][i], wv[v], xv);
        }
    }
    for (int i = 0; i < BNX; i++) /* constant indices: acc stays in registers */
        for (int v = 0; v < BV && i < nx; v++) {
            int left = mr - 16 * v;
            if (left > 0)
                _mm512_mask_storeu_ps(out + (size_t)i * ldo + 16 * v, left >= 16 ? 0xffff : tail_mask(left),
                                      acc[v][i]);
        }
}

/* a . b and y += a * x, over float32 or (the KV cache) float16 b and x */
#define DOT_AXPY(SUFFIX, T, LD, LDT)                                                               \
    static float dot_##SUFFIX(const float *a, const T *b, int n)                                   \
    {                                                                                              \
        __m512 s0 = _mm512_setzero_ps(), s1 = s0;                                                  \
        int i = 0;                                                                                 \
        for (; i + 32 <= n; i += 32) {                                                             \
            s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), LD(b + i), s0);                           \
            s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), LD(b + i + 16), s1);                 \
        }                                                                                          \
        for (; i < n; i += 16) {                                                                   \
            int m = n - i < 16 ? n - i : 16;                                                       \
            s0 = _mm512_fmadd_ps(ld_f32_tail(a + i, m), LDT(b + i, m), s0);                        \
        }                                                                                          \
        return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));                                        \
    }                                                                                              \
    static void axpy_##SUFFIX(float *y, float a, const T *x, int n)                                \
    {                                                                                              \
        __m512 av = _mm512_set1_ps(a);                                                             \
        int i = 0;                                                                                 \
        for (; i + 16 <= n; i += 16)                                                               \
            _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, LD(x + i), _mm512_loadu_ps(y + i)));       \
        if (i < n) {                                                                               \
            __mmask16 m = tail_mask(n - i);                                                        \
            _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, LDT(x + i, n - i), _mm512_maskz_loadu_ps(m, y + i))); \
        }                                                                                          \
    }

DOT_AXPY(avx512, float, ld_f32, ld_f32_tail)
DOT_AXPY(f16_avx512, uint16_t, ld_f16, ld_f16_tail)

static void scale_avx512(float *y, float a, int n)
{
    __m512 av = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(av, _mm512_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] *= a;
}

GEN_ATTN(gen, float, dot_avx512, axpy_avx512)
GEN_ATTN(gen_f16, uint16_t, dot_f16_avx512, axpy_f16_avx512)

/* Head sizes 128 and 256 keep q, or the accumulator, in registers across
 * the whole block of keys; other sizes take the GEN_ATTN kernels. */
#define ATTN_NV(SUFFIX, T, LD, GEN)                                                                \
    static inline __attribute__((always_inline)) void scores_nv_##SUFFIX(const float *q, const T *k, size_t stride, \
                                                                         int nb, float *s, const int NV) \
    {                                                                                              \
        __m512 qv[16];                                                                             \
        for (int i = 0; i < NV; i++)                                                               \
            qv[i] = _mm512_loadu_ps(q + 16 * i);                                                   \
        for (int b = 0; b < nb; b++) {                                                             \
            const T *kb = k + (size_t)b * stride;                                                  \
            for (int l = 0; l < NV * 16 * (int)sizeof(T); l += 64)                                 \
                prefetch((const char *)kb + l, PREFETCH_KV);                                       \
            __m512 a0 = _mm512_mul_ps(qv[0], LD(kb)), a1 = _mm512_mul_ps(qv[1], LD(kb + 16));      \
            for (int i = 2; i < NV; i += 2) {                                                      \
                a0 = _mm512_fmadd_ps(qv[i], LD(kb + 16 * i), a0);                                  \
                a1 = _mm512_fmadd_ps(qv[i + 1], LD(kb + 16 * i + 16), a1);                         \
            }                                                                                      \
            s[b] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));                                    \
        }                                                                                          \
    }                                                                                              \
    static inline __attribute__((always_inline)) void accum_nv_##SUFFIX(float *acc, const T *v, size_t stride, \
                                                                        const float *p, int nb, const int NV) \
    {                                                                                              \
        __m512 av[16];                                                                             \
        for (int i = 0; i < NV; i++)                                                               \
            av[i] = _mm512_loadu_ps(acc + 16 * i);                                                 \
        for (int b = 0; b < nb; b++) {                                                             \
            __m512 pb = _mm512_set1_ps(p[b]);                                                      \
            const T *vb = v + (size_t)b * stride;                                                  \
            for (int l = 0; l < NV * 16 * (int)sizeof(T); l += 64)                                 \
                prefetch((const char *)vb + l, PREFETCH_KV);                                       \
            for (int i = 0; i < NV; i++)                                                           \
                av[i] = _mm512_fmadd_ps(pb, LD(vb + 16 * i), av[i]);                               \
        }                                                                                          \
        for (int i = 0; i < NV; i++)                                                               \
            _mm512_storeu_ps(acc + 16 * i, av[i]);                                                 \
    }                                                                                              \
    static void attn_scores_##SUFFIX(const float *q, const T *k, size_t stride, int nb, int hd, float *s) \
    {                                                                                              \
        if (hd == 128)                                                                             \
            scores_nv_##SUFFIX(q, k, stride, nb, s, 8);                                            \
        else if (hd == 256)                                                                        \
            scores_nv_##SUFFIX(q, k, stride, nb, s, 16);                                           \
        else                                                                                       \
            attn_scores_##GEN(q, k, stride, nb, hd, s);                                            \
    }                                                                                              \
    static void attn_accum_##SUFFIX(float *acc, const T *v, size_t stride, const float *p, int nb, int hd) \
    {                                                                                              \
        if (hd == 128)                                                                             \
            accum_nv_##SUFFIX(acc, v, stride, p, nb, 8);                                           \
        else if (hd == 256)                                                                        \
            accum_nv_##SUFFIX(acc, v, stride, p, nb, 16);                                          \
        else                                                                                       \
            attn_accum_##GEN(acc, v, stride, p, nb, hd);                                           \
    }

ATTN_NV(avx512, float, ld_f32, gen)
ATTN_NV(f16_avx512, uint16_t, ld_f16, gen_f16)

#define AVX512_TABLE                                                                               \
    .q4_chunk = 128, .matvec = matvec_avx512, .quant_x = gen_quant_x, .quant_rows = gen_quant_rows, .decode = decode_avx512, .tile_mr = MR, \
    .tile_nx = NX, .tile = tile_avx512, .attn_scores = attn_scores_avx512, .attn_accum = attn_accum_avx512, \
    .attn_scores_f16 = attn_scores_f16_avx512, .attn_accum_f16 = attn_accum_f16_avx512, \
    .gated_act = gen_gated_act, .softmax_exp = gen_softmax_exp, .dot = dot_avx512, .axpy = axpy_avx512, .scale = scale_avx512

/* qgemm and the bf16 tile on this path only: the amx path's prefill stays as it was */
static const lmx_cpu_kernels avx512 = {
    .path = LMX_CPU_AVX512, AVX512_TABLE, .quant_x_fine = gen_quant_x_fine, .qgemm_mr = QMR, .qgemm_nx = QNX,
    .qgemm = qgemm_avx512, .bf16_mr = BMR, .bf16_nx = BNX, .bf16_pack_w = bf16_pack_w, .bf16_pack_x = bf16_pack_x,
    .bf16_tile = bf16_tile};
/* the same, with bf16 prefill on AMX tiles */
static const lmx_cpu_kernels amx = {
    .path = LMX_CPU_AMX, AVX512_TABLE, .amx_pack_x = lmx_amx_pack_x, .amx_split = lmx_amx_split,
    .amx_gemm = lmx_amx_gemm};

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const lmx_cpu_kernels *lmx_cpu_kernels_avx512(void) { return &avx512; }
const lmx_cpu_kernels *lmx_cpu_kernels_amx(void) { return &amx; }

#else
const lmx_cpu_kernels *lmx_cpu_kernels_avx512(void) { return NULL; }
const lmx_cpu_kernels *lmx_cpu_kernels_amx(void) { return NULL; }
#endif
