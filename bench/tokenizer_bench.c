/* Tokenizer benchmark: load time of tokenizer.json and single-thread encode
 * throughput, line by line without special tokens (as ANCHORS.md measured
 * Hugging Face tokenizers), best of 3.
 * Usage: tokenizer_bench CORPUS DIR...   (see tokenizer_bench.sh) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fileutil.h"
#include "tokenizer.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Encodes every line of text; returns seconds, the token count and a
 * checksum of all ids (tokenizer_hf.py prints the same one). */
static double encode_lines(const lmx_tokenizer *t, const char *text, size_t len, size_t *tokens,
                           uint32_t *sum)
{
    double t0 = now();
    *tokens = 0;
    *sum = 0;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) + 1 : len;
        int32_t *ids = NULL;
        size_t n = 0;
        lmx_error err = {0};
        if (lmx_tokenizer_encode(t, text + at, end - at, 0, &ids, &n, &err) != LMX_OK) {
            fprintf(stderr, "encode: %s\n", err.message);
            exit(1);
        }
        *tokens += n;
        for (size_t i = 0; i < n; i++)
            *sum = *sum * 31 + (uint32_t)ids[i];
        free(ids);
        at = end;
    }
    return now() - t0;
}

static void bench_dir(const char *dir, const char *text, size_t len)
{
    double best_load = 1e9, best_enc = 1e9, best_a = 1e9;
    lmx_tokenizer *t = NULL;
    for (int r = 0; r < 3; r++) {
        lmx_error err = {0};
        lmx_tokenizer_free(t);
        double t0 = now();
        if (lmx_tokenizer_load(dir, &t, &err) != LMX_OK) {
            fprintf(stderr, "%s\n", err.message);
            exit(1);
        }
        double dt = now() - t0;
        best_load = dt < best_load ? dt : best_load;
    }
    size_t tokens = 0;
    uint32_t sum = 0;
    for (int r = 0; r < 3; r++) {
        double dt = encode_lines(t, text, len, &tokens, &sum);
        best_enc = dt < best_enc ? dt : best_enc;
    }
    /* the pathological case: 1 MB of "a" as one line */
    char *a = malloc(1 << 20);
    memset(a, 'a', 1 << 20);
    for (int r = 0; r < 3; r++) {
        size_t n;
        uint32_t s;
        double dt = encode_lines(t, a, 1 << 20, &n, &s);
        best_a = dt < best_a ? dt : best_a;
    }
    free(a);
    printf("%-40s load %7.1f ms   encode %6.2f MB/s (%zu tokens, ids checksum %08x, %.3f s)   "
           "1 MB of \"a\" %.3f s\n",
           dir, best_load * 1e3, (double)len / best_enc / 1e6, tokens, sum, best_enc, best_a);
    lmx_tokenizer_free(t);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: tokenizer_bench CORPUS DIR...\n");
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    lmx_error err = {0};
    if (lmx_read_file(argv[1], &text, &len, &err) != LMX_OK) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    printf("corpus %s: %.2f MB\n", argv[1], (double)len / 1e6);
    for (int i = 2; i < argc; i++)
        bench_dir(argv[i], text, len);
    free(text);
    return 0;
}
