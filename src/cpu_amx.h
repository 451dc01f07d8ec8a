/* AMX tile kernels for bf16 weights in prefill (the AMX path; x86-64
 * only). The matmul driver packs x once per product, 16 rows a block, then
 * runs lmx_amx_gemm on each band of 32 weight rows. */
#ifndef LMX_CPU_AMX_H
#define LMX_CPU_AMX_H

#include <stdint.h>

/* Rows [0, rows) of x (rows <= 16, K a multiple of 32) as one block: hi and
 * lo (K * 16 uint16 each; rows past `rows` zero) hold bf16(x) and
 * bf16(x - bf16(x)) as the tiles read them (pairs of k per dword, a tile
 * row per pair, a column per row of x). */
void lmx_amx_pack_x(const float *x, int K, int rows, uint16_t *hi, uint16_t *lo);
/* out[i * ldo + r] = w[r] . x[i] for 32 bf16 weight rows (row-major, K
 * columns) and i < n, x packed in blocks of 16 rows by lmx_amx_pack_x (an
 * even number of blocks, consecutive: block b at hi + b * K * 16). */
void lmx_amx_gemm(const uint16_t *w, int K, const uint16_t *hi, const uint16_t *lo, int n, float *out, int ldo);

#endif
