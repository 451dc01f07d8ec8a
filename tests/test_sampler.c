/* sampler: transformers' logits-processor rules, checked on hand-made
 * vectors (kept sets worked out by hand; the ones marked "transformers" were
 * also run through transformers 5.17.0's processors, torch 2.11 on the CPU),
 * against a literal re-implementation of transformers' algorithms on large
 * random vectors, and by a chi-square test of the draws. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "argmax.h"
#include "sampler.h"
#include "topk.h"
#include "testutil.h"

static lmx_sampler_params params(float t, int k, float p, float minp, float pen) {
    return (lmx_sampler_params){t, k, p, minp, pen, 1234};
}

static lmx_sampler *make(lmx_sampler_params p, int vocab) {
    lmx_sampler *s = NULL;
    lmx_error err = {0};
    CHECK(lmx_sampler_new(&p, vocab, &s, &err) == LMX_OK && s, "sampler_new: %s", err.message);
    return s;
}

/* The kept set of a small vector as a bit mask (bit i = token i kept). */
static unsigned kept_mask(lmx_sampler_params p, const float *logits, int n, const int32_t *hist,
                          size_t nh, float *probs_out) {
    lmx_sampler *s = make(p, n);
    if (!s)
        return 0;
    float x[64], probs[64];
    memcpy(x, logits, (size_t)n * sizeof *x);
    lmx_sampler_probs(s, x, hist, nh, probs);
    unsigned mask = 0;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (probs[i] > 0)
            mask |= 1u << i;
        sum += probs[i];
        /* the processed logits say the same thing */
        CHECK((probs[i] > 0) == (x[i] > -INFINITY) || p.temperature == 0,
              "token %d: prob %g but logit %g", i, probs[i], x[i]);
    }
    CHECK(fabs(sum - 1) < 1e-6, "probabilities sum to %g", sum);
    if (probs_out)
        memcpy(probs_out, probs, (size_t)n * sizeof *probs);
    lmx_sampler_free(s);
    return mask;
}

#define MASK(...) mask_of((const int[]){__VA_ARGS__, -1})
static unsigned mask_of(const int *ids) {
    unsigned m = 0;
    while (*ids >= 0)
        m |= 1u << *ids++;
    return m;
}

static void expect_kept(lmx_sampler_params p, const float *logits, int n, unsigned want,
                        const char *what) {
    unsigned got = kept_mask(p, logits, n, NULL, 0, NULL);
    CHECK(got == want, "%s: kept 0x%x, want 0x%x", what, got, want);
}

/* ---- parameters ------------------------------------------------------------- */

static void expect_invalid(lmx_sampler_params p, int vocab, const char *name) {
    lmx_sampler *s = (lmx_sampler *)&p; /* must be reset to NULL */
    lmx_error err = {0};
    lmx_status st = lmx_sampler_new(&p, vocab, &s, &err);
    CHECK(st == LMX_ERR_ARG && s == NULL && strstr(err.message, name),
          "%s: status %d, message \"%s\"", name, (int)st, err.message);
}

static void validation(void) {
    lmx_sampler_params ok = params(0.7f, 40, 0.9f, 0.05f, 1.1f);
    lmx_sampler_params p;
    p = ok, p.temperature = NAN, expect_invalid(p, 10, "temperature");
    p = ok, p.temperature = -0.5f, expect_invalid(p, 10, "temperature");
    p = ok, p.temperature = INFINITY, expect_invalid(p, 10, "temperature");
    p = ok, p.top_k = -1, expect_invalid(p, 10, "top_k");
    p = ok, p.top_p = 0, expect_invalid(p, 10, "top_p");
    p = ok, p.top_p = 1.01f, expect_invalid(p, 10, "top_p");
    p = ok, p.top_p = NAN, expect_invalid(p, 10, "top_p");
    p = ok, p.min_p = -0.01f, expect_invalid(p, 10, "min_p");
    p = ok, p.min_p = 1.5f, expect_invalid(p, 10, "min_p");
    p = ok, p.min_p = NAN, expect_invalid(p, 10, "min_p");
    p = ok, p.repetition_penalty = 0, expect_invalid(p, 10, "repetition_penalty");
    p = ok, p.repetition_penalty = -1, expect_invalid(p, 10, "repetition_penalty");
    p = ok, p.repetition_penalty = NAN, expect_invalid(p, 10, "repetition_penalty");
    expect_invalid(ok, 0, "vocab_size");
    lmx_error err = {0};
    CHECK(lmx_sampler_new(NULL, 10, &(lmx_sampler *){NULL}, &err) == LMX_ERR_ARG, "NULL params");
    CHECK(lmx_sampler_new(&ok, 10, NULL, &err) == LMX_ERR_ARG, "NULL out");
    /* the edges of every range are valid */
    lmx_sampler *s = make(params(0, 0, 1, 0, 1), 10);
    lmx_sampler_free(s);
    s = make(params(1e-3f, 1000, 1e-6f, 1, 1e-3f), 10);
    lmx_sampler_free(s);
    lmx_sampler_free(NULL);
}

/* ---- each processor ------------------------------------------------------------ */

static void greedy(void) {
    const float x[] = {0.5f, 3, -1, 3, 2.9f};
    lmx_sampler *s = make(params(0, 2, 0.5f, 0.5f, 1), 5);
    float y[5];
    memcpy(y, x, sizeof x);
    CHECK(lmx_sampler_sample(s, y, NULL, 0) == 1, "greedy: argmax, lowest id of a tie");
    lmx_sampler_free(s);
    /* transformers' greedy search still applies the repetition penalty */
    s = make(params(0, 0, 1, 0, 1.5f), 5);
    int32_t hist[] = {1, 3, 1};
    memcpy(y, x, sizeof x);
    CHECK(lmx_sampler_sample(s, y, hist, 3) == 4, "greedy after penalty: 2.9 beats 3/1.5");
    float probs[5];
    memcpy(y, x, sizeof x);
    lmx_sampler_probs(s, y, hist, 3, probs);
    CHECK(probs[4] == 1 && probs[0] == 0 && probs[1] == 0 && probs[3] == 0, "greedy probs");
    lmx_sampler_free(s);
    /* NaN never wins */
    s = make(params(0, 0, 1, 0, 1), 3);
    float z[] = {NAN, 1, 2};
    CHECK(lmx_sampler_sample(s, z, NULL, 0) == 2, "greedy skips NaN");
    lmx_sampler_free(s);
    /* the rule itself (src/argmax.h), as torch.argmax: the backends'
     * read_argmax and the merges of their partial results use it too */
    const float all_nan[] = {NAN, NAN, NAN}, no_finite[] = {NAN, -INFINITY, NAN}, ninf[] = {-INFINITY, -INFINITY};
    CHECK(lmx_argmax(all_nan, 3) == 0, "all NaN: index 0");
    CHECK(lmx_argmax(no_finite, 3) == 1, "-inf beats NaN");
    CHECK(lmx_argmax(ninf, 2) == 0, "all -inf: the first");
    CHECK(lmx_argmax_beats(NAN, 2, NAN, 5) && !lmx_argmax_beats(NAN, 5, NAN, 2), "NaN against NaN: lower index");
    CHECK(lmx_argmax_beats(1, 3, 1, 7) && !lmx_argmax_beats(1, 7, 1, 3), "ties: lower index, in either order");
    CHECK(lmx_argmax_beats(-INFINITY, 9, NAN, 0) && !lmx_argmax_beats(NAN, 0, -1, 9), "NaN loses to any number");
    /* lmx_argmax's two passes against the rule applied element by element,
     * on vectors of few distinct values (ties), NaN, infinities and zeros
     * of both signs, of lengths around its 8-wide steps */
    const float pool[] = {NAN, -INFINITY, INFINITY, -0.0f, 0.0f, 1, 2, -3};
    unsigned seed = 7;
    for (int trial = 0; trial < 2000; trial++) {
        float v[40];
        int n = 1 + trial % 40;
        for (int i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            v[i] = pool[(seed >> 16) % (trial % 3 ? 8 : 3)]; /* a third of the vectors: NaN and infinities only */
        }
        int32_t want = 0;
        for (int32_t i = 1; i < n; i++)
            if (lmx_argmax_beats(v[i], i, v[want], want))
                want = i;
        CHECK(lmx_argmax(v, n) == want, "argmax trial %d (n %d): %d, want %d", trial, n, lmx_argmax(v, n), want);
    }
}

static void repetition_penalty(void) {
    /* transformers: penalty 2, input_ids [0,1,1,3] on [2,-2,0.5,0,1] gives
     * [1,-4,0.5,0,1]: each distinct token once, 0 stays 0. */
    float x[] = {2, -2, 0.5f, 0, 1};
    int32_t hist[] = {0, 1, 1, 3, -7, 99}; /* out-of-vocabulary ids are ignored */
    lmx_sampler *s = make(params(1, 0, 1, 0, 2), 5);
    float probs[5];
    lmx_sampler_probs(s, x, hist, 6, probs);
    CHECK(x[0] == 1 && x[1] == -4 && x[2] == 0.5f && x[3] == 0 && x[4] == 1,
          "penalized logits %g %g %g %g %g", x[0], x[1], x[2], x[3], x[4]);
    /* probabilities follow the penalized logits */
    double z = exp(1) + exp(-4) + exp(0.5) + exp(0) + exp(1);
    CHECK(fabs(probs[1] - exp(-4) / z) < 1e-7 && fabs(probs[0] - exp(1) / z) < 1e-7,
          "penalized probs");
    /* a second call starts from a clean slate (marks were cleared) */
    float y[] = {3, -3, 1, 1, 1};
    int32_t h2[] = {1};
    lmx_sampler_probs(s, y, h2, 1, probs);
    CHECK(y[0] == 3 && y[1] == -6, "second call: %g %g", y[0], y[1]);
    lmx_sampler_free(s);
    s = make(params(1, 0, 1, 0, 1.5f), 2);
    float w[] = {2, -2};
    int32_t h3[] = {0, 1};
    lmx_sampler_probs(s, w, h3, 2, probs);
    CHECK(w[0] == 2.0f / 1.5f && w[1] == -2.0f * 1.5f, "penalty 1.5: %.9g %.9g", w[0], w[1]);
    lmx_sampler_free(s);
}

static void top_k(void) {
    const float x[] = {1, 3, 2, 3, 0, 2.5f};
    expect_kept(params(1, 2, 1, 0, 1), x, 6, MASK(1, 3), "top_k 2");
    expect_kept(params(1, 3, 1, 0, 1), x, 6, MASK(1, 3, 5), "top_k 3");
    expect_kept(params(1, 6, 1, 0, 1), x, 6, 0x3f, "top_k = vocab");
    expect_kept(params(1, 100, 1, 0, 1), x, 6, 0x3f, "top_k > vocab");
    /* transformers: ties with the k-th value all stay */
    const float t[] = {3, 1, 3, 3, 0};
    expect_kept(params(1, 2, 1, 0, 1), t, 5, MASK(0, 2, 3), "top_k ties");
    expect_kept(params(1, 1, 1, 0, 1), t, 5, MASK(0, 2, 3), "top_k 1 ties");
    /* renormalized over the kept set */
    float probs[6];
    kept_mask(params(1, 3, 1, 0, 1), x, 6, NULL, 0, probs);
    double z = 2 * exp(3) + exp(2.5);
    CHECK(fabs(probs[1] - exp(3) / z) < 1e-7 && fabs(probs[5] - exp(2.5) / z) < 1e-7,
          "top_k probs");
}

static void top_p(void) {
    /* probabilities 0.5, 0.25, 0.15, 0.1. transformers removes a token when
     * the probability at or below it (ascending cumulative sum) is <= 1 - p:
     * the smallest set whose probability reaches p stays. */
    const float x[] = {logf(0.5f), logf(0.25f), logf(0.15f), logf(0.1f)};
    expect_kept(params(1, 0, 0.7499f, 0, 1), x, 4, MASK(0, 1), "top_p 0.7499 (transformers)");
    expect_kept(params(1, 0, 0.7501f, 0, 1), x, 4, MASK(0, 1, 2), "top_p 0.7501 (transformers)");
    expect_kept(params(1, 0, 0.9f, 0, 1), x, 4, MASK(0, 1, 2), "top_p 0.9 (transformers)");
    expect_kept(params(1, 0, 0.5f, 0, 1), x, 4, MASK(0), "top_p 0.5 (transformers)");
    expect_kept(params(1, 0, 0.4f, 0, 1), x, 4, MASK(0), "top_p 0.4 (transformers)");
    expect_kept(params(1, 0, 0.95f, 0, 1), x, 4, MASK(0, 1, 2, 3), "top_p 0.95");
    expect_kept(params(1, 0, 1e-6f, 0, 1), x, 4, MASK(0), "tiny top_p keeps the top token");
    /* An exact boundary (equal logits make exact probabilities 1/4): a set
     * reaching p exactly is enough. Among equal logits the higher ids stay,
     * as transformers' ascending stable sort trimmed from the bottom does. */
    const float eq[] = {0, 0, 0, 0};
    expect_kept(params(1, 0, 0.5f, 0, 1), eq, 4, MASK(2, 3), "top_p exact 0.5");
    expect_kept(params(1, 0, 0.75f, 0, 1), eq, 4, MASK(1, 2, 3), "top_p exact 0.75");
    expect_kept(params(1, 0, 0.25f, 0, 1), eq, 4, MASK(3), "top_p exact 0.25");
    const float t[] = {1, 1, 1, 1, 0};
    expect_kept(params(1, 0, 0.3f, 0, 1), t, 5, MASK(2, 3), "top_p ties 0.3 (transformers)");
    expect_kept(params(1, 0, 0.5f, 0, 1), t, 5, MASK(1, 2, 3), "top_p ties 0.5 (transformers)");
    /* -inf tokens never count */
    const float inf[] = {-INFINITY, 0, -INFINITY, 0};
    expect_kept(params(1, 0, 0.5f, 0, 1), inf, 4, MASK(3), "top_p with -inf");
}

static void min_p(void) {
    const float x[] = {logf(0.5f), logf(0.25f), logf(0.15f), logf(0.1f)};
    /* thresholds min_p * 0.5 */
    expect_kept(params(1, 0, 1, 0.4f, 1), x, 4, MASK(0, 1), "min_p 0.4");
    expect_kept(params(1, 0, 1, 0.25f, 1), x, 4, MASK(0, 1, 2), "min_p 0.25");
    expect_kept(params(1, 0, 1, 0.1f, 1), x, 4, MASK(0, 1, 2, 3), "min_p 0.1");
    expect_kept(params(1, 0, 1, 1, 1), x, 4, MASK(0), "min_p 1");
    const float t[] = {2, 1, 2};
    expect_kept(params(1, 0, 1, 1, 1), t, 3, MASK(0, 2), "min_p 1 keeps tied tops");
    expect_kept(params(1, 2, 1, 1, 1), t, 3, MASK(0, 2), "min_p 1 after top_k keeps tied tops");
    expect_kept(params(1, 0, 0.99f, 1, 1), t, 3, MASK(0, 2), "min_p 1 after top_p keeps tied tops");
    /* after the temperature: ratios to the top 1,.5,.3,.2 at T=1 become
     * 1,.25,.09,.04 at T=0.5 */
    expect_kept(params(1, 0, 1, 0.15f, 1), x, 4, MASK(0, 1, 2, 3), "min_p 0.15 at T=1");
    expect_kept(params(0.5f, 0, 1, 0.15f, 1), x, 4, MASK(0, 1), "min_p 0.15 at T=0.5");
}

/* Temperature, top-k, top-p, min-p in transformers' order, worked by hand.
 * Scores 4,3,2,1,0,-1. T=0.5 makes them 8,6,4,...; top_k 4 keeps ids 0-3
 * with probabilities .865,.117,.016,.002; top_p .95 stops after two
 * (.865+.117 >= .95); min_p .1 keeps id 1 (ratio e^-2 = .135). At T=1,
 * top_k 4 gives .644,.237,.087,.032; top_p .95 keeps three (.644+.237 < .95);
 * min_p .1 keeps id 2 (ratio e^-2 = .135) but min_p .2 drops it. At T=2,
 * .455,.276,.167,.102: top_p .95 keeps all four (.898 < .95). */
static void combined(void) {
    const float x[] = {4, 3, 2, 1, 0, -1};
    expect_kept(params(0.5f, 4, 0.95f, 0.1f, 1), x, 6, MASK(0, 1), "combined T=0.5");
    expect_kept(params(1, 4, 0.95f, 0.1f, 1), x, 6, MASK(0, 1, 2), "combined T=1");
    expect_kept(params(1, 4, 0.95f, 0.2f, 1), x, 6, MASK(0, 1), "combined T=1 min_p .2");
    expect_kept(params(2, 4, 0.95f, 0, 1), x, 6, MASK(0, 1, 2, 3), "combined T=2");
    expect_kept(params(2, 3, 0.95f, 0, 1), x, 6, MASK(0, 1, 2), "combined T=2 top_k 3");
    /* the penalty comes first: 4/4 = 1 drops token 0 below tokens 1-2 */
    int32_t hist[] = {0};
    unsigned m = kept_mask(params(1, 2, 1, 0, 4), x, 6, hist, 1, NULL);
    CHECK(m == MASK(1, 2), "penalty before top_k: 0x%x", m);
    float probs[6];
    kept_mask(params(0.5f, 4, 0.95f, 0.1f, 1), x, 6, NULL, 0, probs);
    double z = 1 + exp(-2);
    CHECK(fabs(probs[0] - 1 / z) < 1e-6 && fabs(probs[1] - exp(-2) / z) < 1e-6,
          "combined probs %g %g", probs[0], probs[1]);
}

/* The temperature divides (as transformers does), and the probabilities
 * match double-precision softmax across the exponent range. */
static void temperature_and_precision(void) {
    enum { N = 217 };
    float x[N], y[N], probs[N];
    for (int i = 0; i < N; i++)
        x[i] = -0.37f * (float)i + (i % 7) * 0.01f; /* 0 down to about -80 */
    lmx_sampler *s = make(params(0.7f, 0, 1, 0, 1), N);
    memcpy(y, x, sizeof y);
    lmx_sampler_probs(s, y, NULL, 0, probs);
    int exact = 1;
    for (int i = 0; i < N; i++)
        exact &= y[i] == x[i] / 0.7f;
    CHECK(exact, "logits / temperature, rounded as a float division");
    double z = 0, worst = 0;
    for (int i = 0; i < N; i++)
        z += exp((double)y[i] - y[0]);
    for (int i = 0; i < N; i++) {
        double want = exp((double)y[i] - y[0]) / z;
        if (want > 1e-36) { /* well inside float's normal range */
            double rel = fabs(probs[i] - want) / want;
            worst = rel > worst ? rel : worst;
        }
    }
    CHECK(worst < 1e-6, "probabilities off by %g (relative)", worst);
    lmx_sampler_free(s);
}

static void odd_values(void) {
    float probs[4];
    unsigned m = kept_mask(params(1, 0, 1, 0, 1), (const float[]){NAN, 0, 0, NAN}, 4, NULL, 0, probs);
    CHECK(m == MASK(1, 2), "NaN logits are never drawn: 0x%x", m);
    lmx_sampler *s = make(params(1, 0, 1, 0, 1), 4);
    float inf[] = {0, INFINITY, 5, INFINITY};
    lmx_sampler_probs(s, inf, NULL, 0, probs);
    CHECK(probs[0] == 0 && probs[1] == 0.5f && probs[2] == 0 && probs[3] == 0.5f,
          "+inf logits share the mass: %g %g %g %g", probs[0], probs[1], probs[2], probs[3]);
    lmx_sampler_free(s);
    s = make(params(1, 0, 1, 0, 1), 3);
    float x[] = {-INFINITY, -INFINITY, -INFINITY};
    CHECK(lmx_sampler_sample(s, x, NULL, 0) == 0, "all -inf: token 0");
    lmx_sampler_free(s);
}

/* ---- against transformers' algorithms, written out literally --------------- */

static uint64_t rng_state = 0x5EED;
static double test_unit(void) { /* test-only LCG; quality is not at stake */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * 0x1.0p-53;
}

typedef struct {
    float v;
    int id;
} vi;

static int by_value_then_id(const void *pa, const void *pb) { /* ascending, stable */
    const vi *a = pa, *b = pb;
    if (a->v != b->v)
        return a->v < b->v ? -1 : 1;
    return a->id - b->id;
}

static int desc_float(const void *pa, const void *pb) {
    float a = *(const float *)pa, b = *(const float *)pb;
    return a < b ? 1 : a > b ? -1 : 0;
}

static void softmax(const float *x, int n, double *p) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    double z = 0;
    for (int i = 0; i < n; i++)
        z += p[i] = exp((double)x[i] - mx);
    for (int i = 0; i < n; i++)
        p[i] /= z;
}

/* Temperature -> TopK -> TopP -> MinP as logits_process.py writes them. */
static void oracle(lmx_sampler_params p, float *x, int n, double *probs) {
    vi *v = malloc((size_t)n * sizeof *v);
    float *f = malloc((size_t)n * sizeof *f);
    if (p.temperature != 1)
        for (int i = 0; i < n; i++)
            x[i] = x[i] / p.temperature;
    if (p.top_k > 0) {
        memcpy(f, x, (size_t)n * sizeof *f);
        qsort(f, (size_t)n, sizeof *f, desc_float);
        float kth = f[(p.top_k < n ? p.top_k : n) - 1];
        for (int i = 0; i < n; i++)
            if (x[i] < kth)
                x[i] = -INFINITY;
    }
    if (p.top_p < 1) {
        softmax(x, n, probs);
        for (int i = 0; i < n; i++)
            v[i] = (vi){x[i], i};
        qsort(v, (size_t)n, sizeof *v, by_value_then_id);
        double cum = 0;
        for (int r = 0; r < n - 1; r++) { /* the last (largest) always stays */
            cum += probs[v[r].id];
            if (cum <= 1 - (double)p.top_p)
                x[v[r].id] = -INFINITY;
        }
    }
    if (p.min_p > 0) {
        softmax(x, n, probs);
        double top = 0;
        for (int i = 0; i < n; i++)
            top = probs[i] > top ? probs[i] : top;
        for (int i = 0; i < n; i++)
            if (probs[i] < p.min_p * top)
                x[i] = -INFINITY;
    }
    softmax(x, n, probs);
    free(v);
    free(f);
}

static void against_oracle(int n, int levels, lmx_sampler_params p, const char *what) {
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    float *probs = malloc((size_t)n * sizeof *probs);
    double *want = malloc((size_t)n * sizeof *want);
    for (int i = 0; i < n; i++) /* levels > 0: few distinct values, many ties */
        x[i] = levels ? (float)(int)(test_unit() * levels) : (float)(8 * test_unit() * test_unit());
    memcpy(y, x, (size_t)n * sizeof *y);
    oracle(p, y, n, want);
    lmx_sampler *s = make(p, n);
    memcpy(y, x, (size_t)n * sizeof *y);
    lmx_sampler_probs(s, y, NULL, 0, probs);
    int diff_set = 0, kept = 0;
    double maxerr = 0;
    for (int i = 0; i < n; i++) {
        diff_set += (want[i] > 0) != (probs[i] > 0);
        kept += probs[i] > 0;
        double e = fabs(want[i] - probs[i]);
        maxerr = e > maxerr ? e : maxerr;
    }
    CHECK(diff_set == 0 && maxerr < 1e-6 && kept > 1,
          "%s: %d tokens differ in the kept set (%d kept), max prob error %g", what, diff_set,
          kept, maxerr);
    lmx_sampler_free(s);
    free(x);
    free(y);
    free(probs);
    free(want);
}

/* ---- draws ---------------------------------------------------------------------- */

/* Chi-square of n draws against probabilities p over the kept tokens;
 * critical values: upper 1e-4 quantiles of chi-square for df 1..10. */
static int chi_square_ok(const long *count, const double *p, int n, long draws, double *stat) {
    static const double crit[] = {0, 15.137, 18.421, 21.108, 23.513, 25.745,
                                  27.856, 29.878, 31.828, 33.720, 35.564};
    double chi = 0;
    int df = -1;
    for (int i = 0; i < n; i++) {
        if (p[i] == 0) {
            if (count[i] != 0)
                return 0;
            continue;
        }
        double e = p[i] * (double)draws;
        chi += (count[i] - e) * (count[i] - e) / e;
        df++;
    }
    *stat = chi;
    return df >= 1 && df <= 10 && chi < crit[df];
}

static void frequencies(void) {
    /* 12 tokens; penalty on 0 and 5, T=0.8, top_k 9, top_p 0.97, min_p 0.02. */
    const float x[] = {3.0f, 2.6f, 2.5f, 2.0f, 1.7f, 2.2f, 1.0f, 0.9f, 0.5f, 0.2f, -1.0f, -3.0f};
    const int n = 12;
    int32_t hist[] = {0, 5, 0};
    lmx_sampler_params p = {0.8f, 9, 0.97f, 0.02f, 1.3f, 99};
    /* expected: the oracle on the penalized logits */
    float y[12];
    double want[12];
    memcpy(y, x, sizeof y);
    y[0] /= 1.3f;
    y[5] /= 1.3f;
    oracle(p, y, n, want);
    float probs[12];
    lmx_sampler *s = make(p, n);
    memcpy(y, x, sizeof y);
    lmx_sampler_probs(s, y, hist, 3, probs);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        CHECK(fabs(probs[i] - want[i]) < 1e-6, "token %d: prob %g, oracle %g", i, probs[i], want[i]);
        kept += want[i] > 0;
    }
    CHECK(kept >= 5 && kept < 9, "the filters should bite: %d kept", kept);

    const long draws = 200000;
    long count[12] = {0};
    clock_t t0 = clock();
    for (long d = 0; d < draws; d++) {
        memcpy(y, x, sizeof y);
        int32_t t = lmx_sampler_sample(s, y, hist, 3);
        if (t >= 0 && t < n)
            count[t]++;
    }
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    double chi;
    CHECK(chi_square_ok(count, want, n, draws, &chi), "chi-square %g too large (or a removed token drawn)", chi);
    printf("chi-square %.2f over %d tokens, %ld draws in %.2f s\n", chi, kept, draws, secs);
    /* the test has power: a distribution off by 1% of mass is rejected */
    double off[12];
    memcpy(off, want, sizeof off);
    off[0] -= 0.01;
    off[1] += 0.01;
    CHECK(!chi_square_ok(count, off, n, draws, &chi), "chi-square cannot tell a 1%% shift (%g)", chi);
    lmx_sampler_free(s);
}

static void draw_sequence(uint64_t seed, int32_t *out, int len) {
    lmx_sampler_params p = {1.0f, 0, 1, 0, 1, seed};
    lmx_sampler *s = make(p, 16);
    for (int i = 0; i < len && s; i++) {
        float x[16];
        for (int j = 0; j < 16; j++)
            x[j] = (float)(j % 5) * 0.3f;
        out[i] = lmx_sampler_sample(s, x, NULL, 0);
    }
    lmx_sampler_free(s);
}

static void seeds(void) {
    int32_t a[200], b[200], c[200];
    draw_sequence(7, a, 200);
    draw_sequence(7, b, 200);
    draw_sequence(8, c, 200);
    CHECK(memcmp(a, b, sizeof a) == 0, "same seed, same tokens");
    int same = 0, distinct = 0;
    for (int i = 0; i < 200; i++) {
        same += a[i] == c[i];
        distinct += i > 0 && a[i] != a[i - 1];
    }
    CHECK(same < 100 && distinct > 50, "different seeds: %d of 200 equal; %d changes", same,
          distinct);
    /* Known answer: these tokens come out on every machine (xoshiro256**
     * seeded by splitmix64, 53-bit uniforms, inverse CDF in id order). */
    static const int32_t golden[10] = {11, 4, 13, 15, 15, 14, 1, 2, 7, 3};
    CHECK(memcmp(a, golden, sizeof golden) == 0, "seed 7 draws %d %d %d %d %d %d %d %d %d %d",
          a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]);
}

static void big_vocab(void) {
    const int n = 262144;
    lmx_sampler_params cases[] = {
        {0.7f, 0, 0.9f, 0, 1, 1},    {1.0f, 0, 0.95f, 0, 1, 1},  {1.0f, 40, 0.9f, 0.05f, 1, 1},
        {0.6f, 0, 1, 0.1f, 1, 1},    {1.5f, 1000, 0.8f, 0, 1, 1}, {1.0f, 0, 0.999f, 0, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char what[64];
        snprintf(what, sizeof what, "vocab %d case %zu", n, i);
        against_oracle(n, 0, cases[i], what);
    }
    /* many ties: the top-p cut falls inside a group of equal logits */
    lmx_sampler_params ties[] = {{1.0f, 0, 0.5f, 0, 1, 1}, {1.0f, 0, 0.9f, 0, 1, 1},
                                 {1.0f, 700, 0.7f, 0.3f, 1, 1}};
    for (size_t i = 0; i < sizeof ties / sizeof *ties; i++) {
        char what[64];
        snprintf(what, sizeof what, "ties case %zu", i);
        against_oracle(5000, 6, ties[i], what);
    }
    /* speed, reported only */
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    for (int i = 0; i < n; i++)
        x[i] = (float)(10 * test_unit() * test_unit());
    lmx_sampler_params speed[] = {{1, 0, 1, 0, 1, 3}, {0.7f, 0, 0.9f, 0, 1, 3},
                                  {0.7f, 40, 0.9f, 0, 1.1f, 3}, {0.7f, 0, 1, 0.05f, 1, 3}};
    for (size_t i = 0; i < sizeof speed / sizeof *speed; i++) {
        lmx_sampler *s = make(speed[i], n);
        int32_t hist[64];
        for (int j = 0; j < 64; j++)
            hist[j] = j * 97;
        clock_t t0 = clock();
        int reps = 20;
        for (int r = 0; r < reps && s; r++) {
            memcpy(y, x, (size_t)n * sizeof *y);
            lmx_sampler_sample(s, y, hist, 64);
        }
        printf("vocab %d, T %.1f top_k %d top_p %.2f min_p %.2f: %.3f ms per token\n", n,
               (double)speed[i].temperature, speed[i].top_k, (double)speed[i].top_p,
               (double)speed[i].min_p, 1e3 * (double)(clock() - t0) / CLOCKS_PER_SEC / reps);
        lmx_sampler_free(s);
    }
    free(x);
    free(y);
}

/* ---- drawing from the best scores alone (topk.h) ------------------------- */

static int rank_cmp(const void *pa, const void *pb) {
    const lmx_scored *a = pa, *b = pb;
    return lmx_argmax_beats(a->score, a->col, b->score, b->col) ? -1 : 1;
}

static int same_entry(lmx_scored a, lmx_scored b) {
    return a.col == b.col && (a.score == b.score || (isnan(a.score) && isnan(b.score)));
}

/* The groups a backend's read_topk gives: the vocabulary in `groups`
 * slices, each one's best `per` with vocabulary ids. */
static void grouped_top(const float *x, int n, int groups, int per, lmx_scored *out) {
    for (int g = 0; g < groups; g++) {
        int lo = (int)((long)g * n / groups), hi = (int)((long)(g + 1) * n / groups);
        lmx_top_scores(x + lo, hi - lo, per, out + (size_t)g * per);
        for (int j = 0; j < per; j++)
            if (out[(size_t)g * per + j].col >= 0)
                out[(size_t)g * per + j].col += lo;
    }
}

static void top_scores(void) {
    /* lmx_top_scores against a full sort by the rule: ties, NaN, infinities
     * and zeros of both signs, rows shorter and longer than k and than its
     * 64-wide blocks */
    const float pool[] = {NAN, -INFINITY, INFINITY, -0.0f, 0.0f, 1, 2, -3, 0.5f, 7};
    unsigned seed = 11;
    for (int trial = 0; trial < 600; trial++) {
        static float v[700];
        static lmx_scored all[700], got[LMX_TOPK_MAX];
        int n = 1 + (trial * 37) % 700, k = 1 + (trial * 13) % LMX_TOPK_MAX;
        for (int i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            v[i] = trial % 4 ? pool[(seed >> 16) % 10] : (float)((seed >> 8) % 100000) / 7.0f;
            all[i] = (lmx_scored){v[i], i};
        }
        qsort(all, (size_t)n, sizeof *all, rank_cmp);
        lmx_top_scores(v, n, k, got);
        for (int j = 0; j < k; j++) {
            lmx_scored want = j < n ? all[j] : (lmx_scored){NAN, -1};
            CHECK(same_entry(got[j], want), "top scores trial %d (n %d, k %d) entry %d: %g @%d, want %g @%d", trial,
                  n, k, j, got[j].score, got[j].col, want.score, want.col);
        }
    }

    /* lmx_sampler_sample_top draws what lmx_sampler_sample draws from the
     * whole logits: same seed, 40 draws, groups as a GPU gives them (128)
     * and as the CPU does (1). With a repetition penalty (the last four
     * settings, two greedy) the history holds 12 of the row's best tokens,
     * raised first so that the penalty reorders the top, 300 other ids,
     * repeats and ids outside the vocabulary. */
    const int V = 151936, n_hist = 330;
    float *x = malloc((size_t)V * sizeof *x), *y = malloc((size_t)V * sizeof *y);
    lmx_scored *top = malloc((size_t)128 * LMX_TOPK_MAX * sizeof *top);
    int32_t *hist = malloc((size_t)n_hist * sizeof *hist);
    lmx_sampler_params cases[] = {{0.6f, 20, 0.95f, 0, 1, 5},     {1.0f, 64, 1, 0, 1, 6},
                                  {0.7f, 40, 0.9f, 0.05f, 1, 7},  {1.3f, 1, 1, 0, 1, 8},
                                  {0.6f, 127, 0.8f, 0, 1, 9},     {0.7f, 20, 0.8f, 0, 1.3f, 10},
                                  {1.0f, 50, 1, 0.05f, 2.0f, 11}, {0, 0, 1, 0, 1.2f, 12},
                                  {0, 40, 0.5f, 0, 1.05f, 13},    {1.0f, 0, 1, 0.05f, 1, 14},
                                  {0.5f, 0, 1, 0.5f, 1.3f, 15}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases && x && y && top && hist; c++)
        for (int groups = 1; groups <= 128; groups += 127) {
            lmx_sampler *dense = make(cases[c], V), *s = make(cases[c], V);
            int per = s ? lmx_sampler_top_request(s) : 0, mismatched = 0, undecided = 0;
            int pen = cases[c].repetition_penalty != 1, k = cases[c].temperature == 0 ? 1 : cases[c].top_k;
            int want_per = k == 0 ? LMX_SAMPLER_MIN_P_PER /* min_p alone */
                                  : k + 1 + 16 * pen < LMX_TOPK_MAX ? k + 1 + 16 * pen : LMX_TOPK_MAX;
            CHECK(per == want_per, "case %zu: request %d", c, per);
            for (int d = 0; d < 40 && dense && s && per; d++) {
                for (int i = 0; i < V; i++) /* peaked like real logits: a few dozen tokens matter */
                    x[i] = (float)(30 * pow(test_unit(), 8) - 10 * test_unit());
                for (int i = 0; i < n_hist; i++) {
                    int32_t id = (int32_t)(test_unit() * V);
                    if (i < 12)
                        x[id] = (float)(25 + 10 * test_unit());
                    hist[i] = i < 312 ? id : i < 316 ? hist[i - 300] : i < 318 ? -1 - i : V + i;
                }
                int nh = pen ? n_hist : 0;
                memcpy(y, x, (size_t)V * sizeof *y);
                int32_t want = lmx_sampler_sample(dense, y, hist, (size_t)nh);
                grouped_top(x, V, groups, per, top);
                int32_t got = lmx_sampler_sample_top(s, top, groups, per, hist, (size_t)nh);
                if (got < 0) { /* an exact tie at the boundary (seen with k 127): as a stream does */
                    undecided++;
                    got = lmx_sampler_sample(s, x, hist, (size_t)nh);
                }
                mismatched += got != want;
            }
            CHECK(mismatched == 0 && undecided <= 2, "case %zu, %d groups: %d of 40 draws differ, %d undecided", c,
                  groups, mismatched, undecided);
            lmx_sampler_free(dense);
            lmx_sampler_free(s);
        }

    /* min_p alone on a vocabulary whose last block is short (1000 = 3 *
     * 256 + 232, not a multiple of sum_block's 8 lanes), kept tokens in
     * random blocks and in the last: 7 groups, 200 draws */
    {
        enum { SV = 1000 };
        float a[SV], b[SV];
        lmx_scored t[7 * LMX_SAMPLER_MIN_P_PER];
        lmx_sampler_params mp = {1.0f, 0, 1, 0.3f, 1, 21};
        lmx_sampler *dense = make(mp, SV), *s = make(mp, SV);
        int mismatched = 0, undecided = 0;
        for (int d = 0; d < 200 && dense && s; d++) {
            for (int i = 0; i < SV; i++)
                a[i] = (float)(-20 * test_unit());
            for (int i = 0; i < 6; i++) /* kept: weights e^-1 to 1 of the top's */
                a[(int)(test_unit() * SV)] = (float)(30 - test_unit());
            a[SV - 1] = 30; /* in the short block */
            memcpy(b, a, sizeof b);
            int32_t want = lmx_sampler_sample(dense, b, NULL, 0);
            grouped_top(a, SV, 7, LMX_SAMPLER_MIN_P_PER, t);
            int32_t got = lmx_sampler_sample_top(s, t, 7, LMX_SAMPLER_MIN_P_PER, NULL, 0);
            undecided += got < 0;
            mismatched += got != want;
        }
        CHECK(mismatched == 0 && undecided == 0, "min_p alone, short last block: %d of 200 draws differ, %d undecided",
              mismatched, undecided);
        lmx_sampler_free(dense);
        lmx_sampler_free(s);
    }

    /* undecidable: a tie at the top-k boundary with a token its group left
     * out, directly or once divided by the temperature; a group whose every
     * entry min_p keeps; no random number is used up, so the dense draw
     * that follows matches */
    float lo = 0.9f; /* lo / 0.6 == next / 0.6 for some lo just below 1 */
    while (nextafterf(lo, 1) / 0.6f != lo / 0.6f)
        lo = nextafterf(lo, 1);
    const float tie[] = {5, 3, 3, 3, 1}, warp_tie[] = {lo, nextafterf(lo, 1), -2, -3};
    float flat[40];
    for (int i = 0; i < 40; i++)
        flat[i] = i == 7 ? 2.0f : 1.5f; /* min_p 0.5 keeps all: weight e^-0.5 = 0.61 */
    struct {
        const float *x;
        int n;
        lmx_sampler_params p;
    } undecided[] = {{tie, 5, {1.0f, 2, 1, 0, 1, 3}},       /* 3 @1 and @2 listed, 3 @3 left out */
                     {warp_tie, 4, {0.6f, 1, 1, 0, 1, 3}},  /* lo @0 warps to the top score too */
                     {flat, 40, {1.0f, 0, 1, 0.5f, 1, 3}}}; /* 32 listed, 8 kept ones left out */
    for (int u = 0; u < 3; u++) {
        lmx_sampler *dense = make(undecided[u].p, undecided[u].n), *s = make(undecided[u].p, undecided[u].n);
        int per = s ? lmx_sampler_top_request(s) : 0;
        lmx_scored t[LMX_TOPK_MAX];
        for (int d = 0; d < 20 && dense && s; d++) {
            float a[40], b[40];
            memcpy(a, undecided[u].x, (size_t)undecided[u].n * sizeof *a);
            memcpy(b, a, sizeof b);
            lmx_top_scores(a, undecided[u].n, per, t);
            CHECK(lmx_sampler_sample_top(s, t, 1, per, NULL, 0) == -1, "undecided case %d draw %d decided", u, d);
            int32_t want = lmx_sampler_sample(dense, a, NULL, 0), got = lmx_sampler_sample(s, b, NULL, 0);
            CHECK(got == want, "undecided case %d draw %d: %d after the fallback, want %d", u, d, got, want);
        }
        lmx_sampler_free(dense);
        lmx_sampler_free(s);
    }
    /* undecidable with a penalty: the 18 best of 40 (all a greedy request
     * holds) in the history, divided by 4, fall below the 19th, which the
     * group left out */
    {
        float a[40];
        int32_t h[18];
        lmx_scored t[LMX_TOPK_MAX];
        for (int i = 0; i < 40; i++)
            a[i] = (float)(40 - i);
        for (int i = 0; i < 18; i++)
            h[i] = i;
        lmx_sampler *s = make(params(0, 0, 1, 0, 4), 40);
        int per = s ? lmx_sampler_top_request(s) : 0;
        CHECK(per == 18, "greedy with a penalty: request %d", per);
        if (per == 18) {
            lmx_top_scores(a, 40, per, t);
            CHECK(lmx_sampler_sample_top(s, t, 1, per, h, 18) == -1, "penalized greedy decided");
            CHECK(lmx_sampler_sample(s, a, h, 18) == 18, "penalized greedy fallback");
        }
        lmx_sampler_free(s);
    }
    /* speed, reported only: Qwen3's defaults on its vocabulary, the whole
     * row against its best scores (as the CPU gives them, one group; and
     * drawing from a GPU's 128) */
    lmx_sampler_params q3 = {0.6f, 20, 0.95f, 0, 1, 3};
    lmx_sampler *sd = make(q3, V);
    int per = sd ? lmx_sampler_top_request(sd) : 0, reps = 50;
    double t[4] = {0};
    for (int r = 0; r < reps && sd && x && y && top; r++) {
        for (int i = 0; i < V; i++)
            x[i] = (float)(30 * pow(test_unit(), 8) - 10 * test_unit());
        clock_t c0 = clock();
        memcpy(y, x, (size_t)V * sizeof *y);
        lmx_sampler_sample(sd, y, NULL, 0);
        clock_t c1 = clock();
        lmx_top_scores(x, V, per, top);
        clock_t c2 = clock();
        lmx_sampler_sample_top(sd, top, 1, per, NULL, 0);
        clock_t c3 = clock();
        grouped_top(x, V, 128, per, top);
        clock_t c4 = clock();
        lmx_sampler_sample_top(sd, top, 128, per, NULL, 0);
        t[0] += c1 - c0, t[1] += c2 - c1, t[2] += c3 - c2, t[3] += clock() - c4;
    }
    for (int i = 0; i < 4; i++)
        t[i] *= 1e6 / CLOCKS_PER_SEC / reps;
    printf("vocab %d, T 0.6 top_k 20 top_p 0.95: whole row %.0f us; best scores %.0f us + draw %.1f us; "
           "draw from 128 groups %.1f us\n", V, t[0], t[1], t[2], t[3]);
    lmx_sampler_free(sd);
    lmx_sampler_params no[] = {{1, 0, 0.9f, 0, 1, 1},    {1, 20, 1, 0, 0.9f, 1},
                               {0, 0, 1, 0, 0.5f, 1},    {1, LMX_TOPK_MAX, 1, 0, 1, 1},
                               {1, 0, 0.9f, 0.1f, 1, 1}, {1, 0, 1, 0.1f, 0.9f, 1}};
    for (int i = 0; i < 6; i++) {
        lmx_sampler *s = make(no[i], 100);
        CHECK(s && lmx_sampler_top_request(s) == 0,
              "case %d (no top-k and no min_p alone, penalties below 1, k too large) asks for top scores", i);
        lmx_sampler_free(s);
    }
    free(x);
    free(y);
    free(top);
    free(hist);
}

int main(void) {
    validation();
    greedy();
    repetition_penalty();
    top_k();
    top_p();
    min_p();
    combined();
    temperature_and_precision();
    odd_values();
    frequencies();
    seeds();
    big_vocab();
    top_scores();
    return test_finish();
}
