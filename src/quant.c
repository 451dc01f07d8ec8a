#include "quant.h"

int lmx_quant_group(int cols)
{
    if (cols % 64 == 0)
        return 64;
    return cols % 32 == 0 ? 32 : 0;
}

size_t lmx_quant_row_bytes(int cols, int bits) { return (size_t)cols * (size_t)bits / 8; }

size_t lmx_quant_matrix_bytes(int rows, int cols, int bits, int group)
{
    return (size_t)rows * (lmx_quant_row_bytes(cols, bits) + 2 * sizeof(uint16_t) * (size_t)(cols / group));
}

void lmx_quant_rows(const lmx_cpu_weight *src, const lmx_cpu_weight *dst, int r0, int r1)
{
    lmx_cpu_kernels_scalar()->quant_rows(src, dst, r0, r1);
}
