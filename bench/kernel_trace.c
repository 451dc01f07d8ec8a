/* A kernel timeline without Nsight Systems (the GPU machine has none):
 * a CUPTI injection library that records every kernel and copy, graph
 * replays included, with GPU start and end times, into a CSV file.
 *
 *   CUDA_INJECTION64_PATH=build/libkernel_trace.so LMX_TRACE=trace.csv ./gpu_bench DIR
 *   bench/kernel_trace.py trace.csv
 *
 * With LMX_TRACE_HOST=1 only the host's runtime calls are recorded.
 *
 * Rows: kind (K kernel, M copy, R runtime call on the host), start ns, end
 * ns, graph id (0: not from a graph), grid blocks, threads a block, name (a
 * kernel's mangled name; a copy's direction and bytes; a call's name). */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *out;

static void CUPTIAPI buffer_wanted(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *size = (size_t)16 << 20;
    *buffer = aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, *size);
    *max_records = 0;
}

static const char *copy_kind(uint8_t k)
{
    switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    default: return "copy";
    }
}

static void CUPTIAPI buffer_done(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (out && cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
            fprintf(out, "K,%llu,%llu,%u,%d,%d,%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                    k->graphId, k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ, k->name);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)r;
            const char *name = NULL;
            if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS || !name)
                name = "?";
            fprintf(out, "R,%llu,%llu,0,0,0,%s\n", (unsigned long long)a->start, (unsigned long long)a->end, name);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            fprintf(out, "M,%llu,%llu,%u,0,0,%s %llu\n", (unsigned long long)m->start, (unsigned long long)m->end,
                    m->graphId, copy_kind(m->copyKind), (unsigned long long)m->bytes);
        }
    }
    free(buffer);
}

static void finish(void)
{
    cuptiActivityFlushAll(1);
    if (out)
        fclose(out);
    out = NULL;
}

/* Called by the CUDA driver at initialization (CUDA_INJECTION64_PATH). */
int InitializeInjection(void)
{
    const char *path = getenv("LMX_TRACE");
    out = fopen(path ? path : "kernel_trace.csv", "w");
    if (!out) {
        perror("kernel_trace: LMX_TRACE");
        return 0;
    }
    /* LMX_TRACE_HOST=1: the runtime calls alone (tracing a graph's kernels
     * slows its launch on the host) */
    const char *host = getenv("LMX_TRACE_HOST");
    int gpu = !(host && *host == '1');
    if (cuptiActivityRegisterCallbacks(buffer_wanted, buffer_done) != CUPTI_SUCCESS ||
        (gpu && cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) ||
        (gpu && cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS) ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI refused the activity trace\n");
        return 0;
    }
    atexit(finish);
    return 1;
}
