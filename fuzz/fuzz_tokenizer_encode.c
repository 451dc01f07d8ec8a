/* libFuzzer: encoding arbitrary bytes with the real Qwen3 and Gemma3
 * tokenizers (loaded once from tests/data/tokenizers, installed by
 * scripts/fetch-tokenizers.sh). The first byte picks tokenizer and flags;
 * every encoding must decode, and stream-decode to the same text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static lmx_tokenizer *toks[2];

static void load(int i, const char *fam)
{
    /* __FILE__ is fuzz/fuzz_tokenizer_encode.c in the source tree */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", __FILE__);
    char *slash = strrchr(dir, '/');
    snprintf(slash ? slash : dir, sizeof dir - (size_t)(slash ? slash - dir : 0),
             "%s../tests/data/tokenizers/%s", slash ? "/" : "", fam);
    lmx_error err = {0};
    if (lmx_tokenizer_load(dir, &toks[i], &err) != LMX_OK) {
        fprintf(stderr, "fuzz_tokenizer_encode: %s (run scripts/fetch-tokenizers.sh)\n", err.message);
        abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    load(0, "qwen3");
    load(1, "gemma3");
    return 0;
}

static void check_stream(const lmx_tokenizer *t, const int32_t *ids, size_t n, int skip)
{
    char *full = NULL;
    size_t flen = 0;
    if (lmx_tokenizer_decode(t, ids, n, skip, &full, &flen, NULL) != LMX_OK)
        abort();
    lmx_detok *d = lmx_detok_new(t, skip);
    size_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t len;
        if ((i < n ? lmx_detok_push(d, ids[i], &p, &len, NULL) : lmx_detok_flush(d, &p, &len)) != LMX_OK)
            abort();
        if (at + len > flen || memcmp(full + at, p, len) || !lmx_tokutf8_valid(p, len))
            abort();
        at += len;
    }
    if (at != flen)
        abort();
    lmx_detok_free(d);
    free(full);
}

static int is_ascii(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] >= 0x80)
            return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size)
        return 0;
    const lmx_tokenizer *t = toks[data[0] & 1];
    int flags = (data[0] >> 1) & 3;
    int32_t *ids = NULL;
    size_t n = 0;
    if (lmx_tokenizer_encode(t, (const char *)data + 1, size - 1, flags, &ids, &n, NULL) != LMX_OK)
        abort();
    check_stream(t, ids, n, (data[0] >> 3) & 1);
    /* ASCII (unchanged by NFC) round-trips exactly through Qwen's byte-level BPE */
    if (flags == LMX_TOK_PLAIN_SPECIAL && (data[0] & 1) == 0 && is_ascii(data + 1, size - 1)) {
        char *text = NULL;
        size_t len = 0;
        if (lmx_tokenizer_decode(t, ids, n, 0, &text, &len, NULL) != LMX_OK || len != size - 1 ||
            memcmp(text, data + 1, len))
            abort();
        free(text);
    }
    free(ids);
    return 0;
}
