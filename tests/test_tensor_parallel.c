/* Tensor parallelism checked on the CPU (shard.h, docs/multi-gpu.md): the
 * shard plans for real shapes, then every fixture split over 2 (and 4
 * where the heads allow) CPU ranks, whose all-reduces sum the ranks'
 * partial results: logits at every position must match the unsplit model
 * within float32 tolerance (sums taken in another order) and transformers'
 * references as the engine test does; bad splits fail with a clear error. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "lmx.h"
#include "safetensors.h"
#include "shard.h"
#include "testutil.h"

static void check_plans(void)
{
    lmx_config c = {0};
    c.n_heads = 32, c.n_kv_heads = 8, c.intermediate_size = 12288, c.vocab_size = 151936; /* Qwen3-8B */
    lmx_error err = {0};
    lmx_shard_plan p;
    for (int R = 1; R <= 8; R *= 2)
        for (int r = 0; r < R; r++) {
            CHECK(lmx_shard_plan_make(&c, r, R, &p, &err) == LMX_OK, "qwen3-8b over %d: %s", R, err.message);
            CHECK(p.q_heads == 32 / R && p.q_head0 == r * 32 / R, "q heads of rank %d/%d", r, R);
            CHECK(p.kv_heads == 8 / R && p.kv_head0 == r * 8 / R, "kv heads of rank %d/%d", r, R);
            CHECK(p.inter == 12288 / R && p.inter0 == r * 12288 / R, "mlp of rank %d/%d", r, R);
            int chunk = (151936 + R - 1) / R;
            CHECK(p.vocab0 == r * chunk && p.vocab == (r + 1 < R ? chunk : 151936 - r * chunk), "vocab of %d/%d", r,
                  R);
        }
    /* fewer KV heads than ranks: each rank keeps the one its queries use */
    c.n_heads = 16, c.n_kv_heads = 2;
    for (int r = 0; r < 8; r++) {
        CHECK(lmx_shard_plan_make(&c, r, 8, &p, &err) == LMX_OK, "16/2 heads over 8: %s", err.message);
        CHECK(p.q_heads == 2 && p.kv_heads == 1 && p.kv_head0 == r / 4, "rank %d: kv head %d", r, p.kv_head0);
    }
    CHECK(lmx_shard_plan_make(&c, 0, 3, &p, &err) == LMX_ERR_UNSUPPORTED && strstr(err.message, "attention heads"),
          "16 heads over 3: %s", err.message);
    c.n_heads = 12, c.n_kv_heads = 4;
    CHECK(lmx_shard_plan_make(&c, 0, 6, &p, &err) == LMX_ERR_UNSUPPORTED && strstr(err.message, "key/value"),
          "4 kv heads over 6: %s", err.message);
    c.n_heads = 8, c.n_kv_heads = 8, c.intermediate_size = 100;
    CHECK(lmx_shard_plan_make(&c, 0, 8, &p, &err) == LMX_ERR_UNSUPPORTED && strstr(err.message, "intermediate"),
          "intermediate 100 over 8: %s", err.message);
}

/* Logits of every position of ids, in one call (chunk 0) or `chunk` at a time. */
static float *logits_of(lmx_model *m, const int32_t *ids, int L, int chunk)
{
    lmx_error err = {0};
    int V = lmx_model_vocab_size(m);
    float *out = malloc((size_t)L * V * sizeof(float));
    lmx_context *c = lmx_context_new_chunked(m, 128, 4, &err); /* 4-row chunks: sliding rings wrap */
    CHECK(c && out, "context: %s", err.message);
    for (int i = 0; c && out && i < L; i += chunk ? chunk : L) {
        int k = chunk && L - i > chunk ? chunk : L - i;
        CHECK(lmx_context_eval(c, ids + i, k, out + (size_t)i * V, 1, &err) == LMX_OK, "eval: %s", err.message);
    }
    lmx_context_free(c);
    return out;
}

static void check_fixture(const char *name, int n_ranks)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/%s", LMX_TEST_DATA, name);
    snprintf(path, sizeof path, "%s/refs.safetensors", dir);
    lmx_error err = {0};
    lmx_st_set *refs = NULL;
    lmx_load_options o = lmx_load_defaults();
    o.device = LMX_DEVICE_CPU;
    o.n_threads = 1;
    lmx_model *whole = lmx_load(dir, &o, &err);
    o.n_gpus = n_ranks;
    lmx_model *split = lmx_load(dir, &o, &err);
    CHECK(whole && split, "%s over %d ranks: %s", name, n_ranks, err.message);
    CHECK(lmx_st_open_file(path, &refs, &err) == LMX_OK, "refs: %s", err.message);
    if (!whole || !split || !refs || !test_ref(refs, 0, "ids"))
        goto done;
    /* references: full rows (-small) or the top 8 of each row (-tiny) */
    const lmx_st_tensor *ids_t = test_ref(refs, 0, "ids"), *want_t = test_ref(refs, 0, "logits");
    const lmx_st_tensor *top_ids = test_ref(refs, 0, "top_ids"), *top_vals = test_ref(refs, 0, "top_vals");
    int L = (int)ids_t->shape[0], V = lmx_model_vocab_size(whole);
    float *a = logits_of(whole, ids_t->data, L, 0);
    for (int chunk = 0; chunk <= 1; chunk++) { /* whole prompt, then token by token */
        float *b = logits_of(split, ids_t->data, L, chunk);
        float worst = 0, worst_ref = 0;
        for (int i = 0; i < L; i++) {
            const float *ra = a + (size_t)i * V, *rb = b + (size_t)i * V;
            float d = 0;
            for (int j = 0; j < V; j++)
                d = fmaxf(d, fabsf(ra[j] - rb[j]));
            worst = fmaxf(worst, d / fmaxf(1.0f, test_max_abs(ra, (size_t)V)));
            CHECK(test_argmax(ra, V) == test_argmax(rb, V), "%s x%d pos %d: top-1 differs", name, n_ranks, i);
            if (want_t && want_t->ndim == 2 && want_t->shape[1] == V) { /* full reference rows */
                const float *rw = (const float *)want_t->data + (size_t)i * V;
                float dr = 0;
                for (int j = 0; j < V; j++)
                    dr = fmaxf(dr, fabsf(rw[j] - rb[j]));
                worst_ref = fmaxf(worst_ref, dr / fmaxf(1.0f, test_max_abs(rw, (size_t)V)));
            } else if (top_ids && top_vals) {
                const int32_t *ti = (const int32_t *)top_ids->data + i * 8;
                const float *tv = (const float *)top_vals->data + i * 8;
                float dr = 0;
                for (int j = 0; j < 8; j++)
                    dr = fmaxf(dr, fabsf(rb[ti[j]] - tv[j]));
                worst_ref = fmaxf(worst_ref, dr / fmaxf(1.0f, test_max_abs(tv, 8)));
            }
        }
        if (chunk) { /* the ranks' argmaxes merged: the split model's own top-1 */
            lmx_context *c = lmx_context_new(split, L, &err);
            for (int i = 0; i < L; i++) {
                int32_t got = test_eval_argmax(c, (const int32_t *)ids_t->data + i, 1);
                CHECK(got == test_argmax(b + (size_t)i * V, V), "%s x%d pos %d: argmax %d, logits' %d", name, n_ranks,
                      i, (int)got, test_argmax(b + (size_t)i * V, V));
            }
            lmx_context_free(c);
            char tag[64]; /* the ranks' best scores merged */
            snprintf(tag, sizeof tag, "%s x%d", name, n_ranks);
            test_sampled(split, 64, ids_t->data, L, 4, tag);
        }
        CHECK(worst <= 1e-4f, "%s x%d %s: relative difference to the unsplit model %g", name, n_ranks,
              chunk ? "token by token" : "whole", worst);
        CHECK(worst_ref <= 1e-3f, "%s x%d: relative difference to transformers %g", name, n_ranks, worst_ref);
        printf("%s over %d ranks, %s: vs unsplit %.2e, vs transformers %.2e\n", name, n_ranks,
               chunk ? "token by token" : "whole prompt", worst, worst_ref);
        free(b);
    }
    free(a);
done:
    lmx_st_close(refs);
    lmx_close(whole);
    lmx_close(split);
}

static void check_errors(void)
{
    lmx_error err = {0};
    lmx_load_options o = lmx_load_defaults();
    o.device = LMX_DEVICE_CPU;
    o.n_gpus = 4; /* 2 heads */
    lmx_model *m = lmx_load(LMX_TEST_DATA "/qwen3-tiny", &o, &err);
    CHECK(!m && err.code == LMX_ERR_UNSUPPORTED && strstr(err.message, "2 attention heads do not split over 4"),
          "4 ranks of 2 heads: %s", err.message);
    lmx_close(m);
    o.n_gpus = 9;
    m = lmx_load(LMX_TEST_DATA "/qwen3-tiny", &o, &err);
    CHECK(!m && err.code == LMX_ERR_ARG && strstr(err.message, "n_gpus"), "9 ranks: %s", err.message);
    lmx_close(m);
    char *out = NULL;
    int rc = test_run(LMX_BIN " run " LMX_TEST_DATA "/qwen3-tiny --device cpu --gpus 3 -p hi -n 1 2>&1", &out);
    CHECK(rc == 1 && out && strstr(out, "do not split over 3"), "lmx run --gpus 3: rc %d: %s", rc, out);
    free(out);
}

int main(void)
{
    check_plans();
    const char *names[] = {"qwen3-tiny", "qwen3-small", "gemma3-tiny", "gemma3-small"};
    for (int i = 0; i < 4; i++)
        check_fixture(names[i], 2);
    check_fixture("qwen3-small", 4); /* 4 heads, 2 KV heads: KV replicated */
    check_errors();
    return test_finish();
}
