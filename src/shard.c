#include "shard.h"

lmx_status lmx_shard_plan_make(const lmx_config *c, int rank, int n_ranks, lmx_shard_plan *p, lmx_error *err)
{
    int R = n_ranks, H = c->n_heads, KV = c->n_kv_heads, I = c->intermediate_size, V = c->vocab_size;
    if (R < 1 || rank < 0 || rank >= R)
        return lmx_fail(err, LMX_ERR_ARG, "tensor parallel: rank %d of %d", rank, R);
    if (H % R)
        return lmx_fail(err, LMX_ERR_UNSUPPORTED,
                        "tensor parallel: %d attention heads do not split over %d ranks", H, R);
    if (KV % R && R % KV)
        return lmx_fail(err, LMX_ERR_UNSUPPORTED,
                        "tensor parallel: %d key/value heads neither split over nor replicate onto %d ranks",
                        KV, R);
    if (I % R)
        return lmx_fail(err, LMX_ERR_UNSUPPORTED,
                        "tensor parallel: intermediate_size %d does not split over %d ranks", I, R);
    p->rank = rank;
    p->n_ranks = R;
    p->q_heads = H / R;
    p->q_head0 = rank * p->q_heads;
    /* with fewer KV heads than ranks, each rank keeps the one its query
     * heads read (H / KV queries per KV head) */
    p->kv_heads = KV % R ? 1 : KV / R;
    p->kv_head0 = KV % R ? p->q_head0 / (H / KV) : rank * p->kv_heads;
    p->inter = I / R;
    p->inter0 = rank * p->inter;
    int chunk = (V + R - 1) / R;
    p->vocab0 = rank * chunk < V ? rank * chunk : V;
    p->vocab = V - p->vocab0 < chunk ? V - p->vocab0 : chunk;
    return LMX_OK;
}
