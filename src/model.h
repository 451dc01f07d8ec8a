/* The model: weight names per family, weights bound on a backend, and the
 * one generic forward pass every family runs through. */
#ifndef LMX_MODEL_H
#define LMX_MODEL_H

#include "backend.h"
#include "config.h"
#include "lmx.h"
#include "safetensors.h"
#include "shard.h"
#include "threadpool.h"
#include "tokenizer.h"

typedef struct lmx_layer_weights {
    lmx_tensor *attn_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm;
    lmx_tensor *post_attn_norm; /* NULL unless the family has sandwich norms */
    lmx_tensor *ffn_norm, *w_gate, *w_up, *w_down;
    lmx_tensor *post_ffn_norm;  /* NULL unless the family has sandwich norms */
} lmx_layer_weights;

enum { LMX_MAX_RANKS = 8 }; /* tensor-parallel ranks (lmx_load_options.n_gpus) */

/* One rank's part of the model (all of it without tensor parallelism). */
typedef struct lmx_rank {
    lmx_backend *be;
    lmx_shard_plan plan;
    lmx_tensor *embed, *final_norm, *lm_head; /* lm_head == embed when tied */
    lmx_layer_weights *layers;
} lmx_rank;

struct lmx_model {
    lmx_config cfg;
    lmx_load_options opts;
    lmx_st_set *st;          /* the mapped checkpoint */
    lmx_tokenizer *tok;      /* NULL when the directory has no tokenizer.json */
    lmx_backend *be;         /* rank 0's backend */
    lmx_rank *ranks;
    int n_ranks;
    lmx_pool *crew;          /* n_ranks > 1: one thread per rank */
    size_t weight_bytes;     /* bytes of the tensors the model uses */
    size_t n_params;         /* their elements */
    unsigned dtypes_used;    /* bit i set: some weight is stored as lmx_dtype i */
};

/* Per-context state of the forward pass: the KV cache and scratch
 * activations for chunks of up to max_rows tokens. */
typedef struct lmx_rank_state {
    lmx_tensor **k_cache, **v_cache; /* per layer; rows = slots */
    lmx_tensor *x, *h, *q, *k, *v, *att, *o, *gate, *up;
    lmx_tensor *rows_out, *logits;   /* logits_rows rows of the rank's vocabulary */
    float top_score;                 /* read_argmax of the rank's logits */
    int32_t top_col;
    int top_groups;                  /* groups read_topk wrote */
} lmx_rank_state;

typedef struct lmx_forward_state {
    int max_rows;
    int logits_rows;
    lmx_rank_state *ranks; /* per rank of the model */
} lmx_forward_state;

/* Slots a layer's cache needs for a context of n_ctx positions: a sliding
 * layer keeps its window plus one chunk, whatever the context. */
int lmx_model_cache_slots(const lmx_model *m, int layer, int n_ctx, int max_rows);

/* Bytes of weights a decode step reads on rank 0: every matrix once (the
 * output head whole), one embedding row, the norms; `bytes` gives a
 * tensor's size on its backend (lmx bench, bench/gpu_bench.c). */
double lmx_model_decode_weight_bytes(const lmx_model *m, size_t (*bytes)(const lmx_tensor *));

/* Key and value bytes decode attention reads at position pos, elem bytes
 * an element (the CPU's float32 cache, or float16 with kv_f16; the GPU's
 * bf16); sliding layers read their window. */
double lmx_model_decode_kv_bytes(const lmx_model *m, int pos, double elem);

lmx_status lmx_forward_state_init(lmx_model *m, lmx_forward_state *fs, int n_ctx, int max_rows,
                                  lmx_error *err);
void lmx_forward_state_free(lmx_model *m, lmx_forward_state *fs);

/* What a forward step gives back: at most one of logits, top1, top and
 * drawn. */
typedef struct lmx_forward_out {
    float *logits;     /* the last row's logits (all_positions == 0), or n rows of them */
    int all_positions;
    int32_t *top1;     /* the last row's argmax (src/argmax.h); only that id leaves the device */
    lmx_scored *top;   /* the last row's best: groups of top_k (backend.h read_topk), room for
                        * lmx_model_top_capacity; vocabulary ids */
    int top_k;
    int *top_groups;   /* the number of groups in top */
    const lmx_draw *draw; /* with drawn: the last row's token drawn where the logits are */
    int32_t *drawn;       /* (backend.h read_draw; lmx_model_can_draw) */
} lmx_forward_out;

/* Runs n (<= max_rows) tokens at positions pos0.. through the model, writing
 * their keys and values into the cache. */
lmx_status lmx_model_forward(lmx_model *m, lmx_forward_state *fs, const int32_t *ids, int n, int pos0,
                             const lmx_forward_out *out, lmx_error *err);

/* Whether a forward step may ask for `drawn`: one rank, whose backend
 * offers read_draw. */
int lmx_model_can_draw(const lmx_model *m);

/* Entries a forward step's `top` may need for groups of k. */
size_t lmx_model_top_capacity(const lmx_model *m, int k);

/* The logits of the last forward step that asked for `top`, which stay
 * where they were computed until the next step: for the rare draw that
 * the best scores cannot decide (lmx_sampler_sample_top). */
lmx_status lmx_model_last_logits(lmx_model *m, lmx_forward_state *fs, float *logits, lmx_error *err);

#endif
