/* GPU numbers for one checkpoint (bench/gpu_run.sh builds and runs it):
 * device-to-device copy bandwidth, prefill tok/s for 512- and 4096-token
 * prompts, decode tok/s at context 0 and at depth 4096, and the decode's
 * effective bandwidth (weights read per token + KV cache read) against the
 * copy bandwidth; the 4096-token prefill's arithmetic rate against cuBLAS's
 * bf16 rate on the model's own products. Random token ids; timings are wall
 * clock around lmx_context_eval, which returns with the logits on the host
 * (--argmax: decode through lmx_context_eval_argmax, only the id back). */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend_cuda.h"
#include "context.h"
#include "lmx.h"
#include "model.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* n bf16 values uniform in (-0.05, 0.05) at device address d. Random
 * rather than constant data: the tensor cores draw more power, and run
 * slower, on data that changes (an 8192^3 product measured 788 TFLOP/s on
 * random data, 894 on zeros), and the models' weights are random-like. */
static int fill_random_bf16(void *d, size_t n)
{
    uint16_t *h = malloc(n * sizeof *h);
    if (!h)
        return 0;
    uint32_t state = 12345;
    for (size_t i = 0; i < n; i++) {
        state = state * 1664525u + 1013904223u;
        float v = ((float)(state >> 8) / 16777216.0f - 0.5f) * 0.1f;
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        h[i] = (uint16_t)(bits >> 16);
    }
    int ok = cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice) == cudaSuccess;
    free(h);
    return ok;
}

/* FLOP/s of cuBLAS's bf16 tensor-core products (bf16 in, float32 out and
 * accumulation, as lmx's prefill calls it) on one layer's weight shapes
 * with `rows` rows of activations: the rate prefill's products could reach
 * (0 if cuBLAS failed). random: on random data (the reference), else on
 * constant data (faster: sessions 10-12 compared with that). */
static double matmul_rate(const lmx_config *c, int rows, int random)
{
    int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim, hid = c->hidden_size,
        inter = c->intermediate_size;
    const int shape[][2] = {{q + 2 * kv, hid}, {hid, q}, {2 * inter, hid}, {hid, inter}}; /* N, K */
    size_t wmax = 0, kmax = 0, nmax = 0;
    for (int i = 0; i < 4; i++) {
        size_t n = (size_t)shape[i][0], k = (size_t)shape[i][1];
        wmax = n * k > wmax ? n * k : wmax;
        kmax = k > kmax ? k : kmax;
        nmax = n > nmax ? n : nmax;
    }
    void *w = NULL, *x = NULL, *y = NULL;
    cublasHandle_t h = NULL;
    double rate = 0;
    if (cudaMalloc(&w, wmax * 2) || cudaMalloc(&x, (size_t)rows * kmax * 2) ||
        cudaMalloc(&y, (size_t)rows * nmax * 4) || cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
        goto done;
    if (!random) { /* bf16 ~0.01, as sessions up to 12 measured it */
        cudaMemset(w, 0x3c, wmax * 2);
        cudaMemset(x, 0x3c, (size_t)rows * kmax * 2);
    } else if (!fill_random_bf16(w, wmax) || !fill_random_bf16(x, (size_t)rows * kmax)) {
        goto done;
    }
    const float one = 1, zero = 0;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    double flops = 0;
    int ok = 1;
    for (int rep = 0; rep < 6; rep++) { /* the first round warms up */
        if (rep == 1) {
            cudaEventRecord(e0, 0);
            flops = 0;
        }
        for (int i = 0; i < 4; i++) {
            int n = shape[i][0], k = shape[i][1];
            ok &= cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &one, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k,
                               &zero, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
            flops += 2.0 * n * k * rows;
        }
    }
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    rate = ok && ms > 0 ? flops / (ms * 1e-3) : 0;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
done:
    if (h)
        cublasDestroy(h);
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
    return rate;
}

/* Arithmetic of a prefill of n tokens a token: the layers' products and
 * causal attention (QK and PV, each key within the layer's window). */
static double prefill_flops(const lmx_config *c, int n)
{
    double q = (double)c->n_heads * c->head_dim, kv = (double)c->n_kv_heads * c->head_dim, hid = c->hidden_size;
    double per_layer = 2 * (hid * (q + 2 * kv) + q * hid + 3 * hid * c->intermediate_size), f = 0;
    for (int l = 0; l < c->n_layers; l++) {
        int win = c->layers[l].window;
        double keys = 0; /* keys seen, summed over the n positions */
        for (int i = 0; i < n; i++)
            keys += win && win < i + 1 ? win : i + 1;
        f += per_layer + 4 * q * keys / n;
    }
    return f;
}

static void fail(const char *what, const lmx_error *err)
{
    fprintf(stderr, "gpu_bench: %s: %s\n", what, err->message);
    exit(1);
}

static int32_t *random_ids(int n, int vocab)
{
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    unsigned s = 12345;
    for (int i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        ids[i] = (int32_t)((s >> 8) % (unsigned)(vocab < 100000 ? vocab : 100000));
    }
    return ids;
}

/* Prefill of n tokens in chunks of `chunk` rows: tok/s (best of 2). */
static double prefill(lmx_model *m, int n, int chunk, float *logits)
{
    lmx_error err = {0};
    int32_t *ids = random_ids(n, lmx_model_vocab_size(m));
    lmx_context *c = lmx_context_new_chunked(m, n + 8, chunk, &err);
    if (!c)
        fail("context", &err);
    double best = 0;
    for (int rep = 0; rep < 2; rep++) {
        lmx_context_truncate(c, 0, &err);
        double t0 = now();
        if (lmx_context_eval(c, ids, n, logits, 0, &err))
            fail("prefill", &err);
        double r = n / (now() - t0);
        best = r > best ? r : best;
    }
    lmx_context_free(c);
    free(ids);
    return best;
}

/* One decode eval: the logits back, or (argmax) only the greedy id, as a
 * stream decoding greedily asks for. */
static lmx_status eval_one(lmx_context *c, const int32_t *id, float *logits, int argmax, lmx_error *err)
{
    int32_t next;
    return argmax ? lmx_context_eval_argmax(c, id, 1, &next, err) : lmx_context_eval(c, id, 1, logits, 0, err);
}

/* Decode of `gen` tokens after `depth` tokens of context: tok/s. */
static double decode(lmx_model *m, int depth, int gen, int chunk, float *logits, int argmax)
{
    lmx_error err = {0};
    int32_t *ids = random_ids(depth + gen + 4, lmx_model_vocab_size(m));
    lmx_context *c = lmx_context_new_chunked(m, depth + gen + 8, chunk, &err);
    if (!c)
        fail("context", &err);
    if (depth && lmx_context_eval(c, ids, depth, logits, 0, &err))
        fail("prefill", &err);
    /* two warm-up steps: the first runs eagerly, the second is recorded */
    for (int i = 0; i < 2; i++)
        if (eval_one(c, ids + depth + i, logits, argmax, &err))
            fail("decode", &err);
    double t0 = now();
    for (int i = 0; i < gen; i++)
        if (eval_one(c, ids + depth + 2 + i, logits, argmax, &err))
            fail("decode", &err);
    double r = gen / (now() - t0);
    lmx_context_free(c);
    free(ids);
    return r;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: gpu_bench DIR [--chunk N] [--gen N] [--gpus N] [--quant q8|q4] [--decode-only [--depth N[,N...]]] [--argmax]\n");
        return 2;
    }
    int chunk = 512, gen = 64, profile = 0, gpus = 0, quant = 0, argmax = 0;
    const char *depths = "0";
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--decode-only")) /* decode only, at --depth: variants, profilers */
            profile = 1;
        else if (!strcmp(argv[i], "--argmax")) /* decode steps give only the greedy id */
            argmax = 1;
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc)
            chunk = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gen") && i + 1 < argc)
            gen = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--depth") && i + 1 < argc)
            depths = argv[++i];
        else if (!strcmp(argv[i], "--gpus") && i + 1 < argc) /* tensor parallel (docs/multi-gpu.md) */
            gpus = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quant") && i + 1 < argc) { /* quantized on load (docs/quantization.md) */
            const char *q = argv[++i];
            quant = atoi(q + (q[0] == 'q'));
        }
    }
    double bw = profile ? 0 : lmx_backend_cuda_copy_bandwidth(0);
    lmx_error err = {0};
    lmx_load_options o = lmx_load_defaults();
    o.device = LMX_DEVICE_CUDA;
    o.n_ctx = 4096 + 256;
    o.n_gpus = gpus;
    o.quant = quant;
    double t0 = now();
    lmx_model *m = lmx_load(argv[1], &o, &err);
    if (!m)
        fail("load", &err);
    double load_s = now() - t0;
    const lmx_config *c = &m->cfg;
    float *logits = malloc((size_t)c->vocab_size * sizeof(float));
    /* bytes a decode step reads (rank 0's with --gpus) */
    double wbytes = lmx_model_decode_weight_bytes(m, lmx_backend_cuda_bytes);
    double kv4096 = lmx_model_decode_kv_bytes(m, 4096, 2);
    if (profile) {
        for (const char *d = depths; d; d = strchr(d, ','), d = d ? d + 1 : NULL) /* one load, several depths */
            printf("decode at depth %d: %.1f tok/s\n", atoi(d), decode(m, atoi(d), gen, chunk, logits, argmax));
        lmx_close(m);
        return 0;
    }
    prefill(m, 64, chunk, logits); /* warm-up: module load, cuBLAS heuristics */
    double p512 = prefill(m, 512, chunk, logits), p4096 = prefill(m, 4096, chunk, logits);
    double d0 = decode(m, 0, gen, chunk, logits, argmax), d4096 = decode(m, 4096, gen, chunk, logits, argmax);
    double mm = matmul_rate(c, 4096, 1), mm_const = matmul_rate(c, 4096, 0), pf = p4096 * prefill_flops(c, 4096);
    printf("model %s: %s, %.2f GB weights as stored, %s, loaded in %.1f s; copy bandwidth %.0f GB/s (read + write)\n",
           argv[1], lmx_model_type(m), m->weight_bytes / 1e9, quant == 8 ? "q8" : quant == 4 ? "q4" : "unquantized",
           load_s, bw / 1e9);
    printf("| prefill 512 | prefill 4096 | decode ctx 0 | decode depth 4096 | decode GB/s ctx 0 (vs copy) | "
           "decode GB/s depth 4096 (vs copy) |\n");
    printf("| %.0f | %.0f | %.1f | %.1f | %.0f (%.0f%%) | %.0f (%.0f%%) |\n", p512, p4096, d0, d4096,
           d0 * wbytes / 1e9, 100 * d0 * wbytes / bw, d4096 * (wbytes + kv4096) / 1e9,
           100 * d4096 * (wbytes + kv4096) / bw);
    printf("prefill 4096: %.0f TFLOP/s, %.0f%% of cuBLAS bf16 on the layer shapes at 4096 rows, random data (%.0f "
           "TFLOP/s; %.0f%% of its %.0f TFLOP/s on constant data)\n",
           pf / 1e12, mm > 0 ? 100 * pf / mm : 0.0, mm / 1e12, mm_const > 0 ? 100 * pf / mm_const : 0.0,
           mm_const / 1e12);
    free(logits);
    lmx_close(m);
    return 0;
}
