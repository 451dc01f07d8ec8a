/* On-load weight quantization to MLX's group-wise affine layout
 * (docs/quantization.md): per group of `group` consecutive elements of a
 * row, w ~ scale * q + bias with q an unsigned `bits`-bit integer. */
#ifndef LMX_QUANT_H
#define LMX_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_kernels.h"

/* The group size for a row of cols elements: 64, else 32 when 64 does not
 * divide cols; 0 when neither does (the weight stays as stored). */
int lmx_quant_group(int cols);
/* Bytes of the packed values of one row. */
size_t lmx_quant_row_bytes(int cols, int bits);
/* Bytes of a quantized [rows, cols] matrix with groups of `group`: the
 * packed values, then a float16 scale and bias a group. */
size_t lmx_quant_matrix_bytes(int rows, int cols, int bits, int group);
/* Quantizes rows [r0, r1) of src (f32, f16 or bf16) into dst, whose data,
 * scales and biases point at whole-matrix buffers (rows x row_bytes, and
 * rows x cols / group float16 each). Scale and bias are rounded to float16
 * first and q chosen for the rounded pair, so what is stored is what is
 * used. The portable code; the backend runs its path's copy (cpu_kernels.h). */
void lmx_quant_rows(const lmx_cpu_weight *src, const lmx_cpu_weight *dst, int r0, int r1);

#endif
