/* The CPU backend's kernels, one table per SIMD path (cpu_kern_*.c). The
 * matmul driver (cpu_matmul.c) and the backend's ops call through it. */
#ifndef LMX_CPU_KERNELS_H
#define LMX_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_path.h"

typedef enum lmx_wkind { LMX_WK_F32, LMX_WK_F16, LMX_WK_BF16, LMX_WK_Q8, LMX_WK_Q4 } lmx_wkind;

/* A weight matrix [rows, cols] as the kernels read it. q8/q4 are MLX-style
 * group-wise affine (docs/quantization.md): w = scale * q + bias, q unsigned,
 * packed little-end first into uint32 words, cols * bits / 32 words a row. */
typedef struct lmx_cpu_weight {
    lmx_wkind kind;
    int rows, cols;
    const void *data;       /* borrowed: the mapping or the backend's copy */
    const uint16_t *scales; /* q8/q4: float16, rows x cols / group */
    const uint16_t *biases; /* q8/q4: float16, rows x cols / group */
    int group;              /* q8/q4: 32 or 64 (lmx_quant_group) */
} lmx_cpu_weight;

/* x as the matvec kernels read it: n rows of cols floats. For q8/q4
 * weights, x is also quantized to 8 bits per weight group g (x ~ xd[g] *
 * xq, xq in [-127, 127]), so that the kernels take integer dot products:
 * w . x = sum over g of xd[g] * (scale[g] * (q . xq) + bias[g] * xqsum[g]).
 * (The bias term on the quantized x too: with the exact sum of x, the error
 * of x would meet w - bias instead of w, 2-3x larger as bias = min.) */
typedef struct lmx_cpu_x {
    const float *x;       /* n x cols */
    const int8_t *xq;     /* q8/q4: n x cols; for q4, every run of q4_chunk elements (of at most a
                           * group with group 32; the row's last run shorter) stored evens, then
                           * odds (as the low, then the high nibbles) */
    const float *xd;      /* q8/q4: n x (cols / group) steps */
    const int32_t *xqsum; /* q8/q4: n x (cols / group) sums of xq over each group */
} lmx_cpu_x;

/* x for the integer GEMM tile (qgemm): rows quantized per weight group
 * in natural order (q4: quant_x, as decode; q8: quant_x_fine), gathered in
 * panels of qgemm_nx rows (rows past n zero), panel p at q (and lo) + p *
 * K / 4 * nx, d and b + p * (K / group) * nx: q[j * nx + i] = xq bytes 4j
 * .. 4j + 3 of the panel's row i as one int32 (one broadcast feeds a
 * vpdpbusd), lo the same of xr (NULL for q4), d[g * nx + i] = the step
 * in group g, b[g * nx + i] = step * xqsum (the bias term's factor). */
typedef struct lmx_cpu_xpanels {
    const int32_t *q, *lo;
    const float *d, *b;
} lmx_cpu_xpanels;

typedef struct lmx_cpu_kernels {
    lmx_cpu_path path;
    int q4_chunk; /* see lmx_cpu_x.xq; 2 = natural order; at most 128 */
    /* out[i * ldo + r] = w[r] . x[i] for r in [r0, r1), i < n <= 4: reads
     * each weight once whatever n is. */
    void (*matvec)(const lmx_cpu_weight *w, int r0, int r1, const lmx_cpu_x *x, int n, float *out,
                   int ldo);
    /* One row of x (K floats) quantized for matvec on q8/q4 weights with
     * groups of G: xq[K], and xd, xqsum[K / G] (lmx_cpu_x); with C > 0 (q4),
     * every run of C values of xq stored evens, then odds. */
    void (*quant_x)(const float *x, int K, int G, int C, int8_t *xq, float *xd, int32_t *xqsum);
    /* qgemm's x for q8 weights, about 15 bits (NULL without qgemm): xq as
     * quant_x (C = 0) and the residual xr in [-64, 64], x ~ xd[g] * (128 *
     * xq + xr), xqsum[g] the sum of 128 * xq + xr over the group. */
    void (*quant_x_fine)(const float *x, int K, int G, int8_t *xq, int8_t *xr, float *xd, int32_t *xqsum);
    /* lmx_quant_rows (quant.h); every path gives the same bytes */
    void (*quant_rows)(const lmx_cpu_weight *src, const lmx_cpu_weight *dst, int r0, int r1);
    /* dst[0, cols) = row r of w as float32. */
    void (*decode)(const lmx_cpu_weight *w, int r, float *dst);
    /* The GEMM micro-tile: mr rows of weights (wt: tile_mr rows of K
     * float32, row stride ldw) against nx <= tile_nx rows of x packed k-major
     * (xt[k * ldx + i]); writes out[i * ldo + r] for r < mr, i < nx. */
    int tile_mr, tile_nx;
    void (*tile)(const float *wt, int ldw, int mr, int K, const float *xt, int ldx, int nx, float *out, int ldo);
    /* The integer GEMM tile of q8/q4 weights (NULL where the path has
     * none): weight rows r0 .. r0 + qgemm_mr (fewer at the end) against n
     * rows of x in panels; writes out[i * ldo + r - r0]. With x->lo, sums
     * 128 * (q . xq) + q . xr. scratch: 64-byte aligned, qgemm_mr * (K + 8 *
     * K / 32) bytes, the rows repacked once. */
    int qgemm_mr, qgemm_nx;
    void (*qgemm)(const lmx_cpu_weight *w, int r0, const lmx_cpu_xpanels *x, int n, float *out, int ldo,
                  void *scratch);
    /* The bf16 GEMM tile (NULL where the path has none; run only where
     * lmx_cpu_avx512_bf16): bf16 weights against x rounded to bf16
     * (lmx_load_options.prefill_bf16), two products a lane at twice the
     * float32 rate. With K2 = (K + 1) / 2 pairs of k (an odd K's last
     * padded with 0): bf16_pack_w repacks rows 0 .. rows <= bf16_mr of w
     * (zero rows after) into wp (64-byte aligned, bf16_mr * K2 uint32), a
     * pair of every row per 64 bytes; bf16_pack_x rounds rows 0 .. rows <=
     * bf16_nx of x into one panel xp (bf16_nx * K2 uint32, zero rows
     * after), a pair of every row side by side; bf16_tile writes out[i *
     * ldo + r] = w[r] . x[i] for r < mr, i < nx from those. */
    int bf16_mr, bf16_nx;
    void (*bf16_pack_w)(const uint16_t *w, int K, int rows, uint32_t *wp);
    void (*bf16_pack_x)(const float *x, int K, int rows, uint32_t *xp);
    void (*bf16_tile)(const uint32_t *wp, int mr, int K, const uint32_t *xp, int nx, float *out, int ldo);
    /* Attention over a block of nb keys/values at rows k + b * stride:
     * s[b] = q . k_b, and acc[0, hd) += sum_b p[b] * v_b. */
    void (*attn_scores)(const float *q, const float *k, size_t stride, int nb, int hd, float *s);
    void (*attn_accum)(float *acc, const float *v, size_t stride, const float *p, int nb, int hd);
    /* The same over a float16 cache (lmx_load_options.kv_f16), float32 sums. */
    void (*attn_scores_f16)(const float *q, const uint16_t *k, size_t stride, int nb, int hd, float *s);
    void (*attn_accum_f16)(float *acc, const uint16_t *v, size_t stride, const float *p, int nb, int hd);
    /* The AMX path only (else NULL): weights against more than 4 rows of x
     * on AMX tiles (cpu_amx.h); the driver takes it for weights of a
     * multiple of 32 rows and columns. */
    void (*amx_pack_x)(const float *x, int K, int rows, uint16_t *hi, uint16_t *lo);
    void (*amx_split)(const float *w, int K, uint16_t *hi, uint16_t *lo);
    void (*amx_gemm)(const uint16_t *w, const uint16_t *wlo, int K, const uint16_t *hi, const uint16_t *lo, int n,
                     float *out, int ldo);
    /* g[i] = act(g[i]) * u[i], act SiLU (gelu 0) or GELU's tanh form */
    void (*gated_act)(float *g, const float *u, size_t n, int gelu);
    /* s[i] = e^(s[i] - m), 0 where s[i] is -inf (a masked key); returns
     * the sum (attention's softmax over a block of scores) */
    float (*softmax_exp)(float *s, float m, int n);
    float (*dot)(const float *a, const float *b, int n);
    void (*axpy)(float *y, float a, const float *x, int n); /* y += a * x */
    void (*scale)(float *y, float a, int n);                /* y *= a */
} lmx_cpu_kernels;

/* The table of a path; NULL when this build has no code for it. */
const lmx_cpu_kernels *lmx_cpu_kernels_scalar(void);
const lmx_cpu_kernels *lmx_cpu_kernels_avx2(void);
const lmx_cpu_kernels *lmx_cpu_kernels_avx512(void);
const lmx_cpu_kernels *lmx_cpu_kernels_amx(void);
const lmx_cpu_kernels *lmx_cpu_kernels_for(lmx_cpu_path p);

#endif
