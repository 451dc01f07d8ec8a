/* Minimal test helpers: CHECK records a failure and goes on; every test
 * program ends with `return test_finish();`, which prints a summary and
 * fails when any check failed or no check ran at all. */
#ifndef LMX_TESTUTIL_H
#define LMX_TESTUTIL_H

#include <stddef.h>
#include <stdio.h>

#include "lmx.h"
#include "safetensors.h"

extern int test_checks, test_failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(cond)) {                                                                             \
            test_failures++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

int test_finish(void);
/* Runs a shell command, returns its exit status (-1 if it did not exit);
 * its stdout goes to *out (malloc'd, may be NULL) when out is not NULL. */
int test_run(const char *cmd, char **out);
/* Directory for scratch files of this test (created, under the build dir). */
const char *test_tmpdir(void);
/* Fixture references: tensor "p{k}.{what}" of a refs.safetensors set, or NULL. */
const lmx_st_tensor *test_ref(const lmx_st_set *refs, int k, const char *what);
/* Index of the largest of v[0..n) (the first on ties). */
int test_argmax(const float *v, int n);
float test_max_abs(const float *v, size_t n);
/* n token ids spread over a vocabulary of V, the same in every run. */
void test_fixed_ids(int32_t *ids, int n, int V);
/* lmx_context_eval_argmax of ids on c: the id it picks, -1 after a failed
 * (and counted) check. */
int32_t test_eval_argmax(lmx_context *c, const int32_t *ids, int n);
/* A context of `rows`-token prefill chunks given prompt ids[0, L) in
 * calls of `chunk` tokens (0: all at once), every position's logits
 * (V = vocabulary floats each) into logits: the context, or NULL after a
 * failed (and counted) check. */
lmx_context *test_eval_prompt(lmx_model *m, const int32_t *ids, int L, int chunk, int rows, float *logits);
/* A fixture's greedy continuation (g: reference ids, margin: their top-1
 * margins) of prompt ids[0, L) from context c, which holds the prompt, and
 * last (V floats), its last position's logits, overwritten step by step:
 * each step's top-1 must be the reference's where the margin exceeds
 * min_margin(last, V). A context of `rows`-token chunks beside it, given
 * only lmx_context_eval_argmax's ids, must pick the same ids. */
void test_greedy(lmx_model *m, lmx_context *c, int rows, const int32_t *ids, int L, float *last, int V,
                 const lmx_st_tensor *g, const float *margin, float (*min_margin)(const float *, int),
                 const char *tag);
/* Sampling from the best scores (lmx_context_eval_top and
 * lmx_sampler_sample_top, as streams with top-k do) against sampling the
 * whole logits (lmx_context_eval): contexts of `rows`-token chunks given
 * prompt ids[0, L), then `steps` tokens drawn by the same seed with Qwen3's
 * and Gemma3's default settings, and with a repetition penalty (top-k, and
 * greedy), must be the same tokens, and the logits
 * eval_top leaves for an undecided draw (lmx_context_last_logits) the
 * same bits as eval's. */
void test_sampled(lmx_model *m, int rows, const int32_t *ids, int L, int steps, const char *tag);
/* Draws where the logits are (lmx_context_eval_draw, as streams with only
 * a temperature and min-p do on a GPU) against the host sampler on the
 * whole logits: the same prompt, then `steps` tokens drawn by the same
 * seed, must be the same tokens. Returns the draws made: 0 where the
 * model's backend cannot draw. */
int test_drawn(lmx_model *m, int rows, const int32_t *ids, int L, int steps, const char *tag);
/* Logit tolerance with the float16 KV cache (lmx_load_options.kv_f16),
 * relative to max(1, max |logit|) of a row. float16 rounds each key and
 * value by up to 2^-11 relative. Measured worst against transformers over
 * every fixture, prompt and chunking (test_model_fixtures): 7.2e-4
 * (qwen3-small; qwen3-tiny 5.6e-4, gemma3-small and gemma3-tiny 4.4e-4),
 * within 5% across the scalar, avx2, avx512 and amx paths, against 7e-5
 * with float32; 2e-3 leaves 2.8x that. */
#define TEST_KV_F16_TOL 2e-3f
/* Logit tolerance with prompts' x rounded to bf16 (lmx_load_options.
 * prefill_bf16), relative as above. bf16 keeps 8 bits of each activation,
 * rounding it by up to 2^-9 relative, in every product with bf16 weights of
 * a prompt (decode, and rows of 4 or fewer, stay float32). Measured worst
 * against transformers over every fixture, prompt and chunking
 * (test_model_fixtures, avx512 path with AVX512_BF16): 1.29e-2 (qwen3-tiny;
 * gemma3-tiny 6.0e-3; the -small fixtures have float32 weights and keep
 * float32 x: 1.9e-6), against 4.7e-6 without; 3e-2 leaves 2.3x that. */
#define TEST_PREFILL_BF16_TOL 3e-2f
/* 1 if path exists. */
int test_have_file(const char *path);
/* Writes into dir (created) a Qwen3 checkpoint of more than `at_least`
 * bytes of bf16 weights, with hidden size 8192 and intermediate size
 * 28672 (a 70B model's shapes) and as many layers as that takes, whose
 * tensors are one hole of a sparse file: a model far larger than the disk
 * it takes. Returns the weights' bytes, 0 on failure. */
size_t test_write_sparse_model(const char *dir, size_t at_least);
/* Its positions (max_position_embeddings): a KV cache for all of them
 * takes 275 GB a layer in bf16, more than any device has. */
#define TEST_SPARSE_POSITIONS (1 << 26)

#endif
