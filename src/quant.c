#include "quant.h"

#include <math.h>
#include <string.h>

#include "dtype.h"

int lmx_quant_group(int cols)
{
    if (cols % 64 == 0)
        return 64;
    return cols % 32 == 0 ? 32 : 0;
}

size_t lmx_quant_row_bytes(int cols, int bits) { return (size_t)cols * (size_t)bits / 8; }

static float src_elem(const lmx_cpu_weight *w, size_t i)
{
    switch (w->kind) {
    case LMX_WK_BF16: return lmx_bf16_to_f32(((const uint16_t *)w->data)[i]);
    case LMX_WK_F16: return lmx_f16_to_f32(((const uint16_t *)w->data)[i]);
    default: return ((const float *)w->data)[i];
    }
}

void lmx_quant_rows(const lmx_cpu_weight *src, const lmx_cpu_weight *dst, int r0, int r1)
{
    int K = src->cols, G = dst->group, ng = K / G, bits = dst->kind == LMX_WK_Q8 ? 8 : 4;
    int qmax = (1 << bits) - 1;
    float v[64]; /* groups are 32 or 64 */
    for (int r = r0; r < r1; r++) {
        uint8_t *q = (uint8_t *)dst->data + (size_t)r * lmx_quant_row_bytes(K, bits);
        uint16_t *sc = (uint16_t *)dst->scales + (size_t)r * ng, *bi = (uint16_t *)dst->biases + (size_t)r * ng;
        for (int g = 0; g < ng; g++) {
            float lo = INFINITY, hi = -INFINITY;
            for (int k = 0; k < G; k++) {
                v[k] = src_elem(src, (size_t)r * K + (size_t)g * G + k);
                lo = v[k] < lo ? v[k] : lo;
                hi = v[k] > hi ? v[k] : hi;
            }
            uint16_t bh = lmx_f32_to_f16(lo), sh = lmx_f32_to_f16((hi - lo) / (float)qmax);
            float b = lmx_f16_to_f32(bh), s = lmx_f16_to_f32(sh);
            sc[g] = sh;
            bi[g] = bh;
            for (int k = 0; k < G; k++) {
                /* round half up; t below -0.5 only from float16 rounding of b */
                float t = s > 0 ? (v[k] - b) / s + 0.5f : 0;
                int qi = t < 0 ? 0 : t > (float)qmax ? qmax : (int)t;
                if (bits == 8)
                    q[(size_t)g * G + k] = (uint8_t)qi;
                else if (k % 2 == 0)
                    q[((size_t)g * G + k) / 2] = (uint8_t)qi;
                else
                    q[((size_t)g * G + k) / 2] |= (uint8_t)(qi << 4);
            }
        }
    }
}
