/* Tensor parallelism: which part of the model each rank holds
 * (Megatron-style). Rank r of R takes a contiguous share of the query
 * heads with their key/value heads (replicated when there are fewer
 * key/value heads than ranks), of the MLP's intermediate columns and of
 * the vocabulary. Column-parallel weights (q/k/v, gate/up, embedding,
 * output head) are cut by rows, row-parallel ones (o_proj, down_proj) by
 * columns; each rank's attention and MLP outputs are partial sums that an
 * all-reduce completes. */
#ifndef LMX_SHARD_H
#define LMX_SHARD_H

#include "config.h"
#include "error.h"

typedef struct lmx_shard_plan {
    int rank, n_ranks;
    int q_head0, q_heads;   /* query heads [q_head0, +q_heads) */
    int kv_head0, kv_heads; /* key/value heads */
    int inter0, inter;      /* MLP intermediate columns */
    int vocab0, vocab;      /* embedding and output-head rows */
} lmx_shard_plan;

/* Rank `rank` of n_ranks; fails (naming the dimension) when the model does
 * not split that many ways. */
lmx_status lmx_shard_plan_make(const lmx_config *c, int rank, int n_ranks, lmx_shard_plan *p, lmx_error *err);

#endif
