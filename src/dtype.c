#include "dtype.h"

#include <math.h>

static const struct {
    const char *name;
    size_t size;
} dtype_info[LMX_DT_COUNT] = {
    [LMX_DT_F32] = {"F32", 4}, [LMX_DT_F16] = {"F16", 2}, [LMX_DT_BF16] = {"BF16", 2},
    [LMX_DT_I8] = {"I8", 1},   [LMX_DT_U8] = {"U8", 1},   [LMX_DT_I32] = {"I32", 4},
    [LMX_DT_U32] = {"U32", 4},
};

size_t lmx_dtype_size(lmx_dtype t) { return t < LMX_DT_COUNT ? dtype_info[t].size : 0; }

const char *lmx_dtype_name(lmx_dtype t) { return t < LMX_DT_COUNT ? dtype_info[t].name : "?"; }

int lmx_dtype_parse(const char *name, lmx_dtype *out)
{
    for (int t = 0; t < LMX_DT_COUNT; t++)
        if (strcmp(name, dtype_info[t].name) == 0) {
            *out = (lmx_dtype)t;
            return 0;
        }
    return -1;
}

float lmx_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: value = man * 2^-24 */
            float f = ldexpf((float)man, -24);
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t lmx_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    float a = fabsf(f);
    if (isnan(f))
        return sign | 0x7e00;
    if (a >= 65520.0f)
        return sign | 0x7c00;
    if (a < 6.103515625e-05f) { /* subnormal range: round to a multiple of 2^-24 */
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    }
    uint32_t mant = u & 0x7fffffu;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t half = ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))
        half++; /* may carry into the exponent, which is still correct */
    return sign | (uint16_t)half;
}
