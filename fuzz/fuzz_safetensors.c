/* libFuzzer target: any byte string given to lmx_st_parse must yield either
 * a validated tensor list whose ranges lie inside the input, or an error. */
#include <stdint.h>
#include <stdlib.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lmx_st_tensor *t = NULL;
    size_t n = 0;
    lmx_error err;
    if (lmx_st_parse(data, size, "fuzz", &t, &n, &err) == LMX_OK) {
        for (size_t i = 0; i < n; i++) {
            const uint8_t *p = t[i].data;
            if (p < data || t[i].nbytes > size || p + t[i].nbytes > data + size)
                abort();
        }
    }
    lmx_st_free_tensors(t, n);
    return 0;
}
