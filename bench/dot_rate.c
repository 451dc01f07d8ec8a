/* Multiply-adds a nanosecond on one core: float32 FMA (vfmadd231ps, what
 * lmx's exact prefill tile runs) against the bf16 pair dot product
 * (vdpbf16ps, what llama.cpp's BF16 prefill runs on activations rounded
 * to bf16), both on 512-bit registers, 12 independent chains each (enough
 * to cover either latency). The ratio bounds what exact float32
 * activations can reach against bf16-rounded ones (bench/RESULTS.md, CPU).
 *
 *   cc -O2 -mavx512f -mavx512bf16 bench/dot_rate.c -o /tmp/dot_rate && /tmp/dot_rate
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

enum { CHAINS = 12 };
static const long ITERS = 100000000;

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Nanoseconds for ITERS x CHAINS instructions of one kind (bf16: the
 * pair dot product, else FMA); the sum returned keeps the chains live. */
static float chains(int bf16, double *ns)
{
    __m512 acc[CHAINS], x = _mm512_set1_ps(0.5f), y = _mm512_set1_ps(0.25f);
    __m512bh xb = (__m512bh)_mm512_set1_epi16(0x3f00), yb = (__m512bh)_mm512_set1_epi16(0x3e80); /* 0.5, 0.25 */
    for (int i = 0; i < CHAINS; i++)
        acc[i] = _mm512_setzero_ps();
    double t = seconds();
    if (bf16)
        for (long n = 0; n < ITERS; n++)
#pragma GCC unroll 12 /* the chains in registers */
            for (int i = 0; i < CHAINS; i++)
                acc[i] = _mm512_dpbf16_ps(acc[i], xb, yb);
    else
        for (long n = 0; n < ITERS; n++)
#pragma GCC unroll 12
            for (int i = 0; i < CHAINS; i++)
                acc[i] = _mm512_fmadd_ps(x, y, acc[i]);
    *ns = (seconds() - t) * 1e9;
    float s = 0;
    for (int i = 0; i < CHAINS; i++)
        s += _mm512_reduce_add_ps(acc[i]);
    return s;
}

int main(void)
{
    if (!__builtin_cpu_supports("avx512bf16")) {
        fprintf(stderr, "dot_rate: this CPU lacks AVX512-BF16\n");
        return 1;
    }
    for (int rep = 0; rep < 3; rep++) {
        double nf, nb;
        float sf = chains(0, &nf), sb = chains(1, &nb);
        double instr = (double)ITERS * CHAINS;
        printf("vfmadd231ps %.3f ns/instr, %.1f MAC/ns; vdpbf16ps %.3f ns/instr, %.1f MAC/ns; ratio %.2f (%g %g)\n",
               nf / instr, 16 * instr / nf, nb / instr, 32 * instr / nb, (32 * instr / nb) / (16 * instr / nf), sf,
               sb);
    }
    return 0;
}
