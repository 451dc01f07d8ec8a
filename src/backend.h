/* The backend interface: memory and ops behind a table of function
 * pointers. The forward pass calls these on opaque tensors and never
 * touches backend memory, so one forward pass drives every backend.
 *
 * Tensors are 2-D, [rows, cols], row-major. Activations are float32.
 * Weights keep their stored dtype. Ops that take n_rows work on the first
 * n_rows rows of their tensors. */
#ifndef LMX_BACKEND_H
#define LMX_BACKEND_H

#include <stdint.h>

#include "config.h"
#include "safetensors.h"
#include "sample_math.h"
#include "topk.h"

typedef struct lmx_tensor lmx_tensor;   /* defined by each backend */

enum { LMX_MAX_MULTI = 3 }; /* outputs of one matmul_multi */
typedef struct lmx_backend lmx_backend; /* a backend instance */

/* The part of a stored weight's [rows, cols] view a backend holds: rows
 * [row0, row0 + rows) and columns [col0, col0 + cols) (tensor parallelism,
 * shard.h). */
typedef struct lmx_slice {
    int row0, rows, col0, cols;
} lmx_slice;

typedef struct lmx_attn_params {
    int n_rows;      /* queries, at positions pos0 .. pos0 + n_rows - 1 */
    int pos0;
    int n_heads, n_kv_heads, head_dim;
    int window;      /* keys within the last `window` positions; 0 = all */
    float scale;     /* applied to q.k */
    float softcap;   /* 0 = none */
} lmx_attn_params;

typedef struct lmx_backend_ops {
    const char *name;
    void (*destroy)(lmx_backend *be);

    /* A stored weight, seen as [rows, cols] = [shape[0], product of the rest],
     * or the slice s of it (NULL: whole). lookup: 1 = only single rows of it
     * are read (an untied embedding table), 0 = products stream all of it.
     * CPU: matrices copied into huge pages unless lookup (docs/cpu.md), or
     * used in place from the mapping; a GPU uploads it, reading only the
     * slice. */
    lmx_tensor *(*weight)(lmx_backend *be, const lmx_st_tensor *t, const lmx_slice *s, int lookup, lmx_error *err);
    /* A zeroed float32 tensor [rows, cols]. */
    lmx_tensor *(*alloc)(lmx_backend *be, int rows, int cols, lmx_error *err);
    void (*free)(lmx_backend *be, lmx_tensor *t);

    /* out[i] = table[ids[i] - first_id] * scale; zero for ids outside the
     * table's rows (a rank's share of the vocabulary) */
    void (*embed)(lmx_backend *be, lmx_tensor *out, const lmx_tensor *table, const int32_t *ids,
                  int n_rows, float scale, int first_id);
    /* RMSNorm of every w->cols-long segment of the rows of x:
     * out = x / sqrt(mean(x^2) + eps) * (plus_one ? 1 + w : w). out may be x. */
    void (*rmsnorm)(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                    int n_rows, float eps, int plus_one);
    /* out[n_rows, N] = x[n_rows, K] * w[N, K]^T */
    void (*matmul)(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                   int n_rows);
    /* outs[i][n_rows, N_i] = x[n_rows, K] * ws[i][N_i, K]^T for i < n_out
     * (at most LMX_MAX_MULTI): products of one input, which a backend may
     * run as one. */
    void (*matmul_multi)(lmx_backend *be, int n_out, lmx_tensor *const *outs, const lmx_tensor *x,
                         const lmx_tensor *const *ws, int n_rows);
    /* Readies attention's inputs, per head_dim-long head of each row (row i
     * at position pos0 + i): q = rope(rmsnorm(q, q_norm)), k likewise with
     * k_norm, then k and v stored at cache slots (pos0 + i) % cache rows.
     * Rotate-half RoPE; rmsnorm as above. k is scratch afterwards. */
    void (*qk_prepare)(lmx_backend *be, lmx_tensor *q, lmx_tensor *k, const lmx_tensor *v,
                       const lmx_tensor *q_norm, const lmx_tensor *k_norm, lmx_tensor *kc, lmx_tensor *vc,
                       int n_rows, int head_dim, int pos0, lmx_rope rope, float eps, int plus_one);
    /* Causal attention of q over the cache (slot = position % cache rows). */
    void (*attention)(lmx_backend *be, lmx_tensor *out, const lmx_tensor *q, const lmx_tensor *kc,
                      const lmx_tensor *vc, const lmx_attn_params *p);
    /* The gated MLP's first half: gate = act(x * w_gate^T) * (x * w_up^T);
     * up is scratch of gate's shape. */
    void (*gated_mlp)(lmx_backend *be, lmx_tensor *gate, lmx_tensor *up, const lmx_tensor *x,
                      const lmx_tensor *w_gate, const lmx_tensor *w_up, int n_rows, lmx_activation act);
    /* A residual connection and the next norm: y = rmsnorm(y, post) when
     * post is given (else y as is), x += y, h = rmsnorm(x, next). y is
     * scratch afterwards. for_products: only products (matmul,
     * matmul_multi, gated_mlp) read this h, so a backend may keep it in
     * just the precision its products take (CUDA prefill: bf16). */
    void (*residual_norm)(lmx_backend *be, lmx_tensor *x, lmx_tensor *h, lmx_tensor *y, const lmx_tensor *post,
                          const lmx_tensor *next, int n_rows, float eps, int plus_one, int for_products);
    /* x = cap * tanh(x / cap) */
    void (*softcap)(lmx_backend *be, lmx_tensor *x, int n_rows, float cap);
    /* dst rows [dst_row, +n) = src rows [src_row, +n) (same cols) */
    void (*copy_rows)(lmx_backend *be, lmx_tensor *dst, int dst_row, const lmx_tensor *src,
                      int src_row, int n_rows);
    /* Copies rows [row0, row0 + n_rows) of a float32 tensor to host memory,
     * row i at dst + i * dst_stride (inside a step: done by step_end at the
     * latest). */
    void (*read)(lmx_backend *be, float *dst, size_t dst_stride, const lmx_tensor *src, int row0,
                 int n_rows);
    /* Greedy decoding without the logits: the largest value of row `row` of
     * a float32 tensor and its column by src/argmax.h's rule, into host
     * memory (inside a step: done by step_end at the latest). */
    void (*read_argmax)(lmx_backend *be, float *best, int32_t *col, const lmx_tensor *src, int row);
    /* Sampling with top-k without the logits: row `row` of a float32
     * tensor as groups of its k (<= LMX_TOPK_MAX) best entries, each group
     * the best of its own slice of the columns (src/topk.h), into host
     * memory with room for LMX_TOPK_GROUPS * k (inside a step: done by
     * step_end at the latest). Returns the number of groups. */
    int (*read_topk)(lmx_backend *be, lmx_scored *out, int k, const lmx_tensor *src, int row);
    /* Sampling with only a temperature and min_p without the logits
     * (optional, NULL: not offered): row `row` of a float32 tensor weighed
     * and drawn from as lmx_sampler_sample does for such a sampler, by the
     * step's draw (step_begin; sample_math.h), the token into host memory.
     * Only inside a step that has a draw (done by step_end). */
    void (*read_draw)(lmx_backend *be, int32_t *id, const lmx_tensor *src, int row);
    /* Tensor parallelism (NULL: a backend without it): the first n_rows rows
     * of x become their sum over every rank of the backend's group; every
     * rank calls it, in the same order, from its own thread. */
    void (*all_reduce)(lmx_backend *be, lmx_tensor *x, int n_rows);

    /* Optional (NULL: every op runs when called). One forward step of n_rows
     * tokens `ids` at positions pos0.. is bracketed by step_begin/step_end.
     * Every step of the same (key, flags, n_rows) calls the same ops on the
     * same tensors with the same arguments, positions and ids aside, so a
     * backend may record such a step once and replay it (CUDA graphs); ops
     * then take pos0, ids and read_draw's draw (NULL: none) from the step.
     * A backend drops its recordings when a tensor is freed. step_end
     * reports any failure inside the step. */
    void (*step_begin)(lmx_backend *be, const void *key, int flags, const int32_t *ids, int n_rows,
                       int pos0, const lmx_draw *draw);
    lmx_status (*step_end)(lmx_backend *be, lmx_error *err);
    /* Prefill chunk (rows per forward step) this backend prefers; 0 = the
     * context's default. */
    int prefill_rows;
    /* Optional (NULL: alloc): a zeroed KV-cache tensor [rows, cols] in the
     * precision the backend keeps its cache in; only qk_prepare writes it
     * and attention reads it. */
    lmx_tensor *(*alloc_cache)(lmx_backend *be, int rows, int cols, lmx_error *err);
    /* Optional (NULL: loading checks nothing first): the bytes of its own
     * memory weight() would take for t (or its slice s), not counting what
     * it reads in place from the mapping; and whether the weights fit, this
     * rank's `share` of them and all ranks' `total` (a backend whose ranks
     * share one memory compares the total), LMX_ERR_NOMEM with what to do
     * if they do not, so that loading fails before it copies any. */
    size_t (*weight_bytes)(lmx_backend *be, const lmx_st_tensor *t, const lmx_slice *s, int lookup);
    lmx_status (*check_room)(lmx_backend *be, size_t share, size_t total, lmx_error *err);
    /* Optional (NULL: not checked): whether a context's KV cache of n_ctx
     * positions fits, this rank's `share` of its elements (keys and values
     * of every layer) and all ranks' `total`, as check_room; checked before
     * any of it is allocated. */
    lmx_status (*check_cache_room)(lmx_backend *be, size_t share, size_t total, int n_ctx, lmx_error *err);
} lmx_backend_ops;

struct lmx_backend {
    const lmx_backend_ops *ops;
};

/* What every backend's weight() checks first: the dtype is one the matmul
 * kernels read (F32, F16, BF16) and the [rows, cols] view (shape[0] by the
 * product of the rest; a vector is one row) fits int. */
lmx_status lmx_backend_weight_view(const lmx_st_tensor *t, int *rows, int *cols, lmx_error *err);

/* The slice a weight() call asks for (s NULL: the whole [rows, cols]
 * view), checked to lie within the view. */
lmx_status lmx_backend_slice(const lmx_st_tensor *t, const lmx_slice *s, lmx_slice *out, lmx_error *err);

#endif
