/* lmx bench: prefill and decode speed of a checkpoint on the CPU or a GPU,
 * against the memory bandwidth measured in the same run (decode reads
 * every weight once per token, so bandwidth is its limit): the CPU's by a
 * read probe, a GPU's by a device-to-device copy. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "backend_cpu.h"
#include "backend_cuda.h"
#include "commands.h"
#include "genopts.h"
#include "lmx.h"
#include "model.h"
#include "sysmem.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Memory bandwidth probe ---------------------------------------------------- */

typedef struct probe_part {
    const uint64_t *p;
    size_t n, ahead; /* ahead: prefetch distance in words, 0 = none */
    uint64_t sum;
    pthread_barrier_t *start;
} probe_part;

/* The thread's part read as four quarters side by side, with prefetches
 * `ahead`: decode's matvec reads its rows that way (cpu_kern_avx512.c), and
 * one sequential stream a thread read about 70% of it on this project's
 * machine (16 against 20-23 GB/s on two threads). */
static void *probe_read(void *arg)
{
    probe_part *a = arg;
    size_t q = a->n / 4 / 8 * 8;
    const uint64_t *p[4] = {a->p, a->p + q, a->p + 2 * q, a->p + 3 * q};
    uint64_t s[8] = {0};
    pthread_barrier_wait(a->start);
    for (size_t i = 0; i < q; i += 8)
        for (int j = 0; j < 4; j++) {
            if (a->ahead)
                __builtin_prefetch(p[j] + i + a->ahead);
            for (int k = 0; k < 8; k += 2) {
                s[2 * j] += p[j][i + k];
                s[2 * j + 1] += p[j][i + k + 1];
            }
        }
    for (int k = 0; k < 8; k++)
        a->sum += s[k];
    return NULL;
}

/* Best of 3 timed reads of a buffer 4x the last-level cache (at least
 * 1 GiB), split over `threads` threads, for each prefetch distance below;
 * bytes/s, or 0 on failure. The best distance differs between machines
 * (4 KB on the Intel machine, 1-2 KB on the AMD one, where 4 KB read less
 * than none; docs/cpu.md), and the probe is meant as the machine's best. */
static double probe_bandwidth(int threads, size_t *bytes_out)
{
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    size_t bytes = (size_t)1 << 30;
    if (llc > 0 && (size_t)llc * 4 > bytes)
        bytes = (size_t)llc * 4;
    *bytes_out = bytes;
    uint64_t *buf = malloc(bytes);
    if (!buf || threads < 1 || threads > 1024) {
        free(buf);
        return 0;
    }
    size_t n = bytes / sizeof *buf;
    for (size_t i = 0; i < n; i++)
        buf[i] = i;
    double best = 0;
    uint64_t sink = 0;
    probe_part *parts = calloc((size_t)threads, sizeof *parts);
    pthread_t *tids = calloc((size_t)threads, sizeof *tids);
    pthread_barrier_t start;
    static const size_t aheads[] = {0, 128, 256, 512}; /* words: none, 1, 2 and 4 KB */
    for (int rep = 0; parts && tids && rep < 3 * 4; rep++) {
        pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
        size_t per = n / (size_t)threads / 32 * 32; /* four quarters of whole 8-word steps */
        for (int t = 0; t < threads; t++) {
            parts[t] = (probe_part){buf + (size_t)t * per, per, aheads[rep % 4], 0, &start};
            pthread_create(&tids[t], NULL, probe_read, &parts[t]);
        }
        double t0 = now_s();
        pthread_barrier_wait(&start);
        for (int t = 0; t < threads; t++) {
            pthread_join(tids[t], NULL);
            sink += parts[t].sum;
        }
        double dt = now_s() - t0;
        pthread_barrier_destroy(&start);
        double bw = (double)(per * (size_t)threads * sizeof *buf) / dt;
        best = bw > best ? bw : best;
    }
    if (sink == 42) /* keeps the sums alive */
        best += 0;
    free(parts);
    free(tids);
    free(buf);
    return best;
}

static int usage(void)
{
    fprintf(stderr, "usage: lmx bench DIR [--device cpu|cuda|auto] [--prompt N] [--gen N] [--threads T]"
                    " [--quant none|q8|q4] [--kv f32|f16] [--mmap] [--prefill-bf16] [--json]\n");
    return 2;
}

int cmd_bench(int argc, char **argv)
{
    const char *dir = NULL;
    long prompt = 512, gen = 32, threads = 0;
    int json = 0;
    lmx_load_options o = lmx_load_defaults();
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--prompt")) {
            if (!(v = args_value(argc, argv, &i)) || args_int(v, 1, 1 << 20, "--prompt", &prompt))
                return 2;
        } else if (!strcmp(argv[i], "--gen")) {
            if (!(v = args_value(argc, argv, &i)) || args_int(v, 1, 1 << 20, "--gen", &gen))
                return 2;
        } else if (!strcmp(argv[i], "--threads")) {
            if (!(v = args_value(argc, argv, &i)) || args_int(v, 0, 1024, "--threads", &threads))
                return 2;
        } else if (!strcmp(argv[i], "--device")) {
            if (!(v = args_value(argc, argv, &i)) || genopts_device(v, &o.device))
                return 2;
        } else if (!strcmp(argv[i], "--quant")) {
            if (!(v = args_value(argc, argv, &i)) || genopts_quant(v, &o.quant))
                return 2;
        } else if (!strcmp(argv[i], "--kv")) {
            if (!(v = args_value(argc, argv, &i)) || genopts_kv(v, &o.kv_f16))
                return 2;
        } else if (!strcmp(argv[i], "--mmap")) {
            o.mmap_weights = 1;
        } else if (!strcmp(argv[i], "--prefill-bf16")) {
            o.prefill_bf16 = 1;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "lmx bench: unexpected argument '%s'\n", argv[i]);
            return usage();
        } else {
            dir = argv[i];
        }
    }
    if (!dir)
        return usage();

    o.n_threads = (int)threads;
    o.n_ctx = (int)(prompt + gen);
    lmx_error err = {0};
    double t0 = now_s();
    lmx_model *m = lmx_load(dir, &o, &err);
    if (!m) {
        fprintf(stderr, "lmx: %s\n", err.message);
        return 1;
    }
    double load_s = now_s() - t0;
    if (prompt + gen > lmx_model_max_context(m)) {
        fprintf(stderr, "lmx bench: --prompt + --gen = %ld exceeds the model's %d positions\n", prompt + gen,
                lmx_model_max_context(m));
        lmx_close(m);
        return 2;
    }
    int cuda = !strcmp(m->be->ops->name, "cuda");
    if (cuda && o.prefill_bf16) {
        fprintf(stderr, "lmx bench: --prefill-bf16 is a CPU option (on the GPU, products of bf16 weights "
                        "take bf16 activations in prefill already)\n");
        lmx_close(m);
        return 2;
    }
    int V = lmx_model_vocab_size(m), T = cuda ? 0 : lmx_backend_cpu_threads(m->be);
    lmx_context *c = lmx_context_new(m, (int)(prompt + gen), &err);
    int32_t *ids = malloc((size_t)prompt * sizeof *ids);
    if (!c || !ids) {
        fprintf(stderr, "lmx: %s\n", c ? "out of memory" : err.message);
        free(ids);
        lmx_context_free(c);
        lmx_close(m);
        return 1;
    }
    for (long i = 0; i < prompt; i++) /* fixed pseudo-random tokens */
        ids[i] = (int32_t)(((uint64_t)i * 2654435761u + 12345u) % (uint64_t)V);

    /* The first prefill of a context also faults in its KV cache and the
     * backend's scratch: timed on its own (cold), then the context is
     * emptied and the prompt prefilled again, as llama-bench's warm-up run
     * does before it measures. */
    t0 = now_s();
    int32_t next = 0; /* greedy decoding, as a stream at temperature 0 does it */
    int rc = lmx_context_eval_argmax(c, ids, (int)prompt, &next, &err) != LMX_OK;
    double cold_s = now_s() - t0;
    rc = rc || lmx_context_truncate(c, 0, &err) != LMX_OK;
    t0 = now_s();
    rc = rc || lmx_context_eval_argmax(c, ids, (int)prompt, &next, &err) != LMX_OK;
    double prefill_s = now_s() - t0;
    t0 = now_s();
    for (long g = 0; !rc && g < gen; g++) {
        int32_t fed = next;
        rc = lmx_context_eval_argmax(c, &fed, 1, &next, &err) != LMX_OK;
    }
    double decode_s = now_s() - t0;
    if (rc) {
        fprintf(stderr, "lmx: %s\n", err.message);
        free(ids);
        lmx_context_free(c);
        lmx_close(m);
        return 1;
    }
    unsigned long long rss = lmx_file_value("/proc/self/status", "VmRSS:", 1024),
                       peak = lmx_file_value("/proc/self/status", "VmHWM:", 1024);
    double wbytes = lmx_model_decode_weight_bytes(m, cuda ? lmx_backend_cuda_bytes : lmx_backend_cpu_bytes);
    double kvbytes = lmx_model_decode_kv_bytes(m, (int)(prompt + gen / 2), cuda || o.kv_f16 ? 2 : 4);
    double tok_bytes = wbytes + kvbytes;
    double pp = (double)prompt / prefill_s, tg = (double)gen / decode_s;
    size_t probe_bytes = 0;
    double bw = cuda ? lmx_backend_cuda_copy_bandwidth(0) : probe_bandwidth(T, &probe_bytes);
    double eff = tok_bytes * tg;
    const char *qname = o.quant == 8 ? "q8" : o.quant == 4 ? "q4" : "none";
    const char *kvname = cuda ? "bf16" : o.kv_f16 ? "f16" : "f32";
    /* the CPU's kernel path, where its weights live and its prefill's x; the GPU's */
    const char *path = cuda ? "cuda" : lmx_backend_cpu_path(m->be);
    const char *where = cuda ? "device" : lmx_backend_cpu_weights(m->be);
    const char *px = cuda ? "bf16" : lmx_backend_cpu_prefill_x(m->be);
    if (json) {
        printf("{\"model\": \"%s\", \"type\": \"%s\", \"device\": \"%s\", \"path\": \"%s\", \"threads\": %d, "
               "\"quant\": \"%s\", \"kv\": \"%s\", \"weights\": \"%s\", \"prefill_x\": \"%s\", \"prompt\": %ld, "
               "\"gen\": %ld, \"load_s\": %.3f, "
               "\"prefill_tok_s\": %.2f, \"ttft_s\": %.4f, \"cold_prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, "
               "\"rss_bytes\": %llu, \"peak_rss_bytes\": %llu, \"weight_bytes_per_token\": %.0f, "
               "\"kv_bytes_per_token\": %.0f, \"bandwidth_bytes_s\": %.0f, \"decode_bytes_s\": %.0f, "
               "\"decode_bandwidth_ratio\": %.3f}\n",
               dir, lmx_model_type(m), cuda ? "cuda" : "cpu", path, T, qname, kvname, where, px, prompt, gen, load_s,
               pp, prefill_s, (double)prompt / cold_s, tg, rss, peak, wbytes, kvbytes, bw, eff,
               bw > 0 ? eff / bw : 0);
    } else {
        if (cuda)
            printf("model:              %s (%s), cuda (GPU 0), quant %s, kv %s, prefill x %s\n", dir,
                   lmx_model_type(m), qname, kvname, px);
        else
            printf("model:              %s (%s), %s path, %d threads, quant %s, kv %s, weights %s, prefill x %s\n",
                   dir, lmx_model_type(m), path, T, qname, kvname, where, px);
        printf("load:               %.2f s\n", load_s);
        printf("prefill:            %ld tokens in %.3f s = %.1f tok/s (time to first token %.3f s)\n", prompt,
               prefill_s, pp, prefill_s);
        printf("first prefill:      %.3f s = %.1f tok/s (a fresh context: its KV cache faulted in)\n", cold_s,
               (double)prompt / cold_s);
        printf("decode:             %ld tokens in %.3f s = %.2f tok/s\n", gen, decode_s, tg);
        printf("resident memory:    %.1f MB (peak %.1f MB)%s\n", rss / 1048576.0, peak / 1048576.0,
               cuda ? " on the host" : "");
        printf("bytes per token:    %.1f MB weights + %.1f MB KV cache\n", wbytes / 1e6, kvbytes / 1e6);
        if (cuda)
            printf("memory bandwidth:   %.1f GB/s (device-to-device copy of 2 GiB, bytes read + written)\n", bw / 1e9);
        else
            printf("memory bandwidth:   %.1f GB/s (%d threads reading %.0f MB)\n", bw / 1e9, T, probe_bytes / 1e6);
        printf("decode bandwidth:   %.1f GB/s = %.0f%% of measured\n", eff / 1e9, bw > 0 ? 100 * eff / bw : 0);
    }
    free(ids);
    lmx_context_free(c);
    lmx_close(m);
    return 0;
}
