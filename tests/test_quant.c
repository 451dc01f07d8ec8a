/* On-load q8/q4 quantization: the packed layout round-trips within half a
 * step, and the next-token distributions stay close to the float ones: KL
 * divergence against the unquantized model, per format, on the fixtures
 * (and on any checkpoint directory given as an argument). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "dtype.h"
#include "lmx.h"
#include "quant.h"
#include "testutil.h"

/* Round trip of random rows through lmx_quant_rows and the reference
 * decoder: every element within half a step (plus float16 rounding of the
 * bias) of its source. */
static void check_round_trip(int bits)
{
    enum { N = 3, K = 192 };
    static float src[N * K], back[K];
    uint64_t s = 12345;
    for (int i = 0; i < N * K; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        src[i] = (float)((s >> 40) & 0xffff) / 65536.0f * 0.2f - 0.13f;
    }
    int G = lmx_quant_group(K);
    size_t qb = N * lmx_quant_row_bytes(K, bits);
    uint8_t *buf = calloc(1, qb + 2 * N * (K / G) * sizeof(uint16_t));
    lmx_cpu_weight w = {LMX_WK_F32, N, K, src, NULL, NULL, 0};
    lmx_cpu_weight q = {bits == 8 ? LMX_WK_Q8 : LMX_WK_Q4, N, K, buf, (uint16_t *)(buf + qb),
                        (uint16_t *)(buf + qb) + N * (K / G), G};
    lmx_quant_rows(&w, &q, 0, N);
    float worst = 0;
    for (int r = 0; r < N; r++) {
        lmx_cpu_kernels_scalar()->decode(&q, r, back);
        for (int k = 0; k < K; k++) {
            float step = lmx_f16_to_f32(q.scales[r * (K / G) + k / G]);
            float err = fabsf(back[k] - src[r * K + k]) / step;
            worst = fmaxf(worst, err);
        }
    }
    /* half a step, plus the float16 rounding of scale and bias (< 1/1024
     * relative each, times at most 2^bits steps) */
    float bound = 0.5f + (float)(1 << bits) / 1024.0f + 0.01f;
    CHECK(worst <= bound, "q%d round trip: worst error %g steps > %g", bits, worst, bound);
    free(buf);
}

/* KL(p || q) of two logit rows, in nats. */
static double kl(const float *p_logits, const float *q_logits, int V)
{
    double mp = -INFINITY, mq = -INFINITY, zp = 0, zq = 0, d = 0;
    for (int i = 0; i < V; i++) {
        mp = fmax(mp, p_logits[i]);
        mq = fmax(mq, q_logits[i]);
    }
    for (int i = 0; i < V; i++) {
        zp += exp(p_logits[i] - mp);
        zq += exp(q_logits[i] - mq);
    }
    for (int i = 0; i < V; i++) {
        double lp = p_logits[i] - mp - log(zp), lq = q_logits[i] - mq - log(zq);
        d += exp(lp) * (lp - lq);
    }
    return d > 0 ? d : 0;
}

enum { L = 24 };

/* Logits at every position of a fixed prompt, evaluated in one call
 * (prefill: the matrix-matrix kernels) or one token a call (decode: the
 * matrix-vector kernels, which for q8/q4 also quantize x); NULL on
 * failure. bf16_x: lmx_load_options.prefill_bf16. */
static float *run(const char *dir, int quant, int bf16_x, int one_by_one, int *V)
{
    lmx_load_options o = lmx_load_defaults();
    o.quant = quant;
    o.prefill_bf16 = bf16_x;
    o.n_threads = 2;
    lmx_error err = {0};
    lmx_model *m = lmx_load(dir, &o, &err);
    CHECK(m != NULL, "load %s quant %d: %s", dir, quant, err.message);
    if (!m)
        return NULL;
    *V = lmx_model_vocab_size(m);
    int32_t ids[L];
    test_fixed_ids(ids, L, *V);
    float *logits = malloc((size_t)L * *V * sizeof(float));
    lmx_context *c = lmx_context_new(m, 64, &err);
    for (int i = 0; i < (one_by_one ? L : 1); i++) {
        int n = one_by_one ? 1 : L;
        CHECK(c && logits && lmx_context_eval(c, ids + i, n, logits + (size_t)i * *V, 1, &err) == LMX_OK,
              "eval: %s", err.message);
    }
    lmx_context_free(c);
    lmx_close(m);
    return logits;
}

/* The prompt's x rounded to bf16 in products with bf16 weights
 * (prefill_bf16) against float32 x, ref: mean KL (docs/quantization.md),
 * within q8's bound (bf16 keeps 8 bits of x, q8 8 bits of a weight; 0 for
 * float32 weights or where the CPU lacks AVX512_BF16). */
static void check_kl_bf16_x(const char *label, const char *dir, const float *ref, int V, double bound8)
{
    double mean = 0;
    float *b = run(dir, 0, 1, 0, &V);
    for (int p = 0; b && p < L; p++)
        mean += kl(ref + (size_t)p * V, b + (size_t)p * V, V) / L;
    printf("%-14s prefill KL(f32 || bf16 x) = %.3g nats (prefill_bf16, mean over %d positions)\n", label, mean, L);
    CHECK(mean <= bound8, "%s prefill: KL bf16 x %g > %g", label, mean, bound8);
    free(b);
}

/* Mean KL over the prompt's positions for q8 and q4, in prefill and in
 * decode. The bounds are about 2.5x the worst fixture (docs/quantization.md
 * has the numbers): these are random-weight models with sharp logits, a
 * harder case than trained ones. Decode also rounds x to 8 bits, an error
 * about the size of q8's own: q8's bound is 2.5x larger there. (Prefill
 * rounds x to 8 bits only for q4 weights, on every path but AMX tiles;
 * q8 on the avx512 integer tile keeps ~15 bits of x.) */
static void check_kl(const char *label, const char *dir, double bound8, double bound4)
{
    for (int dec = 0; dec < 2; dec++) {
        int V = 0;
        float *ref = run(dir, 0, 0, dec, &V);
        double mean[2] = {0};
        for (int f = 0; f < 2 && ref; f++) {
            float *q = run(dir, f ? 4 : 8, 0, dec, &V);
            for (int p = 0; q && p < L; p++)
                mean[f] += kl(ref + (size_t)p * V, q + (size_t)p * V, V) / L;
            free(q);
        }
        const char *how = dec ? "decode" : "prefill";
        printf("%-14s %-7s KL(f32 || q8) = %.3g nats, KL(f32 || q4) = %.3g nats (mean over %d positions)\n",
               label, how, mean[0], mean[1], L);
        CHECK(mean[0] > 0 && mean[1] > 0, "%s %s: quantization changed nothing", label, how);
        CHECK(mean[0] < mean[1], "%s %s: q8 (%g) not closer than q4 (%g)", label, how, mean[0], mean[1]);
        /* KL grows with the square of the weight error for small errors, and
         * q8's step is 17x finer than q4's (255 vs 15 levels): the ratio sits
         * near 17^2 = 289 when both formats are right; a packing or scale bug in
         * either breaks it by orders of magnitude. */
        double ratio = mean[1] / mean[0];
        CHECK(ratio > 64 && ratio < 1024, "%s %s: KL q4 / KL q8 = %g, want ~289", label, how, ratio);
        CHECK(mean[0] <= bound8 * (dec ? 2.5 : 1), "%s %s: KL q8 %g > %g", label, how, mean[0],
              bound8 * (dec ? 2.5 : 1));
        CHECK(mean[1] <= bound4, "%s %s: KL q4 %g > %g", label, how, mean[1], bound4);
        if (!dec && ref)
            check_kl_bf16_x(label, dir, ref, V, bound8);
        free(ref);
    }
}

int main(int argc, char **argv)
{
    check_round_trip(8);
    check_round_trip(4);
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            check_kl(argv[i], argv[i], 2e-3, 0.5);
        return test_finish();
    }
    const char *names[] = {"qwen3-small", "gemma3-small", "qwen3-tiny", "gemma3-tiny"};
    for (int i = 0; i < 4; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", LMX_TEST_DATA, names[i]);
        check_kl(names[i], dir, 2e-3, 0.5);
    }
    lmx_load_options o = lmx_load_defaults();
    o.quant = 3;
    lmx_error err = {0};
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3-tiny", LMX_TEST_DATA);
    lmx_model *m = lmx_load(dir, &o, &err);
    CHECK(!m && err.code == LMX_ERR_ARG, "quant = 3 is refused: %s", err.message);
    lmx_close(m);
    return test_finish();
}
