/* The arithmetic of a draw over the whole row (docs/sampling.md): one
 * definition for the host sampler and the CUDA backend's read_draw, so that
 * both take the same IEEE steps and the same seed draws the same token
 * wherever the logits are. On the GPU every step is an explicitly rounded
 * intrinsic, which nvcc never fuses into a multiply-add; on the host gcc in
 * ISO C mode does not fuse either (and clang is told not to). */
#ifndef LMX_SAMPLE_MATH_H
#define LMX_SAMPLE_MATH_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__clang__) && !defined(__CUDACC__)
#pragma STDC FP_CONTRACT OFF
#endif

#ifdef __CUDACC__
#define LMX_SAMPLE_FN static __host__ __device__ __forceinline__
#else
/* forced inline: the host pass is built for several vector widths, each
 * with its own copy of these (sampler.c, PASS_BUILDS) */
#define LMX_SAMPLE_FN static inline __attribute__((always_inline))
#endif

#ifdef __CUDA_ARCH__
#define LMX_FMUL(a, b) __fmul_rn(a, b)
#define LMX_FADD(a, b) __fadd_rn(a, b)
#define LMX_FSUB(a, b) __fsub_rn(a, b)
#define LMX_FDIV(a, b) __fdiv_rn(a, b)
#else
#define LMX_FMUL(a, b) ((a) * (b))
#define LMX_FADD(a, b) ((a) + (b))
#define LMX_FSUB(a, b) ((a) - (b))
#define LMX_FDIV(a, b) ((a) / (b))
#endif

/* A draw over the whole row (a backend's read_draw): the sampler's
 * temperature and min_p (0: off), and the uniform number in [0, 1) that
 * picks the token. */
typedef struct {
    float temperature, min_p;
    double u;
} lmx_draw;

/* Tokens a partial sum of the dense layout covers (sampler.c kept_set). */
enum { LMX_SAMPLE_BLOCK = 256 };

/* exp(x) for x <= 0 in plain single-precision steps (no libm): the same
 * bits on every machine. Relative error about 1e-7; 0 below -87 (where
 * expf leaves the normal range). The range test works on the bits, as
 * float comparisons in a select keep gcc from vectorizing the loop over
 * the vocabulary. */
LMX_SAMPLE_FN float lmx_exp_nonpos(float x)
{
    const float log2e = 1.44269504f, ln2_hi = 0.693145751953125f, ln2_lo = 1.42860677e-6f;
    const uint32_t lim = 0x42AE0000u; /* 87.0f */
    uint32_t mag;
    memcpy(&mag, &x, sizeof mag);
    mag &= 0x7FFFFFFFu;
    uint32_t keep = 0u - (uint32_t)(mag <= lim);
    mag = (mag <= lim ? mag : lim) | 0x80000000u; /* -min(|x|, 87) */
    float xc;
    memcpy(&xc, &mag, sizeof xc);
    float k = LMX_FSUB(LMX_FADD(LMX_FMUL(xc, log2e), 0x1.8p23f), 0x1.8p23f); /* round to nearest integer */
    float r = LMX_FSUB(LMX_FSUB(xc, LMX_FMUL(k, ln2_hi)), LMX_FMUL(k, ln2_lo)); /* |r| <= ln2/2 */
    float q = 1.0f / 5040;                                                     /* Taylor series to r^7 */
    q = LMX_FADD(LMX_FMUL(q, r), 1.0f / 720);
    q = LMX_FADD(LMX_FMUL(q, r), 1.0f / 120);
    q = LMX_FADD(LMX_FMUL(q, r), 1.0f / 24);
    q = LMX_FADD(LMX_FMUL(q, r), 1.0f / 6);
    q = LMX_FADD(LMX_FMUL(q, r), 0.5f);
    q = LMX_FADD(LMX_FMUL(q, r), 1.0f);
    q = LMX_FADD(LMX_FMUL(q, r), 1.0f);
    uint32_t bits = (uint32_t)((int32_t)k + 127) << 23; /* 2^k, k >= -126 */
    float scale, y;
    memcpy(&scale, &bits, sizeof scale);
    y = LMX_FMUL(q, scale);
    memcpy(&bits, &y, sizeof bits);
    bits &= keep;
    memcpy(&y, &bits, sizeof y);
    return y;
}

/* TemperatureLogitsWarper; then NaN -> -inf (never drawn) and +inf ->
 * FLT_MAX (so that the exponentials stay finite: such tokens share the
 * mass). Never decreasing in x, which lmx_sampler_sample_top relies on. */
LMX_SAMPLE_FN float lmx_warped(float x, float t)
{
    float v = t != 1.0f ? LMX_FDIV(x, t) : x;
    v = v != v ? -INFINITY : v;
    return v == INFINITY ? FLT_MAX : v;
}

/* A block's sum from its 8 partial sums (partial j: elements j, j + 8, ...
 * in order, the tail after the last whole 8 to partial 0). */
LMX_SAMPLE_FN double lmx_sum8(const double *part)
{
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

#endif
