/* Internal: a context with an explicit prefill chunk size, and that size. */
#ifndef LMX_CONTEXT_H
#define LMX_CONTEXT_H

#include "lmx.h"
#include "sample_math.h"
#include "topk.h"

/* As lmx_context_new, with prefill split into chunks of at most chunk_rows
 * tokens (which also sizes sliding-window caches: window + chunk_rows - 1). */
lmx_context *lmx_context_new_chunked(lmx_model *m, int n_ctx, int chunk_rows, lmx_error *err);
/* The most tokens one forward step of c takes (its prefill chunk). */
int lmx_context_chunk_rows(const lmx_context *c);

/* Entries lmx_context_eval_top's `top` needs for groups of k. */
size_t lmx_context_top_capacity(const lmx_context *c, int k);
/* As lmx_context_eval, with the next token's best scores in place of its
 * logits: *groups groups of k (0 < k <= LMX_TOPK_MAX) in `top`, for
 * lmx_sampler_sample_top (model.h lmx_forward_out). */
lmx_status lmx_context_eval_top(lmx_context *c, const int32_t *ids, int n, int k, lmx_scored *top, int *groups,
                                lmx_error *err);
/* Whether lmx_context_eval_draw works on c's model (one rank, a backend
 * that draws: the GPU's). */
int lmx_context_can_draw(const lmx_context *c);
/* As lmx_context_eval, with the next token drawn where its logits are, by
 * `draw` (lmx_sampler_next_draw), into *next: the token lmx_sampler_sample
 * would draw from those logits. */
lmx_status lmx_context_eval_draw(lmx_context *c, const int32_t *ids, int n, const lmx_draw *draw, int32_t *next,
                                 lmx_error *err);
/* The logits the last lmx_context_eval_top left on its device, for a draw
 * that its best scores cannot decide. */
lmx_status lmx_context_last_logits(lmx_context *c, float *logits, lmx_error *err);

#endif
