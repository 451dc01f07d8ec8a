/* The AMX path's prefill kernels (cpu_amx.h). Rounding x to bf16 alone
 * costs too much accuracy (docs/cpu.md), so x is split in two bf16 parts,
 * hi = bf16(x) and lo = bf16(x - hi), and each weight tile meets both: 16
 * bits of x's mantissa, twice the tile products, still far above the
 * float32 FMA rate. Weights that are not bf16 are split the same way and
 * take a third product (lo x lo is left out: below float32 rounding). */
#include "cpu_amx.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <string.h>

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")
#endif

/* Tiles: 0-3 the 32x32 output as 2x2 blocks, 4-5 two 16-row weight
 * blocks, 6-7 two 16-column x blocks. */
static inline void load_w(const uint16_t *w, int K, size_t ldw)
{
    _tile_loadd(4, w, ldw);
    _tile_loadd(5, w + 16 * (size_t)K, ldw);
}

static inline void load_x(const uint16_t *x, size_t blk)
{
    _tile_loadd(6, x, 64);
    _tile_loadd(7, x + blk, 64);
}

static inline void dot_2x2(void)
{
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
}

/* bf16 lanes widened back to float32 */
static inline __m512 bf16_to_ps(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

/* a[0, 32) as bf16 hi and lo parts, in order */
static inline void split32(const float *a, __m512i *h, __m512i *l)
{
    __m512 x0 = _mm512_loadu_ps(a), x1 = _mm512_loadu_ps(a + 16);
    *h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
    __m512 r0 = _mm512_sub_ps(x0, bf16_to_ps(_mm512_castsi512_si256(*h)));
    __m512 r1 = _mm512_sub_ps(x1, bf16_to_ps(_mm512_extracti64x4_epi64(*h, 1)));
    *l = (__m512i)_mm512_cvtne2ps_pbh(r1, r0);
}

void lmx_amx_split(const float *w, int K, uint16_t *hi, uint16_t *lo)
{
    for (int k = 0; k < K; k += 32) {
        __m512i h, l;
        split32(w + k, &h, &l);
        _mm512_storeu_si512(hi + k, h);
        if (lo)
            _mm512_storeu_si512(lo + k, l);
    }
}

void lmx_amx_pack_x(const float *x, int K, int rows, uint16_t *hi, uint16_t *lo)
{
    /* dword kk of a row's 32-element block goes to tile row kk, column i */
    const __m512i at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(16));
    memset(hi, 0, (size_t)K * 16 * sizeof *hi);
    memset(lo, 0, (size_t)K * 16 * sizeof *lo);
    for (int i = 0; i < rows; i++)
        for (int kb = 0; kb < K / 32; kb++) {
            __m512i h, l;
            split32(x + (size_t)i * K + (size_t)kb * 32, &h, &l);
            size_t o = (size_t)kb * 256 + (size_t)i; /* in dwords */
            _mm512_i32scatter_epi32((uint32_t *)hi + o, at, h, 4);
            _mm512_i32scatter_epi32((uint32_t *)lo + o, at, l, 4);
        }
}

typedef struct tile_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_cfg;

void lmx_amx_gemm(const uint16_t *w, const uint16_t *wlo, int K, const uint16_t *hi, const uint16_t *lo, int n,
                  float *out, int ldo)
{
    /* tiles 0-3: float32 sums (weight rows 0-15 / 16-31 x rows 0-15 /
     * 16-31); 4, 5: weights; 6, 7: x. All 16 rows of 64 bytes. */
    tile_cfg cfg = {.palette = 1};
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    size_t ldw = (size_t)K * sizeof *w, blk = (size_t)K * 16; /* x: uint16 per block of 16 rows */
    float c[32][32];
    for (int i0 = 0; i0 < n; i0 += 32) {
        const uint16_t *h0 = hi + (size_t)(i0 / 16) * blk, *l0 = lo + (size_t)(i0 / 16) * blk;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int kb = 0; kb < K / 32; kb++) {
            size_t o = (size_t)kb * 512;
            load_w(w + (size_t)kb * 32, K, ldw);
            load_x(h0 + o, blk);
            dot_2x2();
            load_x(l0 + o, blk);
            dot_2x2();
            if (wlo) {
                load_w(wlo + (size_t)kb * 32, K, ldw);
                load_x(h0 + o, blk);
                dot_2x2();
            }
        }
        _tile_stored(0, &c[0][0], 128);
        _tile_stored(1, &c[0][16], 128);
        _tile_stored(2, &c[16][0], 128);
        _tile_stored(3, &c[16][16], 128);
        int m = n - i0 < 32 ? n - i0 : 32;
        for (int i = 0; i < m; i++)
            for (int r = 0; r < 32; r++)
                out[(size_t)(i0 + i) * ldo + r] = c[r][i];
    }
    _tile_release();
}

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
