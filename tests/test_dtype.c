/* dtype conversions against values worked out by hand. */
#include <math.h>

#include "dtype.h"
#include "testutil.h"

int main(void)
{
    CHECK(lmx_bf16_to_f32(0x3f80) == 1.0f, "bf16 1.0");
    CHECK(lmx_bf16_to_f32(0xc000) == -2.0f, "bf16 -2.0");
    CHECK(lmx_f32_to_bf16(1.0f) == 0x3f80, "to bf16 1.0");
    /* 1 + 2^-8 is a tie between 0x3f80 and 0x3f81: round to even. */
    CHECK(lmx_f32_to_bf16(1.00390625f) == 0x3f80, "bf16 tie to even");
    CHECK(lmx_f32_to_bf16(1.01171875f) == 0x3f82, "bf16 tie to even (odd)");
    CHECK(lmx_f16_to_f32(0x3c00) == 1.0f, "f16 1.0");
    CHECK(lmx_f16_to_f32(0xc000) == -2.0f, "f16 -2.0");
    CHECK(lmx_f16_to_f32(0x0001) == ldexpf(1.0f, -24), "f16 smallest subnormal");
    CHECK(lmx_f16_to_f32(0x7bff) == 65504.0f, "f16 max");
    CHECK(lmx_f32_to_f16(65504.0f) == 0x7bff, "to f16 max");
    CHECK(lmx_f32_to_f16(1e6f) == 0x7c00, "to f16 overflow -> inf");
    CHECK(lmx_f32_to_f16(ldexpf(1.0f, -24)) == 0x0001, "to f16 subnormal");
    CHECK(lmx_f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00, "f16 tie to even");
    /* every f16 value round-trips */
    int bad = 0;
    for (unsigned h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00)
            continue;
        if (lmx_f32_to_f16(lmx_f16_to_f32((uint16_t)h)) != h)
            bad++;
    }
    CHECK(bad == 0, "%d f16 values do not round-trip", bad);
    lmx_dtype t;
    CHECK(lmx_dtype_parse("BF16", &t) == 0 && t == LMX_DT_BF16, "parse BF16");
    CHECK(lmx_dtype_parse("F64", &t) == -1, "F64 unknown");
    CHECK(lmx_dtype_size(LMX_DT_U32) == 4, "U32 size");
    return test_finish();
}
