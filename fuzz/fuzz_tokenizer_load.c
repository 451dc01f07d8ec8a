/* libFuzzer: loading arbitrary tokenizer.json text. A file that loads must
 * then encode and decode a fixed text without crashing. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lmx_tokenizer *t = NULL;
    lmx_error err = {0};
    if (lmx_tokenizer_load_json((const char *)data, size, "fuzz.json", &t, &err) != LMX_OK) {
        if (t || !err.message[0])
            abort(); /* a failure leaves nothing behind and says why */
        return 0;
    }
    static const char text[] = "Hello wörld 12 <s> \xE6\x97\xA5 \xFF!";
    for (int flags = 0; flags < 4; flags++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (lmx_tokenizer_encode(t, text, sizeof text - 1, flags, &ids, &n, NULL) == LMX_OK) {
            char *out = NULL;
            lmx_tokenizer_decode(t, ids, n, flags & 1, &out, NULL, NULL);
            free(out);
        }
        free(ids);
    }
    lmx_tokenizer_free(t);
    return 0;
}
