/* Element types of stored tensors and the conversions every layer shares. */
#ifndef LMX_DTYPE_H
#define LMX_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum lmx_dtype {
    LMX_DT_F32,
    LMX_DT_F16,
    LMX_DT_BF16,
    LMX_DT_I8,
    LMX_DT_U8,
    LMX_DT_I32,
    LMX_DT_U32,
    LMX_DT_COUNT
} lmx_dtype;

/* Bytes per element. */
size_t lmx_dtype_size(lmx_dtype t);
/* The safetensors spelling ("F32", "BF16", ...). */
const char *lmx_dtype_name(lmx_dtype t);
/* Parses a safetensors dtype string; returns 0 and sets *out, or -1. */
int lmx_dtype_parse(const char *name, lmx_dtype *out);

static inline float lmx_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as torch does; NaN stays NaN. */
static inline uint16_t lmx_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float lmx_f16_to_f32(uint16_t h);
uint16_t lmx_f32_to_f16(float f);

#endif
