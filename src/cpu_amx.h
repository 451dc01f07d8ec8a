/* AMX tile kernels for prefill (the AMX path; x86-64 only). The matmul
 * driver packs x once per product, 16 rows a block, then runs lmx_amx_gemm
 * on each band of 32 weight rows: bf16 weights as they lie, others decoded
 * and split by lmx_amx_split. */
#ifndef LMX_CPU_AMX_H
#define LMX_CPU_AMX_H

#include <stdint.h>

/* Rows [0, rows) of x (rows <= 16, K a multiple of 32) as one block: hi and
 * lo (K * 16 uint16 each; rows past `rows` zero) hold bf16(x) and
 * bf16(x - bf16(x)) as the tiles read them (pairs of k per dword, a tile
 * row per pair, a column per row of x). */
void lmx_amx_pack_x(const float *x, int K, int rows, uint16_t *hi, uint16_t *lo);
/* w[0, K) (K a multiple of 32) as bf16 hi and lo parts (lo NULL: hi only). */
void lmx_amx_split(const float *w, int K, uint16_t *hi, uint16_t *lo);
/* out[i * ldo + r] = (w[r] + wlo[r]) . x[i] for 32 bf16 weight rows
 * (row-major, K columns; wlo NULL or the low parts) and i < n, x packed in
 * blocks of 16 rows by lmx_amx_pack_x (an even number of blocks,
 * consecutive: block b at hi + b * K * 16). */
void lmx_amx_gemm(const uint16_t *w, const uint16_t *wlo, int K, const uint16_t *hi, const uint16_t *lo, int n,
                  float *out, int ldo);

#endif
