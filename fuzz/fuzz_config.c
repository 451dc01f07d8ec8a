/* libFuzzer target: config.json (and, after a NUL byte, generation_config.json)
 * through lmx_config_parse. */
#include <stdint.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const char *nul = memchr(text, 0, size);
    size_t len = nul ? (size_t)(nul - text) : size;
    const char *gen = nul ? nul + 1 : NULL;
    size_t gen_len = nul ? size - len - 1 : 0;
    lmx_config cfg;
    lmx_error err;
    if (lmx_config_parse(text, len, gen, gen_len, "fuzz", &cfg, &err) == LMX_OK)
        lmx_config_free(&cfg);
    return 0;
}
