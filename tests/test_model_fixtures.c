/* Logits of every fixture checkpoint against transformers' references
 * (tests/data/<name>/refs.safetensors): one-shot prefill, token-at-a-time
 * decode and prefill in chunks of 5, plus the 20 greedy tokens. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "lmx.h"
#include "safetensors.h"
#include "testutil.h"

typedef struct refs {
    lmx_st_set *st;
} refs;

static const lmx_st_tensor *ref(const refs *r, int k, const char *what)
{
    char name[64];
    snprintf(name, sizeof name, "p%d.%s", k, what);
    return lmx_st_find(r->st, name);
}

static float max_abs(const float *v, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabsf(v[i]) > m ? fabsf(v[i]) : m;
    return m;
}

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

/* Compares one row of our logits with a full reference row. */
static void check_full_row(const char *tag, int pos, const float *ours, const float *want, int V)
{
    float tol = 1e-3f * fmaxf(1.0f, max_abs(want, (size_t)V)), worst = 0;
    for (int i = 0; i < V; i++)
        worst = fmaxf(worst, fabsf(ours[i] - want[i]));
    CHECK(worst <= tol, "%s pos %d: max |diff| %g > tol %g", tag, pos, worst, tol);
    int a = argmax(want, V);
    float second = -INFINITY;
    for (int i = 0; i < V; i++)
        if (i != a && want[i] > second)
            second = want[i];
    if (want[a] - second > 1e-3f)
        CHECK(argmax(ours, V) == a, "%s pos %d: top-1 %d, want %d", tag, pos, argmax(ours, V), a);
}

/* Compares with the 8 reference top logits of a row (-tiny fixtures). */
static void check_top_row(const char *tag, int pos, const float *ours, const int32_t *ids,
                          const float *vals, int V)
{
    float tol = 1e-3f * fmaxf(1.0f, max_abs(vals, 8)), worst = 0;
    for (int j = 0; j < 8; j++)
        worst = fmaxf(worst, fabsf(ours[ids[j]] - vals[j]));
    CHECK(worst <= tol, "%s pos %d: max |diff| over top-8 %g > tol %g", tag, pos, worst, tol);
    if (vals[0] - vals[1] > 1e-3f)
        CHECK(argmax(ours, V) == ids[0], "%s pos %d: top-1 %d, want %d", tag, pos, argmax(ours, V), (int)ids[0]);
}

/* Runs the prompt in calls of `chunk` tokens (0 = all at once), with the
 * context's own prefill chunk of `rows` tokens, and checks the logits at
 * every position. Small `rows` make sliding-window caches wrap around. */
static void check_prompt(lmx_model *m, const refs *r, int k, int chunk, int rows, const char *name)
{
    const lmx_st_tensor *ids_t = ref(r, k, "ids");
    int L = (int)ids_t->shape[0], V = lmx_model_vocab_size(m);
    const int32_t *ids = ids_t->data;
    float *logits = malloc((size_t)L * V * sizeof(float));
    lmx_error err = {0};
    lmx_context *c = lmx_context_new_chunked(m, 128, rows, &err);
    CHECK(c != NULL, "context: %s", err.message);
    if (!c || !logits) {
        free(logits);
        return;
    }
    int step = chunk ? chunk : L;
    for (int i = 0; i < L; i += step) {
        int n = L - i < step ? L - i : step;
        lmx_status st = lmx_context_eval(c, ids + i, n, logits + (size_t)i * V, 1, &err);
        CHECK(st == LMX_OK, "eval: %s", err.message);
    }
    char tag[96];
    snprintf(tag, sizeof tag, "%s p%d chunk %d rows %d", name, k, chunk, rows);
    const lmx_st_tensor *full = ref(r, k, "logits");
    if (full) {
        for (int p = 0; p < L; p++)
            check_full_row(tag, p, logits + (size_t)p * V, (const float *)full->data + (size_t)p * V, V);
    } else {
        const int32_t *top_ids = ref(r, k, "top_ids")->data;
        const float *top_vals = ref(r, k, "top_vals")->data;
        for (int p = 0; p < L; p++)
            check_top_row(tag, p, logits + (size_t)p * V, top_ids + p * 8, top_vals + p * 8, V);
        check_full_row(tag, L - 1, logits + (size_t)(L - 1) * V, ref(r, k, "logits_last")->data, V);
    }
    /* greedy continuation through the cache, after a full-prompt run */
    if (chunk == 0) {
        const lmx_st_tensor *g = ref(r, k, "greedy");
        const float *margin = ref(r, k, "margin")->data;
        float *last = logits + (size_t)(L - 1) * V;
        for (int t = 0; t < (int)g->shape[0]; t++) {
            int32_t next = argmax(last, V), want = ((const int32_t *)g->data)[t];
            if (margin[t] > 1e-3f)
                CHECK(next == want, "%s greedy step %d: %d, want %d", tag, t, (int)next, (int)want);
            if (next != want)
                break; /* a tie broke differently: later steps diverge legitimately */
            CHECK(lmx_context_eval(c, &next, 1, last, 0, &err) == LMX_OK, "greedy eval: %s", err.message);
        }
    }
    lmx_context_free(c);
    free(logits);
}

static void check_model(const char *name)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/%s", LMX_TEST_DATA, name);
    snprintf(path, sizeof path, "%s/refs.safetensors", dir);
    lmx_error err = {0};
    lmx_model *m = lmx_load(dir, NULL, &err);
    CHECK(m != NULL, "load %s: %s", name, err.message);
    refs r = {0};
    CHECK(lmx_st_open_file(path, &r.st, &err) == LMX_OK, "refs %s: %s", name, err.message);
    if (m && r.st) {
        int prompts = 0;
        for (int k = 0; ref(&r, k, "ids"); k++, prompts++) {
            check_prompt(m, &r, k, 0, 64, name);
            check_prompt(m, &r, k, 1, 64, name);
            check_prompt(m, &r, k, 5, 64, name);
            check_prompt(m, &r, k, 0, 3, name);
            check_prompt(m, &r, k, 5, 2, name);
        }
        CHECK(prompts >= 2, "%s: only %d prompts in refs", name, prompts);
    }
    lmx_st_close(r.st);
    lmx_close(m);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            check_model(argv[i]);
    } else {
        check_model("qwen3-small");
        check_model("gemma3-small");
        check_model("qwen3-tiny");
        check_model("gemma3-tiny");
    }
    return test_finish();
}
