/* The decode GEMV (src/cuda_gemv.cuh) on one model's matrix shapes, under
 * launch variants: loads in flight per thread and row (U), warps sharing
 * a slot (W; the backend picks 1 or 2 by the slots' count and whether
 * they fit one wave) and weight rows a slot (M; of both gate and up for
 * gate/up; the backend's slot_rows picks 1, 2 or 4 for ungated products,
 * 1 for gate/up). Each
 * shape is stored `layers` times (a layer's matrix each, so that nothing
 * stays in L2) and its GEMVs run back to back from a CUDA graph, launched
 * as the backend launches them (programmatic dependent launch); best of 5
 * replays. Back to back, a GEMV cannot start early behind a short kernel
 * as it does in a decode step, so small matrices time slower here than in
 * bench/kernel_trace.c's timelines: compare variants, not absolute times.
 *
 *   gemv_bench [qwen3-8b|qwen3-0.6b|gemma3-4b|gemma3-12b] [bf16|q8|q4]
 *
 * Prints one line per (shape, variant): microseconds a GEMV and the weight
 * bytes read per second. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_check.h"

extern "C" {
#include "backend.h"
}

namespace {
#include "cuda_common.cuh"
#include "cuda_gemv.cuh"

struct shape {
    const char *name;
    int n, rows[LMX_MAX_MULTI], K;
    bool gated;
    int layers;
};

struct model_shapes {
    const char *name;
    shape s[5];
};

/* Hidden size, q/k/v rows, intermediate size, vocabulary (config.json). */
model_shapes models[] = {
    {"qwen3-8b",
     {{"q/k/v", 3, {4096, 1024, 1024}, 4096, false, 36},
      {"o", 1, {4096}, 4096, false, 36},
      {"gate/up", 2, {12288, 12288}, 4096, true, 36},
      {"down", 1, {4096}, 12288, false, 36},
      {"lm_head", 1, {151936}, 4096, false, 2}}},
    {"qwen3-0.6b",
     {{"q/k/v", 3, {2048, 1024, 1024}, 1024, false, 28},
      {"o", 1, {1024}, 2048, false, 28},
      {"gate/up", 2, {3072, 3072}, 1024, true, 28},
      {"down", 1, {1024}, 3072, false, 28},
      {"lm_head", 1, {151936}, 1024, false, 4}}},
    {"gemma3-4b",
     {{"q/k/v", 3, {2048, 1024, 1024}, 2560, false, 34},
      {"o", 1, {2560}, 2048, false, 34},
      {"gate/up", 2, {10240, 10240}, 2560, true, 34},
      {"down", 1, {2560}, 10240, false, 34},
      {"lm_head", 1, {262208}, 2560, false, 2}}},
    {"gemma3-12b",
     {{"q/k/v", 3, {4096, 2048, 2048}, 3840, false, 48},
      {"o", 1, {3840}, 4096, false, 48},
      {"gate/up", 2, {15360, 15360}, 3840, true, 48},
      {"down", 1, {3840}, 15360, false, 48},
      {"lm_head", 1, {262208}, 3840, false, 1}}},
};

void launch(void (*k)(gemv_set, xin, int, int), unsigned grid, cudaStream_t st, const gemv_set &s, const xin &x)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = GEMV_WARPS * 32;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k, s, x, 1, 0));
}

struct variant {
    const char *name;
    void (*plain)(gemv_set, xin, int, int), (*gated)(gemv_set, xin, int, int);
    int wpr, rps;
};

template <typename F, int U, int WPR, int RPS = 1> variant make(const char *name)
{
    return variant{name, k_gemv<F, 1, false, U, WPR, RPS>, k_gemv<F, 1, true, U, WPR, RPS>, WPR, RPS};
}

template <typename F> void variants(variant *v, int *n)
{
    int i = 0;
    v[i++] = make<F, 1, 1>("U1 W1"); /* the backend's gate/up for q8/q4 */
    v[i++] = make<F, 1, 2>("U1 W2");
    v[i++] = make<F, 2, 1>("U2 W1");
    v[i++] = make<F, 4, 1>("U4 W1");
    v[i++] = make<F, 2, 2>("U2 W2");
    v[i++] = make<F, 4, 2>("U4 W2");
    v[i++] = make<F, 2, 1, 2>("U2 W1 M2");
    v[i++] = make<F, 2, 2, 2>("U2 W2 M2");
    v[i++] = make<F, 1, 1, 2>("U1 W1 M2");
    v[i++] = make<F, 1, 2, 2>("U1 W2 M2");
    v[i++] = make<F, 1, 1, 4>("U1 W1 M4");
    v[i++] = make<F, 1, 2, 4>("U1 W2 M4");
    v[i++] = make<F, 2, 1, 4>("U2 W1 M4");
    v[i++] = make<F, 2, 2, 4>("U2 W2 M4");
    v[i++] = make<F, 1, 1, 8>("U1 W1 M8");
    v[i++] = make<F, 1, 2, 8>("U1 W2 M8");
    *n = i;
}

double run_shape(const shape &sh, int bits, const variant &v, void **w, __half **sc, float **out, const xin &x,
                 size_t *bytes, cudaStream_t st)
{
    auto k = sh.gated ? v.gated : v.plain;
    int total = 0;
    for (int i = 0; i < sh.n; i++)
        total += sh.rows[i];
    int rows = (sh.gated ? sh.rows[0] : total) / v.rps;
    unsigned grid = (unsigned)((rows * v.wpr + GEMV_WARPS - 1) / GEMV_WARPS);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    *bytes = 0;
    for (int l = 0; l < sh.layers; l++) {
        gemv_set s = {};
        s.n = sh.n;
        for (int i = 0; i < sh.n; i++) {
            size_t idx = (size_t)l * LMX_MAX_MULTI + i;
            s.w[i] = w[idx];
            s.sb[i] = bits ? (const __half2 *)sc[idx] : NULL;
            s.out[i] = out[i];
            s.end[i] = (i ? s.end[i - 1] : 0) + sh.rows[i];
            *bytes += (size_t)sh.rows[i] * sh.K * (bits ? bits : 16) / 8 + (bits ? 4 * (size_t)sh.rows[i] * x.ng : 0);
        }
        launch(k, grid, st, s, x);
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    float best = 1e30f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int rep = 0; rep < 6; rep++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep && ms < best) /* the first replay warms up */
            best = ms;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return best * 1e3 / sh.layers;
}

template <typename F> void bench(const model_shapes &m, int bits)
{
    variant v[16];
    int nv;
    variants<F>(v, &nv);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int kmax = 0, rmax = 0;
    for (const shape &sh : m.s) {
        kmax = sh.K > kmax ? sh.K : kmax;
        for (int i = 0; i < sh.n; i++)
            rmax = sh.rows[i] > rmax ? sh.rows[i] : rmax;
    }
    float *xf, *out[LMX_MAX_MULTI];
    float2 *xd;
    int8_t *xq;
    CK(cudaMalloc(&xf, kmax * sizeof(float)));
    CK(cudaMemset(xf, 0, kmax * sizeof(float)));
    CK(cudaMalloc(&xq, kmax));
    CK(cudaMemset(xq, 1, kmax));
    CK(cudaMalloc(&xd, kmax * sizeof(float2)));
    CK(cudaMemset(xd, 0, kmax * sizeof(float2)));
    for (int i = 0; i < LMX_MAX_MULTI; i++)
        CK(cudaMalloc(&out[i], rmax * sizeof(float)));
    for (const shape &sh : m.s) {
        int G = sh.K % 64 == 0 ? 64 : 32;
        xin x = {xf, xq, xd, sh.K, G == 32 ? 5 : 6, bits ? sh.K / G : 0};
        size_t nw = (size_t)sh.layers * LMX_MAX_MULTI;
        void **w = (void **)calloc(nw, sizeof *w);
        __half **sc = (__half **)calloc(nw, sizeof *sc);
        for (int l = 0; l < sh.layers; l++)
            for (int i = 0; i < sh.n; i++) {
                size_t idx = (size_t)l * LMX_MAX_MULTI + i, n = (size_t)sh.rows[i] * sh.K;
                CK(cudaMalloc(&w[idx], n * (bits ? bits : 16) / 8));
                CK(cudaMemset(w[idx], 0x3c, n * (bits ? bits : 16) / 8));
                if (bits) {
                    CK(cudaMalloc(&sc[idx], 2 * (n / G) * sizeof(__half)));
                    CK(cudaMemset(sc[idx], 0x1c, 2 * (n / G) * sizeof(__half)));
                }
            }
        for (int i = 0; i < nv; i++) {
            size_t bytes;
            double us = run_shape(sh, bits, v[i], w, sc, out, x, &bytes, st);
            printf("%-10s %-8s %-6s %8.2f us %6.3f TB/s\n", m.name, sh.name, v[i].name, us,
                   bytes / sh.layers / us * 1e-6);
        }
        for (size_t i = 0; i < nw; i++) {
            cudaFree(w[i]);
            cudaFree(sc[i]);
        }
        free(w);
        free(sc);
    }
    cudaFree(xf);
    cudaFree(xq);
    cudaFree(xd);
    for (int i = 0; i < LMX_MAX_MULTI; i++)
        cudaFree(out[i]);
    CK(cudaStreamDestroy(st));
}
} // namespace

int main(int argc, char **argv)
{
    const char *model = argc > 1 ? argv[1] : "qwen3-8b", *fmt = argc > 2 ? argv[2] : "bf16";
    for (const model_shapes &m : models) {
        if (strcmp(m.name, model))
            continue;
        if (!strcmp(fmt, "bf16"))
            bench<fmt_float<__nv_bfloat16>>(m, 0);
        else if (!strcmp(fmt, "q8"))
            bench<fmt_quant<8>>(m, 8);
        else if (!strcmp(fmt, "q4"))
            bench<fmt_quant<4>>(m, 4);
        else
            break;
        return 0;
    }
    fprintf(stderr, "usage: gemv_bench [qwen3-8b|qwen3-0.6b|gemma3-4b|gemma3-12b] [bf16|q8|q4]\n");
    return 2;
}
