/* The CUDA backend: every op of backend.h on one stream of one device.
 *
 * Weights keep their stored dtype (bf16/f16/f32); activations are float32,
 * the KV cache bf16 (alloc_cache). Matmuls of up to GEMV_ROWS rows (decode)
 * run a bandwidth-bound kernel that streams the weights once with 16-byte
 * loads and accumulates in float32; larger ones (prefill) go to cuBLAS: bf16
 * weights on tensor cores (activations rounded to bf16, float32
 * accumulation), f32 weights in plain float32.
 *
 * Steps (backend.h step_begin/step_end): a one-token step is run eagerly
 * the first time its (key, flags) is seen, captured as a CUDA graph the
 * second time and replayed after that (launched by step_begin); positions
 * and token ids live in device memory, so the recorded kernels read them
 * at replay. */
#include <cublas_v2.h>
#ifdef LMX_HAVE_NCCL
#include <nccl.h>
#endif
#include <cuda.h> /* CUtensorMap; its encoder comes from the driver at run time (no -lcuda) */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" {
#include "argmax.h"
#include "backend_cuda.h"
#include "cpu_kernels.h"
#include "cpu_path.h"
#include "quant.h"
#include "threadpool.h"
}

struct lmx_tensor {
    int rows, cols;
    lmx_dtype dtype; /* float32 for activations; the stored dtype for weights */
    void *data;      /* device memory, owned */
    int bits, group; /* q8/q4 weights: 8 or 4, and the group (0: float) */
    __half2 *sb; /* q8/q4: (scale, bias) pairs, rows x cols / group, inside data's allocation */
    /* An activation whose float32 values were not written: it exists as
     * the bf16 copy of the products' input (xbf) only, until an op needs
     * the floats (need_f32) or the copy is replaced (then reading it is an
     * error). Set by prefill ops whose output only products read: the
     * gated activation (matmuls), residual_norm (for_products), flash
     * attention (f32_unless_copy). */
    mutable bool f32_stale;
    /* > 0: the first bf16_rows rows are held in bf16, packed at data (a
     * prefill's q, k and v as their products wrote them, read so by
     * qk_prepare and flash attention); any other reader widens them in
     * place first (need_f32). */
    mutable int bf16_rows;
    bool float_matrix; /* a weight matrix neither bf16 nor q8/q4 (cuda_backend.float_matrices) */
};

namespace {

#include "cuda_common.cuh"

/* WBF_ELEMS: prefill with q8/q4 weights dequantizes this many elements at
 * a time (64 MB of bf16). */
enum { WBF_ELEMS = 32 << 20 };
enum { GEMV_ROWS = 8, MAX_IDS = 4096, MAX_GRAPHS = 16, MAX_ROPES = 8 };
/* h_step/d_step: the step's draw, 8-byte aligned, after the ids */
enum { STEP_DRAW = MAX_IDS + 2, STEP_INTS = STEP_DRAW + sizeof(lmx_draw) / sizeof(int) };
enum step_mode { NO_STEP, EAGER, CAPTURE, REPLAY };

struct graph_entry {
    const void *key;
    int flags;
    int seen;               /* steps run with this key */
    cudaGraphExec_t exec;   /* NULL until captured */
    unsigned long long sig; /* hash of the recorded op sequence */
    unsigned long long used;
};

struct rope_table {
    int head_dim;
    float theta, factor;
    float *inv; /* device, head_dim / 2 */
};

struct pending_read {
    char *dst;
    size_t stride;          /* bytes from one row of dst to the next */
    size_t off, row, rows;  /* in the pinned staging buffer: rows of row bytes at off */
    float *best;            /* not NULL: read_argmax's, ARGMAX_BLOCKS entries to merge into best, col */
    int32_t *col;
};

/* A decode step's qk_prepare, waiting to be folded into the attention
 * that reads q (k_attn_dec's qk_fuse); q and k stay raw until then. */
struct pending_qk {
    lmx_tensor *q, *k, *kc, *vc;
    const lmx_tensor *v, *q_norm, *k_norm;
    const float *inv; /* RoPE's inverse frequencies on the device */
    int n_rows, head_dim, pos0, plus_one;
    float eps;
    bool packed; /* q, k and v in bf16 (bf16_rows), q written back so */
};

struct cuda_backend {
    lmx_backend base;
    int device;
    int sms;           /* multiprocessors */
    int dec_blocks[3]; /* k_attn_dec<64, 128, 256> blocks a multiprocessor holds (either instance) */
    int attn_carveout; /* percent of shared memory that holds a k_attn_dec<256> block (launch_carved) */
    cudaStream_t stream;
    cublasHandle_t blas;
    pthread_mutex_t lock; /* held from step_begin to step_end */

    /* First failure since the last step_end (sticky until reported). */
    lmx_status status;
    char msg[400];

    /* step state: position and ids in device memory, uploaded from pinned */
    int *h_step, *d_step; /* [0] = pos0, [1..] = ids; at STEP_DRAW the step's lmx_draw */
    lmx_scored *d_best;   /* read_argmax's and read_topk's per-block results, read_draw's token */
    double *d_bsum;       /* read_draw's block weights */
    float *d_bmax;        /* read_draw's block maxima, then the row's */
    size_t bsum_cap, bmax_cap;
    enum step_mode mode;
    int step_rows, step_pos0;
    graph_entry *cur;
    unsigned long long sig;
    graph_entry graphs[MAX_GRAPHS];
    unsigned long long clock;

    /* reads of one-token steps go through pinned staging, copied out in step_end */
    char *staging;
    size_t staging_cap, staging_used;
    pending_read *reads;
    int n_reads, reads_cap;

    int quant;     /* weight matrices quantized on upload: 0, 8 or 4 */
    lmx_pool *pool; /* host threads that quantize (while loading only) */
    /* the quantizer of this CPU's kernel path (the portable one if no path
     * suits, e.g. under LMX_CPU_PATH); every path gives the same bytes */
    void (*quant_rows)(const lmx_cpu_weight *src, const lmx_cpu_weight *dst, int r0, int r1);

    /* scratch, grown outside graph capture only */
    __nv_bfloat16 *xbf, *wbf; /* prefill: x in bf16; q8/q4 weights dequantized, or bf16 rows to widen */
    size_t xbf_cap, wbf_cap;
    const lmx_tensor *xbf_of; /* the activation whose first xbf_rows rows xbf holds; NULL: none */
    int xbf_rows;
    int8_t *xq; /* q8/q4 GEMV: x quantized (k_quant_x), then its steps and sums */
    size_t xq_cap;
    float2 *xqd;
    size_t xqd_cap;
    /* q8/q4 decode: the quantized copy of an op's output (quant_copy) */
    int8_t *hq;
    size_t hq_cap;
    float2 *hqd;
    size_t hqd_cap;
    const lmx_tensor *hq_of; /* the output it copies; NULL: none */
    int hq_rows;
    xquant hq_q;
    float *part;
    size_t part_cap;
    const void **gemm_ptrs; /* batched products: the weights', x's and outputs' addresses */
    size_t gemm_ptrs_cap;

    int simt_attn; /* LMX_CUDA_ATTN=simt: prefill attention without tensor cores */
    int wg_attn;   /* head_dim 128 prefill on warpgroup MMA (k_attn_wg): an sm_90a build on a
                      compute capability 9.0 device, unless LMX_CUDA_ATTN=mma */
    void *encode_map; /* the driver's cuTensorMapEncodeTiled, for k_attn_wg's copies */
#ifdef LMX_HAVE_NCCL
    ncclComm_t comm; /* tensor parallelism: this rank's communicator (NULL: alone) */
#endif
    rope_table ropes[MAX_ROPES];
    int n_ropes;
    pending_qk qk;
    bool qk_pending;
    /* weight matrices held that are neither bf16 nor q8/q4: while there
     * are any, some products read float32 activations, so prefill keeps
     * every output in float32 */
    int float_matrices;
};

cuda_backend *cu(lmx_backend *be) { return (cuda_backend *)be; }

/* Records the first failure; later ones are consequences. */
void fail(cuda_backend *b, lmx_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void fail(cuda_backend *b, lmx_status code, const char *fmt, ...)
{
    if (b->status)
        return;
    b->status = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
}

bool ok(cuda_backend *b, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return true;
    fail(b, e == cudaErrorMemoryAllocation ? LMX_ERR_NOMEM : LMX_ERR_INTERNAL, "cuda: %s: %s", what,
         cudaGetErrorString(e));
    return false;
}

/* After a launch: configuration errors show up here. */
void launched(cuda_backend *b, const char *what) { ok(b, cudaGetLastError(), what); }

bool blas_ok(cuda_backend *b, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return true;
    fail(b, LMX_ERR_INTERNAL, "cublas: %s: %s", what, cublasGetStatusString(s));
    return false;
}

enum { OP_EMBED = 1, OP_RMSNORM, OP_MATMUL, OP_QK, OP_ATTN, OP_MLP, OP_RESIDUAL, OP_CAP, OP_COPY, OP_READ, OP_REDUCE,
       OP_ARGMAX, OP_TOPK, OP_DRAW };

void flush_qk(cuda_backend *b);

/* Replayed ops do nothing but fold their arguments into the step's
 * signature, which must match the recording. Every op but attention first
 * runs a waiting qk_prepare (flush_qk). */
bool skip_op(cuda_backend *b, int op, const void *p0, const void *p1, const void *p2, long a, long c)
{
    if (op != OP_ATTN)
        flush_qk(b);
    if (b->mode == NO_STEP)
        return false;
    unsigned long long v[6] = {(unsigned long long)op, (unsigned long long)(uintptr_t)p0,
                               (unsigned long long)(uintptr_t)p1, (unsigned long long)(uintptr_t)p2,
                               (unsigned long long)a, (unsigned long long)c};
    for (int i = 0; i < 6; i++)
        b->sig = (b->sig ^ v[i]) * 0x100000001b3ull;
    return b->mode == REPLAY;
}

/* Position base for a kernel: from device memory inside a step (so that a
 * recording replays at any position), else the argument. */
const int *step_pos(cuda_backend *b, int pos0)
{
    if (b->mode == NO_STEP)
        return NULL;
    if (pos0 != b->step_pos0)
        fail(b, LMX_ERR_INTERNAL, "cuda: an op at position %d inside a step at %d", pos0, b->step_pos0);
    return b->d_step;
}

/* Recordings hold raw pointers: after a buffer moves or a tensor is freed
 * every step runs eagerly once more before it is recorded again. */
void drop_graphs(cuda_backend *b)
{
    for (int i = 0; i < MAX_GRAPHS; i++) {
        graph_entry *g = &b->graphs[i];
        if (g->exec)
            cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
        g->seen = 0;
    }
}

/* Grows a device scratch buffer; never during capture (eager runs of the
 * same step come first and size it). */
template <typename T> bool grow(cuda_backend *b, T **buf, size_t *cap, size_t n, const char *what)
{
    if (n <= *cap)
        return true;
    if (b->mode == CAPTURE) {
        fail(b, LMX_ERR_INTERNAL, "cuda: %s scratch too small during graph capture", what);
        return false;
    }
    if (!ok(b, cudaStreamSynchronize(b->stream), what))
        return false;
    drop_graphs(b);
    cudaFree(*buf);
    *buf = NULL;
    *cap = 0;
    if (!ok(b, cudaMalloc((void **)buf, n * sizeof(T)), what))
        return false;
    *cap = n;
    return true;
}

/* Every kernel is launched with programmatic dependent launch allowed
 * (pdl_wait in cuda_common.cuh); with carveout >= 0, that percent of the
 * multiprocessor's shared memory preferred over L1 for this launch. */
template <typename... KArgs, typename... Args>
void launch_carved(cuda_backend *b, int carveout, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t shm,
                   Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = shm;
    cfg.stream = b->stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    attr[1].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attr[1].val.sharedMemCarveout = (unsigned)carveout;
    cfg.attrs = attr;
    cfg.numAttrs = carveout >= 0 ? 2 : 1;
    ok(b, cudaLaunchKernelEx(&cfg, kernel, (KArgs)args...), "launch");
}

template <typename... KArgs, typename... Args>
void launch(cuda_backend *b, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t shm, Args... args)
{
    launch_carved(b, -1, kernel, grid, block, shm, args...);
}

/* Kernels ------------------------------------------------------------------ */

#include "cuda_pointwise.cuh"
#include "cuda_draw.cuh"
#include "cuda_gemv.cuh"
#include "cuda_attention.cuh"
#include "cuda_attention_wg.cuh"

/* Blocks for a grid-stride loop over n elements. */
unsigned blocks_for(size_t n, int threads)
{
    size_t b = (n + threads - 1) / threads;
    return b < 1 ? 1 : b > 65535 ? 65535 : (unsigned)b;
}

/* Tensors ------------------------------------------------------------------ */

/* Weight rows a host thread quantizes at a time. */
enum { QUANT_ROWS = 64 };

struct quant_job {
    const lmx_cpu_weight *src, *dst;
    void (*rows)(const lmx_cpu_weight *src, const lmx_cpu_weight *dst, int r0, int r1);
};

void quant_task(void *ctx, int task, int)
{
    const quant_job *j = (const quant_job *)ctx;
    int r0 = task * QUANT_ROWS, r1 = r0 + QUANT_ROWS < j->src->rows ? r0 + QUANT_ROWS : j->src->rows;
    j->rows(j->src, j->dst, r0, r1);
}

/* The q8/q4 form of rows x cols floats of dtype dt at src (row stride ld
 * elements) in one host buffer of *bytes: packed values, then each group's
 * (scale, bias) pair (docs/quantization.md's scales and biases, paired
 * so that a GEMV loads both at once). The CPU backend's quantizer, on the
 * backend's host threads, so that both backends hold the same values. */
void *quantize_host(cuda_backend *b, const char *src, lmx_dtype dt, int rows, int cols, int ld, int group)
{
    size_t es = lmx_dtype_size(dt), qbytes = (size_t)rows * lmx_quant_row_bytes(cols, b->quant);
    size_t ng = (size_t)rows * (size_t)(cols / group);
    char *dense = ld == cols ? (char *)src : (char *)malloc((size_t)rows * cols * es); /* a column slice */
    char *q = (char *)malloc(lmx_quant_matrix_bytes(rows, cols, b->quant, group));
    if (!b->pool) {
        b->pool = lmx_pool_new(0);
        lmx_cpu_path path;
        lmx_error ignored = {};
        const lmx_cpu_kernels *k = lmx_cpu_path_select(&path, &ignored) ? NULL : lmx_cpu_kernels_for(path);
        b->quant_rows = k ? k->quant_rows : lmx_quant_rows;
    }
    bool ok = dense && q && b->pool;
    if (ok && dense != src)
        ok = cudaMemcpy2D(dense, (size_t)cols * es, src, (size_t)ld * es, (size_t)cols * es, (size_t)rows,
                          cudaMemcpyHostToHost) == cudaSuccess;
    if (ok) {
        lmx_wkind kind = dt == LMX_DT_BF16 ? LMX_WK_BF16 : dt == LMX_DT_F16 ? LMX_WK_F16 : LMX_WK_F32;
        lmx_cpu_weight from = {kind, rows, cols, dense, NULL, NULL, 0};
        lmx_cpu_weight to = {b->quant == 8 ? LMX_WK_Q8 : LMX_WK_Q4, rows, cols, q,
                             (const uint16_t *)(q + qbytes), (const uint16_t *)(q + qbytes) + ng, group};
        quant_job j = {&from, &to, b->quant_rows};
        lmx_pool_run(b->pool, (rows + QUANT_ROWS - 1) / QUANT_ROWS, quant_task, &j);
        uint16_t *sc = (uint16_t *)(q + qbytes), *pairs = (uint16_t *)malloc(2 * ng * sizeof *pairs);
        ok = pairs != NULL;
        for (size_t g = 0; ok && g < ng; g++) {
            pairs[2 * g] = sc[g];
            pairs[2 * g + 1] = sc[ng + g];
        }
        if (ok)
            memcpy(sc, pairs, 2 * ng * sizeof *pairs);
        free(pairs);
    }
    if (dense != src)
        free(dense);
    if (!ok) {
        free(q);
        return NULL;
    }
    return q;
}

/* Weights whose prefill products run on the tensor cores from xbf. */
bool takes_bf16(const lmx_tensor *w) { return w->bits || w->dtype == LMX_DT_BF16; }

/* CUDA's text for e; out of memory also says how much the GPU has free. */
static const char *error_text(cudaError_t e, char *buf, size_t size)
{
    if (e != cudaErrorMemoryAllocation)
        return cudaGetErrorString(e);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    snprintf(buf, size, "out of GPU memory (%zu of %zu MiB free)", free_b >> 20, total_b >> 20);
    return buf;
}

/* What to do when the weights do not fit the GPU. */
const char *fit_hint(const cuda_backend *b)
{
    return b->quant == 4   ? "run on the CPU (--device cpu)"
           : b->quant == 8 ? "quantize them to 4 bits (--quant q4) or run on the CPU (--device cpu)"
                           : "quantize them (--quant q8 or q4) or run on the CPU (--device cpu)";
}

/* Weight matrices of at least two rows whose rows split into groups are
 * quantized when the backend quantizes (as on the CPU); the rest upload as
 * stored, tables only looked up by rows included. The group (0: as
 * stored) and the bytes on the device of the slice s of t. */
size_t device_bytes(const cuda_backend *b, const lmx_st_tensor *t, const lmx_slice &s, int *group)
{
    *group = b->quant && t->ndim >= 2 && s.rows >= 2 ? lmx_quant_group(s.cols) : 0;
    return *group ? lmx_quant_matrix_bytes(s.rows, s.cols, b->quant, *group)
                  : (size_t)s.rows * (size_t)s.cols * lmx_dtype_size(t->dtype);
}

size_t cuda_weight_bytes(lmx_backend *be, const lmx_st_tensor *t, const lmx_slice *slice, int /* lookup */)
{
    int group;
    lmx_slice s;
    if (lmx_backend_slice(t, slice, &s, NULL)) /* it checks the view too */
        return 0; /* cuda_weight says what is wrong */
    return device_bytes(cu(be), t, s, &group);
}

/* The GPU's free and total memory; false: unknown (the allocations will
 * find out). */
bool gpu_memory(const cuda_backend *b, size_t *free_b, size_t *total_b)
{
    if (cudaSetDevice(b->device) == cudaSuccess && cudaMemGetInfo(free_b, total_b) == cudaSuccess)
        return true;
    cudaGetLastError();
    return false;
}

/* LMX_ERR_NOMEM when `bytes` of what (a subject and its verb) exceed the
 * GPU's free memory, with what to do. */
lmx_status fits_gpu(const cuda_backend *b, size_t bytes, const char *what, const char *hint, lmx_error *err)
{
    size_t free_b = 0, total_b = 0;
    if (!gpu_memory(b, &free_b, &total_b) || bytes <= free_b)
        return LMX_OK;
    return lmx_fail(err, LMX_ERR_NOMEM, "%s %.1f GB on GPU %d, which has %.1f of %.1f GB free: %s", what,
                    (double)bytes / 1e9, b->device, (double)free_b / 1e9, (double)total_b / 1e9, hint);
}

/* Each rank has a GPU of its own: its share counts. */
lmx_status cuda_check_room(lmx_backend *be, size_t bytes, size_t /* total */, lmx_error *err)
{
    return fits_gpu(cu(be), bytes, "the weights take", fit_hint(cu(be)), err);
}

/* The cache is bf16. */
lmx_status cuda_check_cache_room(lmx_backend *be, size_t share, size_t /* total */, int n_ctx, lmx_error *err)
{
    char what[64];
    snprintf(what, sizeof what, "the KV cache of %d positions takes", n_ctx);
    return fits_gpu(cu(be), share * sizeof(__nv_bfloat16), what, "use a shorter context (--ctx)", err);
}

lmx_tensor *cuda_weight(lmx_backend *be, const lmx_st_tensor *t, const lmx_slice *slice, int /* lookup */,
                        lmx_error *err)
{
    cuda_backend *b = cu(be);
    int rows, cols;
    lmx_slice s;
    if (lmx_backend_weight_view(t, &rows, &cols, err) || lmx_backend_slice(t, slice, &s, err))
        return NULL;
    lmx_tensor *w = (lmx_tensor *)calloc(1, sizeof *w);
    if (!w) {
        lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
        return NULL;
    }
    *w = lmx_tensor{s.rows, s.cols, t->dtype, NULL, 0, 0, NULL, false, 0, false};
    int group;
    size_t es = lmx_dtype_size(t->dtype), row = (size_t)s.cols * es, bytes = device_bytes(b, t, s, &group);
    const char *src = (const char *)t->data + ((size_t)s.row0 * cols + s.col0) * es;
    void *q = group ? quantize_host(b, src, t->dtype, s.rows, s.cols, cols, group) : NULL;
    cudaError_t e = group && !q ? cudaErrorMemoryAllocation : cudaSetDevice(b->device);
    if (e == cudaSuccess)
        e = cudaMalloc(&w->data, bytes ? bytes : 1);
    if (e == cudaSuccess && q) {
        e = cudaMemcpy(w->data, q, bytes, cudaMemcpyHostToDevice);
        size_t qbytes = (size_t)s.rows * lmx_quant_row_bytes(s.cols, b->quant);
        w->bits = b->quant;
        w->group = group;
        w->sb = (__half2 *)((char *)w->data + qbytes);
    } else if (e == cudaSuccess && bytes) { /* only the slice is read; on the backend's stream, before every kernel */
        e = cudaMemcpy2DAsync(w->data, row, src, (size_t)cols * es, row, (size_t)s.rows, cudaMemcpyHostToDevice,
                              b->stream);
    }
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(b->stream);
    free(q);
    if (e != cudaSuccess) {
        cudaFree(w->data);
        free(w);
        char why[64];
        bool full = e == cudaErrorMemoryAllocation;
        lmx_fail(err, full ? LMX_ERR_NOMEM : LMX_ERR_INTERNAL,
                 "%s: cannot upload tensor '%s' (%zu bytes) to GPU %d: %s%s%s", t->file, t->name, bytes,
                 b->device, error_text(e, why, sizeof why), full ? "; the weights do not fit: " : "",
                 full ? fit_hint(b) : "");
        return NULL;
    }
    w->float_matrix = s.rows >= 2 && !takes_bf16(w);
    b->float_matrices += w->float_matrix;
    return w;
}

/* A weight as the kernels take it. */
wview view(const lmx_tensor *t) { return wview{t->data, t->sb, (int)t->dtype, t->bits, t->group, t->cols}; }

/* A zeroed [rows, cols] tensor of dtype dt (float32 or bf16). */
lmx_tensor *alloc_zeroed(lmx_backend *be, int rows, int cols, lmx_dtype dt, const char *what, lmx_error *err)
{
    lmx_tensor *t = (lmx_tensor *)calloc(1, sizeof *t);
    size_t bytes = (size_t)rows * (size_t)cols * lmx_dtype_size(dt);
    cudaError_t e = t ? cudaSetDevice(cu(be)->device) : cudaErrorMemoryAllocation;
    if (e == cudaSuccess)
        e = cudaMalloc(&t->data, bytes ? bytes : 1);
    if (e == cudaSuccess)
        e = cudaMemsetAsync(t->data, 0, bytes, cu(be)->stream);
    if (e != cudaSuccess) {
        if (t)
            cudaFree(t->data);
        free(t);
        char why[64];
        lmx_fail(err, e == cudaErrorMemoryAllocation ? LMX_ERR_NOMEM : LMX_ERR_INTERNAL,
                 "cuda: cannot allocate a %d x %d %s tensor: %s", rows, cols, what, error_text(e, why, sizeof why));
        return NULL;
    }
    t->rows = rows;
    t->cols = cols;
    t->dtype = dt;
    return t;
}

lmx_tensor *cuda_alloc(lmx_backend *be, int rows, int cols, lmx_error *err)
{
    return alloc_zeroed(be, rows, cols, LMX_DT_F32, "activation", err);
}

/* The KV cache in bf16: half the bytes attention reads (docs/cuda.md). */
lmx_tensor *cuda_alloc_cache(lmx_backend *be, int rows, int cols, lmx_error *err)
{
    return alloc_zeroed(be, rows, cols, LMX_DT_BF16, "KV cache", err);
}

/* t changes (or goes): the copies of it that ops keep (a norm's quantized
 * output, xbf) no longer hold, and its float32 values are the op's. */
void wrote(cuda_backend *b, lmx_tensor *t)
{
    t->f32_stale = false;
    t->bf16_rows = 0;
    if (t == b->hq_of)
        b->hq_of = NULL;
    if (t == b->xbf_of)
        b->xbf_of = NULL;
}

void cuda_free(lmx_backend *be, lmx_tensor *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&cu(be)->lock);
    flush_qk(cu(be));
    drop_graphs(cu(be));
    wrote(cu(be), t); /* a later tensor may get its address */
    cu(be)->float_matrices -= t->float_matrix;
    pthread_mutex_unlock(&cu(be)->lock);
    cudaSetDevice(cu(be)->device);
    cudaFree(t->data);
    free(t);
}

float *f32(const lmx_tensor *t) { return (float *)t->data; }

/* Ops ---------------------------------------------------------------------- */

/* With q8/q4 weights, an op whose output a GEMV reads next (decode rows:
 * the norms, attention) also writes it quantized, so that x's
 * quantization needs no launch of its own; whole_groups: its kernel sees
 * every quantization group of a row whole. q.xq NULL: not this time. Any
 * other write of that output drops the copy (wrote). */
xquant quant_copy(cuda_backend *b, const lmx_tensor *out, int n_rows, int whole_groups)
{
    xquant q = {};
    b->hq_of = NULL;
    int G = lmx_quant_group(out->cols);
    if (!b->quant || !whole_groups || n_rows > GEMV_ROWS || !G)
        return q;
    size_t ng = (size_t)n_rows * (out->cols / G);
    if (!grow(b, &b->hq, &b->hq_cap, (size_t)n_rows * out->cols, "quantized op output") ||
        !grow(b, &b->hqd, &b->hqd_cap, ng, "quantized op output steps"))
        return q;
    q = xquant{b->hq, b->hqd, G, b->quant == 4};
    b->hq_of = out;
    b->hq_rows = n_rows;
    b->hq_q = q;
    return q;
}

/* Prefill: an op writing n_rows of t also writes them in bf16 to xbf, the
 * tensor-core products' input, so that a product reading t next converts
 * nothing. NULL: not this time (decode rows, or no room). Touches only
 * xbf's record (quant_copy keeps the quantized one). */
__nv_bfloat16 *bf16_copy(cuda_backend *b, const lmx_tensor *t, int n_rows)
{
    if (b->xbf_of == t)
        b->xbf_of = NULL;
    if (n_rows <= GEMV_ROWS || !grow(b, &b->xbf, &b->xbf_cap, (size_t)n_rows * t->cols, "bf16 activations"))
        return NULL;
    b->xbf_of = t;
    b->xbf_rows = n_rows;
    return b->xbf;
}

/* Where a prefill op writes t's floats: nowhere when it writes the bf16
 * copy ob that the tensor-core products read (t is then stale: need_f32
 * restores the floats from the copy for an op that wants them). */
float *f32_unless_copy(cuda_backend *b, lmx_tensor *t, const __nv_bfloat16 *ob)
{
    if (!ob || b->float_matrices)
        return f32(t);
    t->f32_stale = true;
    return NULL;
}

/* t's float32 values for an op that reads them: a stale tensor (see
 * lmx_tensor) gets them back from its bf16 copy; false (a failure) when
 * that copy is gone. */
bool need_f32(cuda_backend *b, const lmx_tensor *t)
{
    if (t->bf16_rows) { /* widened in place through a copy of the bf16 */
        size_t n = (size_t)t->bf16_rows * t->cols;
        if (!grow(b, &b->wbf, &b->wbf_cap, n, "bf16 widening"))
            return false;
        ok(b, cudaMemcpyAsync(b->wbf, t->data, n * 2, cudaMemcpyDeviceToDevice, b->stream), "bf16 widening");
        launch(b, k_from_bf16, blocks_for(n / 4 + 1, 256), 256, 0, (float *)t->data, (const __nv_bfloat16 *)b->wbf,
               n);
        launched(b, "from bf16");
        t->bf16_rows = 0;
    }
    if (!t->f32_stale)
        return true;
    if (b->xbf_of != t) {
        fail(b, LMX_ERR_INTERNAL, "cuda: an activation kept only in bf16 was read after its copy was replaced");
        return false;
    }
    size_t n = (size_t)b->xbf_rows * t->cols;
    launch(b, k_from_bf16, blocks_for(n / 4 + 1, 256), 256, 0, (float *)t->data, (const __nv_bfloat16 *)b->xbf, n);
    launched(b, "from bf16");
    t->f32_stale = false;
    return true;
}

void cuda_embed(lmx_backend *be, lmx_tensor *out, const lmx_tensor *table, const int32_t *ids, int n_rows,
                float scale, int first_id)
{
    cuda_backend *b = cu(be);
    if (skip_op(b, OP_EMBED, out, table, NULL, n_rows, (long)(scale * 1e6f) + first_id))
        return;
    wrote(b, out);
    const int *d_ids = b->d_step + 1;
    if (b->mode == NO_STEP) { /* ids come with the step otherwise */
        if (n_rows > MAX_IDS) {
            fail(b, LMX_ERR_INTERNAL, "cuda: embed of %d rows (at most %d)", n_rows, MAX_IDS);
            return;
        }
        if (!ok(b, cudaMemcpyAsync(b->d_step + 1, ids, (size_t)n_rows * sizeof *ids, cudaMemcpyHostToDevice, b->stream),
                "embed ids"))
            return;
    }
    dim3 grid(blocks_for((size_t)out->cols, 256) < 64 ? blocks_for((size_t)out->cols, 256) : 64, n_rows);
    launch(b, k_embed, grid, 256, 0, f32(out), view(table), table->rows, d_ids, first_id, scale);
    launched(b, "embed");
}

/* Threads of a norm block for rows of dim, each holding V float4s of the
 * row; *vi: V's index among the instances (V = 1 up to 4096 elements, 2 up
 * to 8192, 8 up to 32768); 0 (a failure) beyond. */
int norm_threads(cuda_backend *b, int dim, int *vi)
{
    int chunks = (dim + 3) / 4, threads = chunks < 1024 ? (chunks + 31) / 32 * 32 : 1024;
    int v = (chunks + threads - 1) / threads;
    *vi = v <= 1 ? 0 : v <= 2 ? 1 : 2;
    if (v <= 8)
        return threads;
    fail(b, LMX_ERR_UNSUPPORTED, "cuda: a norm over %d elements (at most 32768)", dim);
    return 0;
}

/* Whether a norm kernel may take its lean instance (A): rows a multiple of
 * 4 long and norm weights in bf16, 8-byte aligned (w NULL: no such norm). */
bool norm_lean(int dim, const lmx_tensor *w)
{
    return dim % 4 == 0 && (!w || (w->dtype == LMX_DT_BF16 && (uintptr_t)w->data % 8 == 0));
}

/* A norm kernel's instances by [V's index][lean]. */
#define NORM_INSTANCES(k)                                                                                              \
    {                                                                                                                  \
        {k<1, false>, k<1, true>}, {k<2, false>, k<2, true>}, { k<8, false>, k<8, true> }                              \
    }

void cuda_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int n_rows, float eps,
                  int plus_one)
{
    cuda_backend *b = cu(be);
    if (skip_op(b, OP_RMSNORM, out, x, w, n_rows, plus_one) || !need_f32(b, x))
        return;
    wrote(b, out);
    int dim = w->cols;
    size_t n_vec = (size_t)n_rows * (size_t)x->cols / (size_t)dim;
    if (!n_vec)
        return;
    int vi, threads = norm_threads(b, dim, &vi);
    if (!threads)
        return;
    __nv_bfloat16 *ob = bf16_copy(b, out, n_rows);
    xquant q = quant_copy(b, out, n_rows, dim == x->cols);
    static decltype(&k_rmsnorm<1, false>) const k[3][2] = NORM_INSTANCES(k_rmsnorm);
    launch(b, k[vi][norm_lean(dim, w)], (unsigned)n_vec, threads, 0, f32(out), ob, f32(x), w->data, w->dtype, dim,
           eps, plus_one, q);
    launched(b, "rmsnorm");
}

template <typename F, bool GATED, int U, int WPR, int RPS>
void gemv_wpr(cuda_backend *b, const gemv_set &s, const xin &x, int nr, int gelu, int slots)
{
    unsigned grid = (unsigned)((slots * WPR + GEMV_WARPS - 1) / GEMV_WARPS);
    int th = GEMV_WARPS * 32;
    /* Several plain products at once are q/k/v, which decode attention
     * follows: room for its blocks beside this launch's lets them start
     * before it ends (attn_carveout). */
    int cv = !GATED && s.n > 1 ? b->attn_carveout : -1;
    if (RPS > 1 || nr <= 1) /* slots of several rows take one row of x (gemv_launch) */
        launch_carved(b, cv, k_gemv<F, 1, GATED, U, WPR, RPS>, grid, th, 0, s, x, nr, gelu);
    else if constexpr (RPS == 1) { /* no kernels for rows of x that never meet such slots */
        if (nr <= 2)
            launch_carved(b, cv, k_gemv<F, 2, GATED, U, WPR, RPS>, grid, th, 0, s, x, nr, gelu);
        else if (nr <= 4)
            launch_carved(b, cv, k_gemv<F, 4, GATED, U, WPR, RPS>, grid, th, 0, s, x, nr, gelu);
        else
            launch_carved(b, cv, k_gemv<F, 8, GATED, U, WPR, RPS>, grid, th, 0, s, x, nr, gelu);
    }
}

/* Blocks of a GEMV kernel (one row of x) that the GPU holds at once: a
 * launch of more runs in waves, and a last wave of a few blocks leaves
 * most multiprocessors without loads in flight. */
template <typename F, bool GATED, int U, int WPR, int RPS> int gemv_wave(cuda_backend *b)
{
    static const int per_sm = [] { /* the kernel's registers decide it: once (one GPU architecture a process) */
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv<F, 1, GATED, U, WPR, RPS>, GEMV_WARPS * 32, 0) !=
            cudaSuccess)
            n = 0;
        return n;
    }();
    return per_sm * b->sms;
}

/* Two warps a slot when one a slot would give fewer blocks than two a
 * multiprocessor (bench/gemv_bench.cu on the H200: Qwen3-0.6B's o and
 * down GEMVs 1.4-1.5x faster in bf16; larger matrices slower), unless, for
 * one row of x, the doubled blocks would no longer fit in one wave
 * (Gemma3-12B's q8/q4 q/k/v, bench/RESULTS.md session 29). */
template <typename F, bool GATED, int U, int RPS>
void gemv_slots(cuda_backend *b, const gemv_set &s, const xin &x, int nr, int gelu, int slots)
{
    int blocks = (slots + GEMV_WARPS - 1) / GEMV_WARPS;
    if (blocks < 2 * b->sms && (nr > 1 || 2 * blocks <= gemv_wave<F, GATED, U, 2, RPS>(b)))
        gemv_wpr<F, GATED, U, 2, RPS>(b, s, x, nr, gelu, slots);
    else
        gemv_wpr<F, GATED, U, 1, RPS>(b, s, x, nr, gelu, slots);
}

/* Loads in flight a row for slots of one row: one for q8/q4 gate and up
 * (two rows a slot already), whose integer loop gains from it. */
template <typename F, bool GATED> constexpr int one_row_u() { return GATED && F::QUANT ? 1 : GEMV_UNROLL; }

/* Loads in flight a row for slots of several rows: two for float weights
 * (session 29: Qwen3-8B bf16 decode +1.4%, Gemma3-12B +1.1%), one for
 * q8/q4. */
template <typename F> constexpr int several_rows_u() { return F::QUANT ? 1 : 2; }

/* Whether every matrix of the set has a multiple of rps rows. */
bool slot_rows_fit(const gemv_set &s, int rps)
{
    for (int i = 0; i < s.n; i++)
        if ((s.end[i] - (i ? s.end[i - 1] : 0)) % rps)
            return false;
    return true;
}

/* Weight rows a slot for one row of x: each piece of x a slot loads then
 * serves them all, and the slot's loads of their weights are in flight
 * together. 4 for mid-sized matrices, 2 for the output head, 1 below 2048
 * rows (too few warps) and for float matrices over 4096 rows, which one
 * row a slot reads near the copy bandwidth already (bench/gemv_bench.cu,
 * H100, bench/RESULTS.md session 28), unless one row a slot would spill
 * past one wave and two fit in one (Gemma3-12B's bf16 q/k/v, 8192 rows:
 * session 29). The size must divide every matrix's rows. */
template <typename F> int slot_rows(cuda_backend *b, const gemv_set &s)
{
    int rows = s.end[s.n - 1], rps = 1;
    if (rows >= 2048 && rows <= (F::QUANT ? 16384 : 4096))
        rps = 4;
    else if (rows > 16384)
        rps = 2;
    while (!slot_rows_fit(s, rps))
        rps /= 2;
    int blocks = (rows + GEMV_WARPS - 1) / GEMV_WARPS;
    if (rps == 1 && slot_rows_fit(s, 2) && blocks > gemv_wave<F, false, one_row_u<F, false>(), 1, 1>(b) &&
        (blocks + 1) / 2 <= gemv_wave<F, false, several_rows_u<F>(), 1, 2>(b))
        rps = 2;
    return rps;
}

/* The GEMV of a set, with the rows and loads a slot chosen above. */
template <typename F, bool GATED> void gemv_launch(cuda_backend *b, const gemv_set &s, const xin &x, int nr, int gelu)
{
    int rows = s.end[GATED ? 0 : s.n - 1];
    int rps = GATED || nr > 1 ? 1 : slot_rows<F>(b, s);
    if (rps == 4)
        gemv_slots<F, GATED, several_rows_u<F>(), 4>(b, s, x, nr, gelu, rows / 4);
    else if (rps == 2)
        gemv_slots<F, GATED, several_rows_u<F>(), 2>(b, s, x, nr, gelu, rows / 2);
    else
        gemv_slots<F, GATED, one_row_u<F, GATED>(), 1>(b, s, x, nr, gelu, rows);
}

template <typename F> void gemv_gated(cuda_backend *b, const gemv_set &s, const xin &x, int nr, bool gated, int gelu)
{
    if (gated)
        gemv_launch<F, true>(b, s, x, nr, gelu);
    else
        gemv_launch<F, false>(b, s, x, nr, gelu);
}

/* out (and ob) = act(gate) * up over n elements of T (float32 or bf16). */
template <typename T>
void gated_act(cuda_backend *b, float *out, __nv_bfloat16 *ob, const T *gate, const T *up, size_t n, int gelu)
{
    launch(b, k_gated_act<T>, blocks_for(n / 4 + 1, 256), 256, 0, out, ob, gate, up, n, gelu);
    launched(b, "gated activation");
}

/* The GEMV kernels' 16-byte chunks fit the rows of w. */
bool chunked(const lmx_tensor *w) { return w->bits || w->cols % (w->dtype == LMX_DT_F32 ? 4 : 8) == 0; }

bool same_format(const lmx_tensor *a, const lmx_tensor *c)
{
    return a->dtype == c->dtype && a->bits == c->bits && a->group == c->group;
}

/* One launch for weights of one format (chunked): x quantized first for
 * q8/q4. */
void gemv_one_format(cuda_backend *b, int n, lmx_tensor *const *outs, const lmx_tensor *xt,
                     const lmx_tensor *const *ws, size_t row0, int nr, bool gated, int gelu)
{
    const lmx_tensor *w = ws[0];
    int K = w->cols;
    const float *x = f32(xt) + row0 * K;
    gemv_set s = {};
    s.n = n;
    for (int i = 0; i < n; i++) {
        s.w[i] = ws[i]->data;
        s.sb[i] = ws[i]->sb;
        s.out[i] = f32(outs[i]) + row0 * outs[i]->cols;
        s.end[i] = (i ? s.end[i - 1] : 0) + ws[i]->rows;
    }
    xin xi = {x, NULL, NULL, K, w->group == 32 ? 5 : 6, w->group ? K / w->group : 0};
    if (w->bits) {
        xquant q = b->hq_q; /* the op that wrote x (a norm, attention) quantized it already */
        if (b->hq_of != xt || row0 || nr > b->hq_rows || w->group != q.G) {
            size_t ng = (size_t)nr * xi.ng;
            if (!grow(b, &b->xq, &b->xq_cap, (size_t)nr * K, "quantized x") ||
                !grow(b, &b->xqd, &b->xqd_cap, ng, "quantized x steps"))
                return;
            q = xquant{b->xq, b->xqd, w->group, w->bits == 4};
            launch(b, k_quant_x, blocks_for((size_t)nr * K / 4, 256), 256, 0, q, x, K, nr);
        }
        xi.xq = q.xq;
        xi.xds = q.xds;
        if (w->bits == 8)
            gemv_gated<fmt_quant<8>>(b, s, xi, nr, gated, gelu);
        else
            gemv_gated<fmt_quant<4>>(b, s, xi, nr, gated, gelu);
    } else if (w->dtype == LMX_DT_BF16) {
        gemv_gated<fmt_float<__nv_bfloat16>>(b, s, xi, nr, gated, gelu);
    } else if (w->dtype == LMX_DT_F16) {
        gemv_gated<fmt_float<__half>>(b, s, xi, nr, gated, gelu);
    } else {
        gemv_gated<fmt_float<float>>(b, s, xi, nr, gated, gelu);
    }
}

/* Up to GEMV_ROWS rows of x against the weights, bandwidth-bound: one launch
 * for all of them when they share a format. */
void gemv(cuda_backend *b, int n, lmx_tensor *const *outs, const lmx_tensor *xt, const lmx_tensor *const *ws,
          size_t row0, int nr, bool gated, int gelu)
{
    const float *x = f32(xt) + row0 * xt->cols;
    bool fused = chunked(ws[0]);
    for (int i = 1; i < n; i++)
        fused = fused && same_format(ws[i], ws[0]);
    if (fused) {
        gemv_one_format(b, n, outs, xt, ws, row0, nr, gated, gelu);
        launched(b, "matmul (gemv)");
        return;
    }
    for (int i = 0; i < n; i++) {
        if (chunked(ws[i])) {
            gemv_one_format(b, 1, outs + i, xt, ws + i, row0, nr, false, 0);
            continue;
        }
        dim3 grid((unsigned)((ws[i]->rows + GEMV_WARPS - 1) / GEMV_WARPS), nr);
        launch(b, k_gemv_any, grid, GEMV_WARPS * 32, 0, f32(outs[i]) + row0 * outs[i]->cols, x, ws[i]->data,
               ws[i]->dtype, ws[i]->rows, ws[i]->cols);
    }
    launched(b, "matmul (gemv)");
    if (gated) {
        float *g = f32(outs[0]) + row0 * outs[0]->cols;
        gated_act<float>(b, g, NULL, g, f32(outs[1]) + row0 * outs[1]->cols, (size_t)nr * ws[0]->rows, gelu);
    }
}

/* dst = xbf * w^T (of type ct, rows ldc apart) for bf16 weights w [N][K]. */
void gemm_bf16(cuda_backend *b, const void *w, int N, int n_rows, int K, void *dst, cudaDataType ct, int ldc)
{
    const float one = 1.0f, zero = 0.0f;
    /* column-major view: out^T [N, n] = W [K, N]^T . X^T [K, n] */
    blas_ok(b,
            cublasGemmEx(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n_rows, K, &one, w, CUDA_R_16BF, K, b->xbf,
                         CUDA_R_16BF, K, &zero, dst, ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "gemm bf16");
}

/* dst[i] = xbf * w[i]^T (of type ct) for n bf16 weights of N rows each,
 * one batched cuBLAS product: twice the tiles of one product in a launch
 * (Qwen3-0.6B's gate and up, k and v, whose single products fill few
 * waves). */
void batched_bf16(cuda_backend *b, int n, void *const *dst, cudaDataType ct, const void *const *w, int N, int n_rows,
                  int K)
{
    if (!grow(b, &b->gemm_ptrs, &b->gemm_ptrs_cap, 3 * LMX_MAX_MULTI, "product pointers"))
        return;
    ptr_set p = {};
    for (int i = 0; i < n; i++) {
        p.p[i] = w[i];
        p.p[LMX_MAX_MULTI + i] = b->xbf;
        p.p[2 * LMX_MAX_MULTI + i] = dst[i];
    }
    launch(b, k_set_ptrs, 1, 3 * LMX_MAX_MULTI, 0, b->gemm_ptrs, p);
    launched(b, "product pointers");
    const float one = 1.0f, zero = 0.0f;
    blas_ok(b,
            cublasGemmBatchedEx(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n_rows, K, &one, b->gemm_ptrs, CUDA_R_16BF, K,
                                b->gemm_ptrs + LMX_MAX_MULTI, CUDA_R_16BF, K, &zero,
                                (void *const *)(b->gemm_ptrs + 2 * LMX_MAX_MULTI), ct, N, n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
            "batched gemm bf16");
}

/* dst[i] = xbf * w[i]^T for n bf16 weights (ws: their shapes), neighbours
 * of one height in one batched product. */
void bf16_products(cuda_backend *b, int n, void *const *dst, cudaDataType ct, const void *const *w,
                   const lmx_tensor *const *ws, int n_rows, int K)
{
    for (int i = 0, same; i < n; i += same) {
        int N = ws[i]->rows;
        for (same = 1; i + same < n && ws[i + same]->rows == N;)
            same++;
        if (same > 1)
            batched_bf16(b, same, dst + i, ct, w + i, N, n_rows, K);
        else
            gemm_bf16(b, w[i], N, n_rows, K, dst[i], ct, N);
    }
}

/* Rows from[i] .. from[i] + rows[i] - 1 of n q8/q4 weights of width K into
 * b->wbf as bf16, stacked, in one launch (b->wbf holds them). */
void dequantize(cuda_backend *b, int n, const lmx_tensor *const *ws, const int *from, const int *rows, int K)
{
    wstack s;
    int end = 0;
    for (int i = 0; i < LMX_MAX_MULTI; i++) {
        s.w[i] = view(ws[i < n ? i : 0]);
        s.from[i] = i < n ? from[i] : 0;
        end += i < n ? rows[i] : 0;
        s.end[i] = i < n ? end : INT_MAX;
    }
    size_t elems = (size_t)end * K; /* at most WBF_ELEMS, or 256 rows */
    launch(b, k_dequant, dim3((unsigned)((elems / 16 + 255) / 256)), 256, 0, b->wbf, s, K, elems);
    launched(b, "dequantize");
}

/* How many of the n q8/q4 weights from ws[0] (one format) b->wbf takes
 * whole at once, WBF_ELEMS elements together; 0 when ws[0] alone is larger
 * (grown to what they need). */
int whole_run(cuda_backend *b, int n, const lmx_tensor *const *ws, int K)
{
    size_t elems = 0;
    int run = 0;
    while (run < n && same_format(ws[run], ws[0]) && elems + (size_t)ws[run]->rows * K <= WBF_ELEMS)
        elems += (size_t)ws[run++]->rows * K;
    return run && grow(b, &b->wbf, &b->wbf_cap, elems, "dequantized weights") ? run : 0;
}

/* A q8/q4 weight larger than b->wbf: about WBF_ELEMS elements of rows at a
 * time dequantized and multiplied, in multiples of 256 rows: an output
 * column offset that is not 16-byte aligned sends cuBLAS to an sm80 kernel
 * (Qwen3-8B's down product in steps of 2730 rows: 36% of a q8 prefill,
 * bench/RESULTS.md). */
void stepped_product(cuda_backend *b, const lmx_tensor *w, void *dst, cudaDataType ct, size_t es, int n_rows, int K)
{
    int N = w->rows, step = WBF_ELEMS / K / 256 * 256;
    step = step < 256 ? 256 : step;
    if (!grow(b, &b->wbf, &b->wbf_cap, (size_t)step * K, "dequantized weights"))
        return;
    for (int n0 = 0; n0 < N; n0 += step) {
        int nb = N - n0 < step ? N - n0 : step;
        dequantize(b, 1, &w, &n0, &nb, K);
        gemm_bf16(b, b->wbf, nb, n_rows, K, (char *)dst + n0 * es, ct, N);
    }
}

/* outs[i] = x * ws[i]^T; gated (n = 2): outs[0] = act(x * ws[0]^T) * (x * ws[1]^T),
 * outs[1] scratch. A gated prefill on the tensor cores is lean: the
 * products write gate and up in bf16 into up's memory (half the bytes of
 * float32, and twice fit there), and the activation writes only the bf16
 * copy the down product reads (outs[0] stale: lmx_tensor); on Qwen3-0.6B
 * that took the activation's traffic from 7 to 3 bytes an element.
 * Several products of one input (q, k and v) are packed likewise: written
 * in bf16 into their own tensors (bf16_rows), which qk_prepare and flash
 * attention read as they are. */
void matmuls(cuda_backend *b, int n, lmx_tensor *const *outs, const lmx_tensor *x, const lmx_tensor *const *ws,
             int n_rows, bool gated, int gelu)
{
    int K = x->cols;
    bool any_f16 = false, all_bf16 = true;
    for (int i = 0; i < n; i++) {
        if (ws[i]->cols != K || outs[i]->cols != ws[i]->rows || (gated && ws[i]->rows != ws[0]->rows)) {
            fail(b, LMX_ERR_INTERNAL, "cuda: matmul of [%d, %d] by [%d, %d]^T into %d columns", n_rows, K,
                 ws[i]->rows, ws[i]->cols, outs[i]->cols);
            return;
        }
        any_f16 = any_f16 || (ws[i]->dtype == LMX_DT_F16 && !ws[i]->bits);
        all_bf16 = all_bf16 && takes_bf16(ws[i]);
    }
    bool tensor_cores = n_rows > GEMV_ROWS && !any_f16;
    if (!(tensor_cores && all_bf16 && b->xbf_of == x && b->xbf_rows >= n_rows) && !need_f32(b, x))
        return;
    for (int i = 0; i < n; i++)
        wrote(b, outs[i]);
    if (!tensor_cores) {
        /* f16 weights: no tensor-core path (float16 activations could
         * overflow), so GEMV_ROWS rows at a time */
        for (int r = 0; r < n_rows; r += GEMV_ROWS)
            gemv(b, n, outs, x, ws, (size_t)r,
                 n_rows - r < GEMV_ROWS ? n_rows - r : GEMV_ROWS, gated, gelu);
        return;
    }
    if (!blas_ok(b, cublasSetStream(b->blas, b->stream), "set stream"))
        return;
    /* lean: gate and up in bf16 in up's memory; packed: products of one
     * input (q, k and v) in bf16, each in its own tensor (bf16_rows) */
    bool lean = gated && all_bf16, packed = !gated && n > 1 && all_bf16;
    cudaDataType ct = lean || packed ? CUDA_R_16BF : CUDA_R_32F;
    size_t es = lean || packed ? 2 : 4;
    void *dst[LMX_MAX_MULTI];
    for (int i = 0; i < n; i++)
        dst[i] = lean ? (char *)outs[1]->data + i * (size_t)n_rows * ws[0]->rows * es : outs[i]->data;
    const float one = 1.0f, zero = 0.0f;
    for (int i = 0, run; i < n; i += run) {
        run = 1;
        if (ws[i]->dtype == LMX_DT_F32 && !ws[i]->bits) {
            int N = ws[i]->rows;
            blas_ok(b,
                    cublasSgemm(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n_rows, K, &one, f32(ws[i]), K, f32(x), K,
                                &zero, f32(outs[i]), N),
                    "sgemm");
            continue;
        }
        size_t nx = (size_t)n_rows * K;
        if (b->xbf_of != x || b->xbf_rows < n_rows) { /* x rounded to bf16 once for all the weights */
            if (!grow(b, &b->xbf, &b->xbf_cap, nx, "bf16 activations"))
                return;
            launch(b, k_to_bf16, blocks_for(nx / 8 + 1, 256), 256, 0, b->xbf, f32(x), nx);
            launched(b, "to bf16");
            b->xbf_of = x;
            b->xbf_rows = n_rows;
        }
        /* a run of bf16 weights as they are, or of q8/q4 weights
         * dequantized together into b->wbf (q, k and v; gate and up) */
        const void *w[LMX_MAX_MULTI];
        if (!ws[i]->bits) {
            while (i + run < n && ws[i + run]->dtype == LMX_DT_BF16 && !ws[i + run]->bits)
                run++;
            for (int k = 0; k < run; k++)
                w[k] = ws[i + k]->data;
        } else if ((run = whole_run(b, n - i, ws + i, K)) > 0) {
            int from[LMX_MAX_MULTI] = {}, rows[LMX_MAX_MULTI];
            size_t at = 0;
            for (int k = 0; k < run; k++) {
                rows[k] = ws[i + k]->rows;
                w[k] = b->wbf + at;
                at += (size_t)rows[k] * K;
            }
            dequantize(b, run, ws + i, from, rows, K);
        } else {
            run = 1;
            stepped_product(b, ws[i], dst[i], ct, es, n_rows, K);
            continue;
        }
        bf16_products(b, run, dst + i, ct, w, ws + i, n_rows, K);
    }
    for (int i = 0; packed && i < n; i++)
        outs[i]->bf16_rows = n_rows;
    if (!gated)
        return;
    size_t ne = (size_t)n_rows * ws[0]->rows;
    __nv_bfloat16 *gb = bf16_copy(b, outs[0], n_rows);
    if (!lean) {
        gated_act<float>(b, f32(outs[0]), gb, f32(outs[0]), f32(outs[1]), ne, gelu);
    } else if (gb) {
        const __nv_bfloat16 *g16 = (const __nv_bfloat16 *)dst[0], *u16 = (const __nv_bfloat16 *)dst[1];
        gated_act<__nv_bfloat16>(b, NULL, gb, g16, u16, ne, gelu);
        outs[0]->f32_stale = true;
    }
}

/* Replayed steps fold every tensor of a multi-tensor op into the signature. */
bool skip_multi(cuda_backend *b, int op, int n, lmx_tensor *const *outs, const lmx_tensor *x,
                const lmx_tensor *const *ws, int n_rows)
{
    bool skip = skip_op(b, op, x, NULL, NULL, n_rows, n);
    for (int i = 0; i < n; i++)
        skip_op(b, op, outs[i], ws[i], NULL, i, 0);
    return skip;
}

void cuda_matmul_multi(lmx_backend *be, int n_out, lmx_tensor *const *outs, const lmx_tensor *x,
                       const lmx_tensor *const *ws, int n_rows)
{
    cuda_backend *b = cu(be);
    if (n_out < 1 || n_out > LMX_MAX_MULTI) {
        fail(b, LMX_ERR_INTERNAL, "cuda: matmul_multi of %d weights", n_out);
        return;
    }
    if (!skip_multi(b, OP_MATMUL, n_out, outs, x, ws, n_rows))
        matmuls(b, n_out, outs, x, ws, n_rows, false, 0);
}

void cuda_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int n_rows)
{
    cuda_matmul_multi(be, 1, &out, x, &w, n_rows);
}

void cuda_gated_mlp(lmx_backend *be, lmx_tensor *gate, lmx_tensor *up, const lmx_tensor *x, const lmx_tensor *w_gate,
                    const lmx_tensor *w_up, int n_rows, lmx_activation act)
{
    cuda_backend *b = cu(be);
    lmx_tensor *outs[] = {gate, up};
    const lmx_tensor *ws[] = {w_gate, w_up};
    bool skip = skip_multi(b, OP_MLP, 2, outs, x, ws, n_rows);
    skip_op(b, OP_MLP, NULL, NULL, NULL, act, 0);
    if (!skip)
        matmuls(b, 2, outs, x, ws, n_rows, true, act == LMX_ACT_GELU_TANH);
}

/* The inverse frequencies of (head_dim, rope), computed on the host exactly
 * as the CPU backend does, uploaded once. */
const float *rope_inv(cuda_backend *b, int head_dim, lmx_rope rope)
{
    for (int i = 0; i < b->n_ropes; i++) {
        rope_table *r = &b->ropes[i];
        if (r->head_dim == head_dim && r->theta == rope.theta && r->factor == rope.factor)
            return r->inv;
    }
    if (b->n_ropes == MAX_ROPES || b->mode == CAPTURE) {
        fail(b, LMX_ERR_INTERNAL, "cuda: no room for another RoPE table");
        return NULL;
    }
    int half = head_dim / 2;
    float inv[LMX_MAX_HEAD_DIM / 2];
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)head_dim;
        inv[i] = 1.0f / powf(rope.theta, e);
        if (rope.factor != 1.0f)
            inv[i] /= rope.factor;
    }
    rope_table *r = &b->ropes[b->n_ropes];
    if (!ok(b, cudaMalloc((void **)&r->inv, (size_t)(half ? half : 1) * sizeof(float)), "rope table") ||
        !ok(b, cudaMemcpy(r->inv, inv, (size_t)half * sizeof(float), cudaMemcpyHostToDevice), "rope table"))
        return NULL;
    r->head_dim = head_dim;
    r->theta = rope.theta;
    r->factor = rope.factor;
    b->n_ropes++;
    return r->inv;
}

void launch_qk(cuda_backend *b, const pending_qk &a)
{
    int hd = a.head_dim;
    dim3 grid((unsigned)((a.q->cols / hd + a.k->cols / hd + QK_WARPS - 1) / QK_WARPS),
              (unsigned)((a.n_rows + QK_ROWS - 1) / QK_ROWS));
    if (a.packed)
        launch(b, hd <= 64 ? k_qk_prepare<1, bf16> : hd <= 128 ? k_qk_prepare<2, bf16> : k_qk_prepare<4, bf16>,
               grid, QK_WARPS * 32, 0, (bf16 *)a.q->data, (const bf16 *)a.k->data, (const bf16 *)a.v->data,
               a.q_norm->data, (int)a.q_norm->dtype, a.k_norm->data, (int)a.k_norm->dtype, (bf16 *)a.kc->data,
               (bf16 *)a.vc->data, a.inv, hd, a.q->cols / hd, a.k->cols / hd, a.kc->rows, step_pos(b, a.pos0),
               a.pos0, a.n_rows, a.eps, a.plus_one);
    else
        launch(b, hd <= 64 ? k_qk_prepare<1, float> : hd <= 128 ? k_qk_prepare<2, float> : k_qk_prepare<4, float>,
               grid, QK_WARPS * 32, 0, f32(a.q), f32(a.k), f32(a.v), a.q_norm->data, (int)a.q_norm->dtype,
               a.k_norm->data, (int)a.k_norm->dtype, (bf16 *)a.kc->data, (bf16 *)a.vc->data, a.inv, hd,
               a.q->cols / hd, a.k->cols / hd, a.kc->rows, step_pos(b, a.pos0), a.pos0, a.n_rows, a.eps,
               a.plus_one);
    launched(b, "qk_prepare");
}

/* A waiting qk_prepare as a launch of its own. */
void flush_qk(cuda_backend *b)
{
    if (!b->qk_pending)
        return;
    b->qk_pending = false;
    launch_qk(b, b->qk);
}

/* Decode rows wait for the attention (pending_qk): one launch a layer
 * fewer. */
void cuda_qk_prepare(lmx_backend *be, lmx_tensor *q, lmx_tensor *k, const lmx_tensor *v, const lmx_tensor *q_norm,
                     const lmx_tensor *k_norm, lmx_tensor *kc, lmx_tensor *vc, int n_rows, int head_dim, int pos0,
                     lmx_rope rope, float eps, int plus_one)
{
    cuda_backend *b = cu(be);
    bool skip = skip_op(b, OP_QK, q, k, v, n_rows, head_dim);
    skip_op(b, OP_QK, q_norm, k_norm, kc, plus_one, (long)(uintptr_t)vc); /* same answer, folds the rest */
    /* q, k and v as a prefill's packed products left them: read in bf16 */
    bool packed = q->bf16_rows >= n_rows && k->bf16_rows >= n_rows && v->bf16_rows >= n_rows;
    if (skip || (!packed && (!need_f32(b, q) || !need_f32(b, k) || !need_f32(b, v))))
        return;
    wrote(b, q);
    wrote(b, k);
    if (head_dim % 2 || head_dim > 256 || q_norm->cols != head_dim || k_norm->cols != head_dim ||
        k->cols != v->cols || kc->cols != k->cols || vc->cols != k->cols || kc->dtype != LMX_DT_BF16 ||
        vc->dtype != LMX_DT_BF16) {
        fail(b, LMX_ERR_INTERNAL, "cuda: qk_prepare of head_dim %d, norms of %d and %d", head_dim, q_norm->cols,
             k_norm->cols);
        return;
    }
    const float *inv = rope_inv(b, head_dim, rope);
    if (!inv)
        return;
    b->qk = pending_qk{q, k, kc, vc, v, q_norm, k_norm, inv, n_rows, head_dim, pos0, plus_one, eps, packed};
    if (n_rows <= GEMV_ROWS && !packed) {
        b->qk_pending = true;
    } else {
        launch_qk(b, b->qk);
        q->bf16_rows = packed ? n_rows : 0; /* q normalized, rotated and back in bf16 */
    }
}

/* Whether k_attn_wg runs here (b->wg_attn): its code is in the binary only
 * for sm_90a, which a device of compute capability 9.0 loads. */
cudaError_t wgmma_init(cuda_backend *b)
{
    const char *attn = getenv("LMX_CUDA_ATTN");
    int major = 0, minor = 0, *built = NULL, h_built = 0;
    cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, b->device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, b->device);
    if (e != cudaSuccess || major != 9 || minor != 0 || (attn && !strcmp(attn, "mma")))
        return e;
    if ((e = cudaMalloc((void **)&built, sizeof *built)) != cudaSuccess)
        return e;
    k_wgmma_built<<<1, 1, 0, b->stream>>>(built);
    e = cudaMemcpyAsync(&h_built, built, sizeof h_built, cudaMemcpyDeviceToHost, b->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(b->stream);
    cudaFree(built);
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    b->wg_attn = e == cudaSuccess && h_built &&
                 cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &b->encode_map, 12000, cudaEnableDefault,
                                                  &found) == cudaSuccess &&
                 found == cudaDriverEntryPointSuccess;
    if (b->wg_attn) {
        e = cudaFuncSetAttribute((const void *)k_attn_wg<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)wg_shm());
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute((const void *)k_attn_wg<bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)wg_shm());
    }
    return e;
}

/* The decode attention instance for tiles of head size HD (64, 128, 256). */
template <bool STEP> auto dec_kernel(int HD)
{
    return HD == 64 ? k_attn_dec<64, STEP> : HD == 128 ? k_attn_dec<128, STEP> : k_attn_dec<256, STEP>;
}

/* The attention kernels' shared memory beyond the default 48 KB, set once
 * per device (never while a graph is being captured), and how many decode
 * blocks a multiprocessor holds. */
cudaError_t attention_init(cuda_backend *b)
{
    const struct {
        const void *k;
        size_t shm;
    } ks[] = {{(const void *)k_attn_dec<64, false>, dec_shm(64)},
              {(const void *)k_attn_dec<128, false>, dec_shm(128)},
              {(const void *)k_attn_dec<256, false>, dec_shm(256)},
              {(const void *)k_attn_dec<64, true>, dec_shm(64)},
              {(const void *)k_attn_dec<128, true>, dec_shm(128)},
              {(const void *)k_attn_dec<256, true>, dec_shm(256)},
              {(const void *)k_attn_fa<64, float>, fa_shm<64>()},
              {(const void *)k_attn_fa<128, float>, fa_shm<128>()},
              {(const void *)k_attn_fa<256, float>, fa_shm<256>()},
              {(const void *)k_attn_fa<64, bf16>, fa_shm<64>()},
              {(const void *)k_attn_fa<128, bf16>, fa_shm<128>()},
              {(const void *)k_attn_fa<256, bf16>, fa_shm<256>()},
              {(const void *)k_attn_prefill<2>, prefill_shm(64)},
              {(const void *)k_attn_prefill<4>, prefill_shm(128)},
              {(const void *)k_attn_prefill<8>, prefill_shm(256)}};
    cudaError_t e = cudaSuccess;
    for (size_t i = 0; i < sizeof ks / sizeof *ks && e == cudaSuccess; i++)
        e = cudaFuncSetAttribute(ks[i].k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ks[i].shm);
    for (int i = 0; i < 3 && e == cudaSuccess; i++) { /* the fewer of the two instances */
        int HD = 64 << i, generic = 0, step = 0;
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&generic, dec_kernel<false>(HD), DEC_WARPS * 32,
                                                          dec_shm(HD));
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&step, dec_kernel<true>(HD), DEC_WARPS * 32,
                                                              dec_shm(HD));
        b->dec_blocks[i] = generic < step ? generic : step;
    }
    int sm_shm = 0, reserved = 0;
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sm_shm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, b->device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, b->device);
    if (e == cudaSuccess) {
        size_t need = dec_shm(256) + (size_t)reserved;
        b->attn_carveout = need >= (size_t)sm_shm ? 100 : (int)((need * 100 + sm_shm - 1) / sm_shm);
    }
    return e == cudaSuccess ? wgmma_init(b) : e;
}

/* Decode attention (up to GEMV_ROWS rows): k_attn_dec over a fixed number
 * of key splits, then their merge. */
void attention_decode(cuda_backend *b, lmx_tensor *out, const lmx_tensor *q, const lmx_tensor *kc,
                      const lmx_tensor *vc, const lmx_attn_params *p, const int *dpos, const qk_fuse &fz)
{
    int hd = p->head_dim, HD = hd <= 64 ? 64 : hd <= 128 ? 128 : 256;
    int groups = p->n_kv_heads * ((p->n_heads / p->n_kv_heads * p->n_rows + 15) / 16);
    /* Splits enough for every multiprocessor to hold as many blocks as it
     * can, all at once (one wave, no tail), and never more than give each
     * warp DEC_SPLIT_CHUNKS of the cache's chunks; the grid depends on the
     * cache's size only, not on the position. */
    int resident = b->sms * b->dec_blocks[HD == 64 ? 0 : HD == 128 ? 1 : 2];
    int chunks = (kc->rows + DEC_KEYS - 1) / DEC_KEYS, nsplit = resident / groups;
    int most = (chunks + DEC_WARPS * DEC_SPLIT_CHUNKS - 1) / (DEC_WARPS * DEC_SPLIT_CHUNKS);
    nsplit = nsplit < most ? nsplit : most;
    nsplit = nsplit < 1 ? 1 : nsplit;
    if (nsplit > 1 &&
        !grow(b, &b->part, &b->part_cap, (size_t)p->n_rows * p->n_heads * nsplit * (hd + 2), "attention splits"))
        return;
    int G = lmx_quant_group(out->cols);
    xquant oq = quant_copy(b, out, p->n_rows, G && hd % G == 0); /* for the o GEMV */
    dim3 grid((unsigned)groups, (unsigned)nsplit);
    bool step = hd == HD && p->n_rows == 1 && !(p->softcap > 0) && fz.k; /* k_attn_dec's STEP */
    auto k = step ? dec_kernel<true>(HD) : dec_kernel<false>(HD);
    launch(b, k, grid, DEC_WARPS * 32, dec_shm(HD), f32(out), oq, b->part, f32(q), (const bf16 *)kc->data,
           (const bf16 *)vc->data, kc->rows, p->n_heads, p->n_kv_heads, hd, p->window, p->scale, p->softcap, dpos,
           p->pos0, p->n_rows, fz);
    launched(b, "attention");
    if (nsplit > 1) { /* a few hundred splits at most: their weights fit the default shared memory */
        launch(b, k_attn_merge, dim3(p->n_heads, p->n_rows), MERGE_THREADS, merge_shm(nsplit),
               f32(out), oq, b->part, p->n_heads, hd, nsplit, p->window, dpos, p->pos0, p->n_rows);
        launched(b, "attention merge");
    }
}

/* q in float32, or in bf16 (QT) as qk_prepare left a packed one. */
template <int HD, typename QT>
void launch_fa(cuda_backend *b, lmx_tensor *out, const QT *q, const bf16 *kc, const bf16 *vc, int slots,
               const lmx_attn_params *p, const int *dpos)
{
    constexpr int Q = fa_shape<HD>::Q;
    dim3 grid(p->n_heads, (p->n_rows + Q - 1) / Q);
    bf16 *ob = bf16_copy(b, out, p->n_rows); /* for the o projection */
    launch(b, k_attn_fa<HD, QT>, grid, fa_shape<HD>::WARPS * 32, fa_shm<HD>(), f32_unless_copy(b, out, ob), ob, q,
           kc, vc, slots, p->n_heads, p->n_kv_heads, p->window, p->scale, p->softcap, dpos, p->pos0, p->n_rows);
    launched(b, "attention (flash)");
}

/* A tensor map of one layer's K or V cache ([slots][kv_heads][WG_HD],
 * bf16) for k_attn_wg's copies: boxes of WG_K keys by 64 columns (128
 * bytes, the swizzle's width), keys past the cache read as zeros. */
bool cache_map(cuda_backend *b, CUtensorMap *m, const bf16 *cache, int kv_heads, int slots)
{
    typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                  const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    const cuuint64_t dims[3] = {WG_HD, (cuuint64_t)kv_heads, (cuuint64_t)slots};
    const cuuint64_t strides[2] = {WG_HD * 2, (cuuint64_t)kv_heads * WG_HD * 2}; /* bytes, dims 1 and 2 */
    const cuuint32_t box[3] = {64, 1, WG_K}, unit[3] = {1, 1, 1};
    CUresult r = ((encode_fn)b->encode_map)(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)cache, dims, strides, box,
                                            unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        fail(b, LMX_ERR_INTERNAL, "cuda: tensor map of the KV cache (driver error %d)", (int)r);
    return r == CUDA_SUCCESS;
}

/* The same on warpgroup MMA (head_dim 128, no key wrapped, b->wg_attn). */
template <typename QT>
void launch_wg(cuda_backend *b, lmx_tensor *out, const QT *q, const bf16 *kc, const bf16 *vc, int slots,
               const lmx_attn_params *p, const int *dpos)
{
    CUtensorMap km, vm;
    if (!cache_map(b, &km, kc, p->n_kv_heads, slots) || !cache_map(b, &vm, vc, p->n_kv_heads, slots))
        return;
    dim3 grid(p->n_heads, (p->n_rows + WG_Q - 1) / WG_Q);
    bf16 *ob = bf16_copy(b, out, p->n_rows);
    launch(b, k_attn_wg<QT>, grid, 256, wg_shm(), f32_unless_copy(b, out, ob), ob, q, km, vm, p->n_heads,
           p->n_kv_heads, p->window, p->scale, p->softcap, dpos, p->pos0, p->n_rows);
    launched(b, "attention (flash, wgmma)");
}

template <int HD>
void flash_attention(cuda_backend *b, lmx_tensor *out, const lmx_tensor *q, const bf16 *kc, const bf16 *vc, int slots,
                     const lmx_attn_params *p, const int *dpos)
{
    /* k_attn_wg's tensor copies take a tile's keys from consecutive slots:
     * only while no position has wrapped around the cache (pos0 is the
     * position: only one-row steps are recorded, which never come here) */
    bool wg = HD == WG_HD && p->head_dim == WG_HD && b->wg_attn && p->pos0 + p->n_rows <= slots;
    if (q->bf16_rows >= p->n_rows && wg)
        launch_wg(b, out, (const bf16 *)q->data, kc, vc, slots, p, dpos);
    else if (q->bf16_rows >= p->n_rows)
        launch_fa<HD>(b, out, (const bf16 *)q->data, kc, vc, slots, p, dpos);
    else if (wg)
        launch_wg(b, out, f32(q), kc, vc, slots, p, dpos);
    else
        launch_fa<HD>(b, out, f32(q), kc, vc, slots, p, dpos);
}

void cuda_attention(lmx_backend *be, lmx_tensor *out, const lmx_tensor *q, const lmx_tensor *kc,
                    const lmx_tensor *vc, const lmx_attn_params *p)
{
    cuda_backend *b = cu(be);
    int hd = p->head_dim;
    /* prefill on the tensor cores, which read a packed q (bf16) as it is */
    bool fa = p->n_rows > GEMV_ROWS && !b->simt_attn && (hd == 64 || hd == 128 || hd == 256);
    if (skip_op(b, OP_ATTN, out, q, kc, p->n_rows, (long)(uintptr_t)vc) ||
        (!(fa && q->bf16_rows >= p->n_rows) && !need_f32(b, q)))
        return;
    wrote(b, out);
    if (hd % 16 || hd > 256 || p->n_heads % p->n_kv_heads || kc->dtype != LMX_DT_BF16 || vc->dtype != LMX_DT_BF16) {
        fail(b, LMX_ERR_UNSUPPORTED,
             "cuda: attention with head_dim %d (a multiple of 16 up to 256 wanted), %d heads over %d%s", hd,
             p->n_heads, p->n_kv_heads, kc->dtype != LMX_DT_BF16 ? ", cache not from alloc_cache" : "");
        return;
    }
    const int *dpos = step_pos(b, p->pos0);
    const bf16 *kcd = (const bf16 *)kc->data, *vcd = (const bf16 *)vc->data;
    qk_fuse fz = {};
    if (b->qk_pending && b->qk.q == q && b->qk.kc == kc && b->qk.vc == vc && p->n_rows <= GEMV_ROWS) {
        const pending_qk &a = b->qk;
        fz = qk_fuse{f32(a.k), f32(a.v), a.q_norm->data, a.k_norm->data, (int)a.q_norm->dtype, (int)a.k_norm->dtype,
                     a.plus_one, a.inv, a.eps, (bf16 *)kc->data, (bf16 *)vc->data};
        b->qk_pending = false;
    }
    flush_qk(b); /* a qk_prepare for other tensors */
    if (p->n_rows <= GEMV_ROWS) {
        attention_decode(b, out, q, kc, vc, p, dpos, fz);
        return;
    }
    if (fa)
        switch (hd) {
        case 64: flash_attention<64>(b, out, q, kcd, vcd, kc->rows, p, dpos); return;
        case 128: flash_attention<128>(b, out, q, kcd, vcd, kc->rows, p, dpos); return;
        case 256: flash_attention<256>(b, out, q, kcd, vcd, kc->rows, p, dpos); return;
        }
    dim3 grid(p->n_heads, (p->n_rows + PF_ROWS - 1) / PF_ROWS);
    auto k = hd <= 64 ? k_attn_prefill<2> : hd <= 128 ? k_attn_prefill<4> : k_attn_prefill<8>;
    launch(b, k, grid, PF_WARPS * 32, prefill_shm(hd), f32(out), f32(q), kcd, vcd, kc->rows, p->n_heads,
           p->n_kv_heads, hd, p->window, p->scale, p->softcap, dpos, p->pos0, p->n_rows);
    launched(b, "attention (prefill)");
}

void cuda_residual_norm(lmx_backend *be, lmx_tensor *x, lmx_tensor *h, lmx_tensor *y, const lmx_tensor *post,
                        const lmx_tensor *next, int n_rows, float eps, int plus_one, int for_products)
{
    cuda_backend *b = cu(be);
    bool skip = skip_op(b, OP_RESIDUAL, x, h, y, n_rows, plus_one);
    skip_op(b, OP_RESIDUAL, post, next, NULL, 0, 0);
    if (skip || !need_f32(b, x) || !need_f32(b, y))
        return;
    wrote(b, x);
    wrote(b, y);
    wrote(b, h);
    int dim = x->cols;
    if (next->cols != dim || (post && post->cols != dim)) {
        fail(b, LMX_ERR_INTERNAL, "cuda: residual_norm of %d columns with norms of %d", dim, next->cols);
        return;
    }
    int vi, threads = norm_threads(b, dim, &vi);
    if (!threads)
        return;
    __nv_bfloat16 *hb = bf16_copy(b, h, n_rows);
    xquant q = quant_copy(b, h, n_rows, 1);
    float *hf = for_products ? f32_unless_copy(b, h, hb) : f32(h);
    static decltype(&k_residual_norm<1, false>) const k[3][2] = NORM_INSTANCES(k_residual_norm);
    launch(b, k[vi][norm_lean(dim, next) && norm_lean(dim, post)], (unsigned)n_rows, threads, 0, f32(x), hf, hb,
           f32(y), post ? post->data : NULL, post ? (int)post->dtype : 0, next->data, (int)next->dtype, dim, eps,
           plus_one, q);
    launched(b, "residual_norm");
}

void cuda_softcap(lmx_backend *be, lmx_tensor *x, int n_rows, float cap)
{
    cuda_backend *b = cu(be);
    if (skip_op(b, OP_CAP, x, NULL, NULL, n_rows, (long)(cap * 1e6f)) || !need_f32(b, x))
        return;
    wrote(b, x);
    size_t n = (size_t)n_rows * x->cols;
    launch(b, k_softcap, blocks_for(n, 256), 256, 0, f32(x), n, cap);
    launched(b, "softcap");
}

void cuda_copy_rows(lmx_backend *be, lmx_tensor *dst, int dst_row, const lmx_tensor *src, int src_row, int n_rows)
{
    cuda_backend *b = cu(be);
    if (skip_op(b, OP_COPY, dst, src, NULL, n_rows, (long)dst_row * 1000003 + src_row) || !need_f32(b, src))
        return;
    wrote(b, dst);
    ok(b,
       cudaMemcpyAsync(f32(dst) + (size_t)dst_row * dst->cols, f32(src) + (size_t)src_row * src->cols,
                       (size_t)n_rows * src->cols * sizeof(float), cudaMemcpyDeviceToDevice, b->stream),
       "copy_rows");
}

/* A staged read's bytes, from host memory at `from`, to where r says. */
void finish_read(const pending_read *r, const char *from)
{
    if (r->best) {
        const lmx_scored *p = (const lmx_scored *)from;
        lmx_scored t = p[0];
        for (int i = 1; i < ARGMAX_BLOCKS; i++)
            if (lmx_argmax_beats(p[i].score, p[i].col, t.score, t.col))
                t = p[i];
        *r->best = t.score;
        *r->col = t.col;
        return;
    }
    for (size_t k = 0; k < r->rows; k++)
        memcpy(r->dst + k * r->stride, from + k * r->row, r->row);
}

/* Whether reads go straight to the host (else through staging, done in
 * step_end): outside a graphable step. */
bool read_direct(const cuda_backend *b) { return b->mode == NO_STEP || (b->mode == EAGER && !b->cur); }

/* r->rows * r->row bytes from device memory at `from` into pinned staging
 * now (unless skip: a replay copies them), out as r says in step_end. */
void stage_read(cuda_backend *b, const void *from, pending_read r, bool skip)
{
    size_t bytes = r.rows * r.row;
    if (b->staging_used + bytes > b->staging_cap) {
        if (b->mode != EAGER) {
            fail(b, LMX_ERR_INTERNAL, "cuda: read staging too small during a recorded step");
            return;
        }
        /* grow: earlier reads of this step are already staged, keep them */
        size_t cap = (b->staging_used + bytes) * 2;
        char *nb = NULL;
        if (!ok(b, cudaStreamSynchronize(b->stream), "read") || !ok(b, cudaMallocHost((void **)&nb, cap), "read staging"))
            return;
        if (b->staging_used)
            memcpy(nb, b->staging, b->staging_used);
        drop_graphs(b);
        cudaFreeHost(b->staging);
        b->staging = nb;
        b->staging_cap = cap;
    }
    if (b->n_reads == b->reads_cap) {
        int cap = b->reads_cap ? 2 * b->reads_cap : 8;
        pending_read *nr = (pending_read *)realloc(b->reads, (size_t)cap * sizeof *nr);
        if (!nr) {
            fail(b, LMX_ERR_NOMEM, "out of memory");
            return;
        }
        b->reads = nr;
        b->reads_cap = cap;
    }
    r.off = b->staging_used;
    b->reads[b->n_reads++] = r;
    b->staging_used += bytes;
    if (!skip)
        ok(b, cudaMemcpyAsync(b->staging + r.off, from, bytes, cudaMemcpyDeviceToHost, b->stream), "read");
}

void cuda_read(lmx_backend *be, float *dst, size_t dst_stride, const lmx_tensor *src, int row0, int n_rows)
{
    cuda_backend *b = cu(be);
    size_t row = (size_t)src->cols * sizeof(float);
    const float *from = f32(src) + (size_t)row0 * src->cols;
    bool skip = skip_op(b, OP_READ, src, NULL, NULL, n_rows, row0);
    if (!skip && !need_f32(b, src))
        return;
    if (read_direct(b)) {
        ok(b, cudaMemcpy2DAsync(dst, dst_stride * sizeof(float), from, row, row, (size_t)n_rows,
                                cudaMemcpyDeviceToHost, b->stream),
           "read");
        ok(b, cudaStreamSynchronize(b->stream), "read");
        return;
    }
    stage_read(b, from, pending_read{(char *)dst, dst_stride * sizeof(float), 0, row, (size_t)n_rows, NULL, NULL},
               skip);
}

/* The first `bytes` of d_best (read_topk's groups, read_draw's token) into
 * host memory at dst: staged inside a graphable step, else now. */
void read_best(cuda_backend *b, char *dst, size_t bytes, bool skip, const char *what)
{
    if (!read_direct(b))
        stage_read(b, b->d_best, pending_read{dst, 0, 0, bytes, 1, NULL, NULL}, skip);
    else if (ok(b, cudaMemcpyAsync(dst, b->d_best, bytes, cudaMemcpyDeviceToHost, b->stream), what))
        ok(b, cudaStreamSynchronize(b->stream), what);
}

/* Only the blocks' best (score, column) pairs cross to the host: 1 KB
 * instead of the row (0.6 MB of Qwen3 logits). */
void cuda_read_argmax(lmx_backend *be, float *best, int32_t *col, const lmx_tensor *src, int row)
{
    cuda_backend *b = cu(be);
    bool skip = skip_op(b, OP_ARGMAX, src, NULL, NULL, row, 0);
    if (!skip && !need_f32(b, src))
        return;
    if (!skip) {
        launch(b, k_argmax, ARGMAX_BLOCKS, 256, 0, b->d_best, f32(src) + (size_t)row * src->cols, src->cols);
        launched(b, "argmax");
    }
    pending_read r = {NULL, 0, 0, sizeof(lmx_scored), ARGMAX_BLOCKS, best, col};
    if (!read_direct(b)) {
        stage_read(b, b->d_best, r, skip);
        return;
    }
    lmx_scored h[ARGMAX_BLOCKS];
    if (ok(b, cudaMemcpyAsync(h, b->d_best, sizeof h, cudaMemcpyDeviceToHost, b->stream), "read_argmax") &&
        ok(b, cudaStreamSynchronize(b->stream), "read_argmax"))
        finish_read(&r, (const char *)h);
}

/* The blocks' k best of their slices: 128 * 21 entries (21 KB) for Qwen3's
 * default top-k of 20 instead of 0.6 MB of logits. */
int cuda_read_topk(lmx_backend *be, lmx_scored *out, int k, const lmx_tensor *src, int row)
{
    cuda_backend *b = cu(be);
    bool skip = skip_op(b, OP_TOPK, src, NULL, NULL, row, k);
    if (!skip && !need_f32(b, src))
        return 0;
    if (k <= 0 || k > LMX_TOPK_MAX) {
        fail(b, LMX_ERR_INTERNAL, "cuda: read_topk of %d entries a group (1 to %d)", k, LMX_TOPK_MAX);
        return 0;
    }
    if (!skip) {
        launch(b, k_topk, LMX_TOPK_GROUPS, TOPK_THREADS, 0, b->d_best, f32(src) + (size_t)row * src->cols, src->cols,
               k);
        launched(b, "topk");
    }
    read_best(b, (char *)out, (size_t)LMX_TOPK_GROUPS * k * sizeof(lmx_scored), skip, "read_topk");
    return LMX_TOPK_GROUPS;
}

/* Only the drawn token crosses to the host (cuda_draw.cuh), 4 bytes
 * instead of the row. */
void cuda_read_draw(lmx_backend *be, int32_t *id, const lmx_tensor *src, int row)
{
    cuda_backend *b = cu(be);
    bool skip = skip_op(b, OP_DRAW, src, NULL, NULL, row, 0);
    if (!skip && !need_f32(b, src))
        return;
    if (b->mode == NO_STEP) {
        fail(b, LMX_ERR_INTERNAL, "cuda: read_draw outside a step (the step brings its draw)");
        return;
    }
    int n = src->cols, nb = (n + LMX_SAMPLE_BLOCK - 1) / LMX_SAMPLE_BLOCK, grid = (nb + DRAW_WARPS - 1) / DRAW_WARPS;
    if (!skip) {
        if (!grow(b, &b->d_bsum, &b->bsum_cap, (size_t)nb, "read_draw") ||
            !grow(b, &b->d_bmax, &b->bmax_cap, (size_t)nb + 1, "read_draw"))
            return;
        const float *x = f32(src) + (size_t)row * n;
        const lmx_draw *dr = (const lmx_draw *)(b->d_step + STEP_DRAW);
        launch(b, k_draw_maxima, grid, DRAW_THREADS, 0, b->d_bmax, x, n, dr);
        launch(b, k_draw_sums, grid, DRAW_THREADS, 0, b->d_bsum, b->d_bmax, nb, x, n, dr);
        launch(b, k_draw_pick, 1, DRAW_THREADS, 0, (int32_t *)b->d_best, b->d_bsum, (const float *)b->d_bmax, nb, x, n,
               dr);
        launched(b, "read_draw");
    }
    read_best(b, (char *)id, sizeof *id, skip, "read_draw");
}

/* Tensor parallelism: an in-place NCCL all-reduce on the rank's stream
 * (recorded into the step's graph like any kernel). */
void cuda_all_reduce(lmx_backend *be, lmx_tensor *x, int n_rows)
{
    cuda_backend *b = cu(be);
    if (skip_op(b, OP_REDUCE, x, NULL, NULL, n_rows, 0) || !need_f32(b, x))
        return;
    wrote(b, x);
#ifdef LMX_HAVE_NCCL
    size_t n = (size_t)n_rows * x->cols;
    ncclResult_t r = b->comm ? ncclAllReduce(x->data, x->data, n, ncclFloat, ncclSum, b->comm, b->stream)
                             : ncclInvalidUsage;
    if (r != ncclSuccess)
        fail(b, LMX_ERR_INTERNAL, "nccl: all-reduce of %zu floats on GPU %d: %s", n, b->device,
             b->comm ? ncclGetErrorString(r) : "no communicator");
#else
    fail(b, LMX_ERR_UNSUPPORTED, "cuda: all-reduce: this lmx was built without NCCL");
#endif
}

/* Steps -------------------------------------------------------------------- */

graph_entry *find_graph(cuda_backend *b, const void *key, int flags)
{
    graph_entry *lru = &b->graphs[0];
    for (int i = 0; i < MAX_GRAPHS; i++) {
        graph_entry *g = &b->graphs[i];
        if (g->seen && g->key == key && g->flags == flags)
            return g;
        if (g->used < lru->used)
            lru = g;
    }
    if (lru->exec)
        cudaGraphExecDestroy(lru->exec);
    *lru = graph_entry{key, flags, 0, NULL, 0, 0};
    return lru;
}

void cuda_step_begin(lmx_backend *be, const void *key, int flags, const int32_t *ids, int n_rows, int pos0,
                     const lmx_draw *draw)
{
    cuda_backend *b = cu(be);
    pthread_mutex_lock(&b->lock);
    cudaSetDevice(b->device); /* per thread: streams may come from many threads */
    /* A call that failed before this step (an allocation, a graph's
     * instantiation) reported its error then; launched() must not see it. */
    cudaGetLastError();
    b->mode = EAGER;
    b->cur = NULL;
    b->sig = 0xcbf29ce484222325ull;
    b->step_rows = n_rows;
    b->step_pos0 = pos0;
    b->staging_used = 0;
    b->n_reads = 0;
    b->hq_of = NULL;
    if (n_rows > MAX_IDS) {
        fail(b, LMX_ERR_INTERNAL, "cuda: a step of %d rows (at most %d)", n_rows, MAX_IDS);
        return;
    }
    /* The previous step ended with a synchronize, so h_step is free. */
    b->h_step[0] = pos0;
    memcpy(b->h_step + 1, ids, (size_t)n_rows * sizeof *ids);
    if (!ok(b, cudaMemcpyAsync(b->d_step, b->h_step, (size_t)(n_rows + 1) * sizeof(int), cudaMemcpyHostToDevice,
                               b->stream),
            "step upload"))
        return;
    if (draw) {
        lmx_draw *hd = (lmx_draw *)(b->h_step + STEP_DRAW);
        *hd = *draw;
        if (!ok(b, cudaMemcpyAsync(b->d_step + STEP_DRAW, hd, sizeof *hd, cudaMemcpyHostToDevice, b->stream),
                "step upload"))
            return;
    }
    if (n_rows != 1 || getenv("LMX_CUDA_NO_GRAPH"))
        return;
    graph_entry *g = find_graph(b, key, flags);
    g->used = ++b->clock;
    b->cur = g;
    if (g->exec) {
        /* Launched now, so that the GPU runs the step while the caller walks
         * its ops (which only fold into the signature, checked in step_end:
         * a step that differs still reports an error, after its run). */
        b->mode = REPLAY;
        ok(b, cudaGraphLaunch(g->exec, b->stream), "graph launch");
    } else if (g->seen >= 1 && !b->status &&
             ok(b, cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal), "begin capture"))
        b->mode = CAPTURE;
}

lmx_status cuda_step_end(lmx_backend *be, lmx_error *err)
{
    cuda_backend *b = cu(be);
    flush_qk(b);
    graph_entry *g = b->cur;
    if (b->mode == CAPTURE) {
        cudaGraph_t graph = NULL;
        if (ok(b, cudaStreamEndCapture(b->stream, &graph), "end capture") && !b->status &&
            ok(b, cudaGraphInstantiate(&g->exec, graph, 0), "instantiate graph"))
            g->sig = b->sig;
        if (graph)
            cudaGraphDestroy(graph);
    }
    if (b->mode == REPLAY && g->sig != b->sig)
        fail(b, LMX_ERR_INTERNAL, "cuda: a step differs from its recording");
    if (b->mode == CAPTURE && !b->status)
        ok(b, cudaGraphLaunch(g->exec, b->stream), "graph launch");
    ok(b, cudaStreamSynchronize(b->stream), "step");
    if (!b->status)
        for (int i = 0; i < b->n_reads; i++)
            finish_read(&b->reads[i], b->staging + b->reads[i].off);
    if (g && !b->status)
        g->seen++;
    if (g && b->status && g->exec) { /* never replay a recording that failed */
        cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
    }
    b->mode = NO_STEP;
    b->cur = NULL;
    lmx_status st = b->status;
    if (st) {
        lmx_fail(err, st, "%s", b->msg);
        b->status = LMX_OK;
        b->msg[0] = 0;
    }
    pthread_mutex_unlock(&b->lock);
    return st;
}

void cuda_destroy(lmx_backend *be)
{
    cuda_backend *b = cu(be);
    if (!b)
        return;
    cudaSetDevice(b->device);
    drop_graphs(b);
#ifdef LMX_HAVE_NCCL
    if (b->comm)
        ncclCommDestroy(b->comm);
#endif
    for (int i = 0; i < b->n_ropes; i++)
        cudaFree(b->ropes[i].inv);
    cudaFree(b->xbf);
    cudaFree(b->wbf);
    cudaFree(b->xq);
    cudaFree(b->xqd);
    cudaFree(b->hq);
    cudaFree(b->hqd);
    cudaFree(b->part);
    cudaFree(b->gemm_ptrs);
    if (b->pool)
        lmx_pool_free(b->pool);
    cudaFree(b->d_step);
    cudaFree(b->d_best);
    cudaFree(b->d_bsum);
    cudaFree(b->d_bmax);
    cudaFreeHost(b->h_step);
    cudaFreeHost(b->staging);
    free(b->reads);
    if (b->blas)
        cublasDestroy(b->blas);
    if (b->stream)
        cudaStreamDestroy(b->stream);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

const lmx_backend_ops cuda_ops = {
    "cuda",           cuda_destroy,       cuda_weight,    cuda_alloc,      cuda_free,
    cuda_embed,       cuda_rmsnorm,       cuda_matmul,    cuda_matmul_multi, cuda_qk_prepare,
    cuda_attention,   cuda_gated_mlp,     cuda_residual_norm, cuda_softcap, cuda_copy_rows,
    cuda_read,        cuda_read_argmax,   cuda_read_topk,     cuda_read_draw,     cuda_all_reduce,    cuda_step_begin,
    cuda_step_end,
    /* prefill rows: a 4096-token prompt in one chunk (Qwen3-8B: 16.0k tok/s
     * in chunks of 512, 19.2k in one; its activations then take ~0.8 GB) */
    MAX_IDS,
    cuda_alloc_cache,
    cuda_weight_bytes,
    cuda_check_room,
    cuda_check_cache_room,
};

} // namespace

static int have_driver(void) { return access("/dev/nvidiactl", F_OK) == 0 || access("/dev/dxg", F_OK) == 0; }

extern "C" size_t lmx_backend_cuda_bytes(const lmx_tensor *t)
{
    if (!t)
        return 0;
    if (t->bits)
        return lmx_quant_matrix_bytes(t->rows, t->cols, t->bits, t->group);
    return (size_t)t->rows * (size_t)t->cols * lmx_dtype_size(t->dtype);
}

extern "C" double lmx_backend_cuda_copy_bandwidth(int device)
{
    size_t n = (size_t)2 << 30;
    void *a = NULL, *c = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0;
    bool fine = cudaSetDevice(device) == cudaSuccess && cudaMalloc(&a, n) == cudaSuccess &&
                cudaMalloc(&c, n) == cudaSuccess && cudaMemset(a, 1, n) == cudaSuccess &&
                cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess &&
                cudaMemcpy(c, a, n, cudaMemcpyDeviceToDevice) == cudaSuccess; /* the warm-up */
    if (fine) {
        cudaEventRecord(e0, 0);
        for (int i = 0; i < 20; i++)
            cudaMemcpy(i & 1 ? a : c, i & 1 ? c : a, n, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1, 0);
        fine = cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0;
    }
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(c);
    return fine ? 20.0 * 2 * (double)n / (ms * 1e-3) : 0;
}

extern "C" int lmx_backend_cuda_available(void)
{
    if (!have_driver())
        return 0;
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

extern "C" lmx_backend *lmx_backend_cuda_new(int device, int quant, lmx_error *err)
{
    if (quant != 0 && quant != 8 && quant != 4) {
        lmx_fail(err, LMX_ERR_ARG, "lmx_load: quant = %d; want 0 (none), 8 or 4", quant);
        return NULL;
    }
    if (!have_driver()) {
        lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: device cuda: no NVIDIA driver (no /dev/nvidiactl)");
        return NULL;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= device) {
        lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: device cuda: no usable CUDA device %d (%s)", device,
                 e != cudaSuccess ? cudaGetErrorString(e) : "not that many devices");
        return NULL;
    }
    cuda_backend *b = (cuda_backend *)calloc(1, sizeof *b);
    if (!b) {
        lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
        return NULL;
    }
    b->base.ops = &cuda_ops;
    b->device = device;
    b->quant = quant;
    const char *attn = getenv("LMX_CUDA_ATTN");
    b->simt_attn = attn && !strcmp(attn, "simt");
    pthread_mutex_init(&b->lock, NULL);
    const char *what = "set device";
    e = cudaSetDevice(device);
    if (e == cudaSuccess && (what = "create stream", e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking)) == cudaSuccess &&
        (what = "step buffer", e = cudaMallocHost((void **)&b->h_step, STEP_INTS * sizeof(int))) == cudaSuccess)
        what = "step buffer", e = cudaMalloc((void **)&b->d_step, STEP_INTS * sizeof(int));
    if (e == cudaSuccess)
        what = "argmax and top-k buffer",
        e = cudaMalloc((void **)&b->d_best, (size_t)LMX_TOPK_GROUPS * LMX_TOPK_MAX * sizeof(lmx_scored));
    if (e == cudaSuccess)
        what = "device attributes", e = cudaDeviceGetAttribute(&b->sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess)
        what = "attention kernels", e = attention_init(b);
    if (e != cudaSuccess) {
        char why[64];
        lmx_fail(err, e == cudaErrorMemoryAllocation ? LMX_ERR_NOMEM : LMX_ERR_UNSUPPORTED,
                 "lmx_load: device cuda: %s: %s", what, error_text(e, why, sizeof why));
        cuda_destroy(&b->base);
        return NULL;
    }
    cublasStatus_t s = cublasCreate(&b->blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        b->blas = NULL;
        lmx_fail(err, s == CUBLAS_STATUS_ALLOC_FAILED ? LMX_ERR_NOMEM : LMX_ERR_UNSUPPORTED,
                 "lmx_load: device cuda: cublasCreate: %s", cublasGetStatusString(s));
        cuda_destroy(&b->base);
        return NULL;
    }
    return &b->base;
}

extern "C" lmx_status lmx_backend_cuda_new_group(int n_ranks, int quant, lmx_backend **out, lmx_error *err)
{
#ifdef LMX_HAVE_NCCL
    int n = 0;
    if (!have_driver() || cudaGetDeviceCount(&n) != cudaSuccess || n < n_ranks)
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: %d GPUs asked for, %d present", n_ranks, n);
    for (int r = 0; r < n_ranks; r++)
        if (!(out[r] = lmx_backend_cuda_new(r, quant, err))) {
            while (r--)
                cuda_destroy(out[r]);
            return err ? err->code : LMX_ERR_UNSUPPORTED;
        }
    /* NVLink multicast (NVLS) stays off unless the user asks for it: the
     * all-reduces here are small, and it can disturb GPUs shared with others */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclComm_t comms[64];
    int devs[64];
    for (int r = 0; r < n_ranks; r++)
        devs[r] = r;
    ncclResult_t res = n_ranks <= 64 ? ncclCommInitAll(comms, n_ranks, devs) : ncclInvalidArgument;
    if (res != ncclSuccess) {
        for (int r = 0; r < n_ranks; r++)
            cuda_destroy(out[r]);
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: NCCL over %d GPUs: %s", n_ranks, ncclGetErrorString(res));
    }
    for (int r = 0; r < n_ranks; r++)
        cu(out[r])->comm = comms[r];
    return LMX_OK;
#else
    (void)quant;
    (void)out;
    return lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: %d GPUs: this lmx was built without NCCL", n_ranks);
#endif
}
