/* lmx_context: one KV cache and its forward-pass scratch; evaluates tokens
 * in chunks so any prompt length runs in bounded memory. */
#include <stdlib.h>

#include "context.h"
#include "error.h"
#include "model.h"

/* Prefill chunk: enough rows to amortise reading (and, on the CPU's AMX
 * path, decoding and splitting) the weights. */
enum { CHUNK_ROWS = 256 };

struct lmx_context {
    lmx_model *m;
    lmx_forward_state fs;
    int n_ctx;
    int length;
    int top_logits; /* the last step was eval_top's: its logits are still there */
};

lmx_context *lmx_context_new(lmx_model *m, int n_ctx, lmx_error *err)
{
    int rows = m && m->be->ops->prefill_rows ? m->be->ops->prefill_rows : CHUNK_ROWS;
    return lmx_context_new_chunked(m, n_ctx, rows, err);
}

lmx_context *lmx_context_new_chunked(lmx_model *m, int n_ctx, int chunk_rows, lmx_error *err)
{
    if (!m) {
        lmx_fail(err, LMX_ERR_ARG, "lmx_context_new: model is NULL");
        return NULL;
    }
    if (chunk_rows < 1 || chunk_rows > 4096) {
        lmx_fail(err, LMX_ERR_ARG, "lmx_context_new: chunk_rows = %d outside [1, 4096]", chunk_rows);
        return NULL;
    }
    if (n_ctx < 0) {
        lmx_fail(err, LMX_ERR_ARG, "lmx_context_new: n_ctx = %d is negative", n_ctx);
        return NULL;
    }
    if (n_ctx == 0)
        n_ctx = m->opts.n_ctx;
    if (n_ctx > m->cfg.max_position) {
        lmx_fail(err, LMX_ERR_ARG, "lmx_context_new: n_ctx = %d exceeds the model's %d positions",
                 n_ctx, m->cfg.max_position);
        return NULL;
    }
    if (n_ctx > 0 && chunk_rows > n_ctx) /* no step is longer than the context */
        chunk_rows = n_ctx;
    lmx_context *c = calloc(1, sizeof *c);
    if (!c) {
        lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
        return NULL;
    }
    c->m = m;
    c->n_ctx = n_ctx;
    if (lmx_forward_state_init(m, &c->fs, n_ctx, chunk_rows, err)) {
        lmx_context_free(c);
        return NULL;
    }
    return c;
}

void lmx_context_free(lmx_context *c)
{
    if (!c)
        return;
    lmx_forward_state_free(c->m, &c->fs);
    free(c);
}

int lmx_context_length(const lmx_context *c) { return c ? c->length : 0; }
int lmx_context_chunk_rows(const lmx_context *c) { return c->fs.max_rows; }
int lmx_context_capacity(const lmx_context *c) { return c ? c->n_ctx : 0; }

lmx_status lmx_context_truncate(lmx_context *c, int n, lmx_error *err)
{
    if (!c)
        return lmx_fail(err, LMX_ERR_ARG, "lmx_context_truncate: context is NULL");
    if (n < 0 || n > c->length)
        return lmx_fail(err, LMX_ERR_ARG, "lmx_context_truncate: n = %d outside [0, %d]", n, c->length);
    /* A sliding layer's ring holds only its window plus one chunk: going back
     * further would need keys it has already overwritten. */
    const lmx_model *m = c->m;
    for (int i = 0; i < m->cfg.n_layers && n > 0; i++) {
        int w = m->cfg.layers[i].window;
        int slots = lmx_model_cache_slots(m, i, c->n_ctx, c->fs.max_rows);
        if (w > 0 && slots < c->n_ctx && c->length - n > slots - w)
            return lmx_fail(err, LMX_ERR_RANGE,
                            "lmx_context_truncate: a sliding-window layer cannot rewind %d tokens "
                            "(at most %d); truncate to 0 instead",
                            c->length - n, slots - w);
    }
    c->length = n;
    c->top_logits = 0;
    return LMX_OK;
}

/* Runs the chunks of one eval; `out` applies to the last chunk (all its
 * rows' logits to every chunk). `fn`: the caller's name for errors. */
static lmx_status eval(const char *fn, lmx_context *c, const int32_t *ids, int n, const lmx_forward_out *out,
                       lmx_error *err)
{
    if (!c || (!ids && n > 0))
        return lmx_fail(err, LMX_ERR_ARG, "%s: context or ids is NULL", fn);
    if (n <= 0)
        return lmx_fail(err, LMX_ERR_ARG, "%s: n = %d, need at least one token", fn, n);
    const int vocab = c->m->cfg.vocab_size;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return lmx_fail(err, LMX_ERR_RANGE, "%s: token id %d at index %d is outside [0, %d)", fn,
                            (int)ids[i], i, vocab);
    if (n > c->n_ctx - c->length)
        return lmx_fail(err, LMX_ERR_RANGE,
                        "%s: context full: %d tokens + %d new exceed its %d positions", fn,
                        c->length, n, c->n_ctx);
    c->top_logits = 0;
    for (int done = 0; done < n;) {
        int k = n - done < c->fs.max_rows ? n - done : c->fs.max_rows;
        lmx_forward_out chunk = {.all_positions = out->all_positions};
        if (out->logits && out->all_positions)
            chunk.logits = out->logits + (size_t)done * vocab;
        else if (done + k == n)
            chunk = *out;
        lmx_status st = lmx_model_forward(c->m, &c->fs, ids + done, k, c->length, &chunk, err);
        if (st)
            return st;
        c->length += k;
        done += k;
    }
    return LMX_OK;
}

lmx_status lmx_context_eval(lmx_context *c, const int32_t *ids, int n, float *logits,
                            int all_positions, lmx_error *err)
{
    lmx_forward_out out = {.logits = logits, .all_positions = all_positions};
    return eval("lmx_context_eval", c, ids, n, &out, err);
}

lmx_status lmx_context_eval_argmax(lmx_context *c, const int32_t *ids, int n, int32_t *next, lmx_error *err)
{
    if (!next)
        return lmx_fail(err, LMX_ERR_ARG, "lmx_context_eval_argmax: next is NULL");
    lmx_forward_out out = {.top1 = next};
    return eval("lmx_context_eval_argmax", c, ids, n, &out, err);
}

size_t lmx_context_top_capacity(const lmx_context *c, int k) { return lmx_model_top_capacity(c->m, k); }

lmx_status lmx_context_eval_top(lmx_context *c, const int32_t *ids, int n, int k, lmx_scored *top, int *groups,
                                lmx_error *err)
{
    if (!top || !groups)
        return lmx_fail(err, LMX_ERR_ARG, "lmx_context_eval_top: top or groups is NULL");
    if (k <= 0 || k > LMX_TOPK_MAX)
        return lmx_fail(err, LMX_ERR_ARG, "lmx_context_eval_top: k = %d outside [1, %d]", k, LMX_TOPK_MAX);
    lmx_forward_out out = {.top = top, .top_k = k, .top_groups = groups};
    lmx_status st = eval("lmx_context_eval_top", c, ids, n, &out, err);
    c->top_logits = st == LMX_OK;
    return st;
}

int lmx_context_can_draw(const lmx_context *c) { return lmx_model_can_draw(c->m); }

lmx_status lmx_context_eval_draw(lmx_context *c, const int32_t *ids, int n, const lmx_draw *draw, int32_t *next,
                                 lmx_error *err)
{
    if (!draw || !next)
        return lmx_fail(err, LMX_ERR_ARG, "lmx_context_eval_draw: draw or next is NULL");
    if (c && !lmx_context_can_draw(c))
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_context_eval_draw: this model's backend does not draw");
    lmx_forward_out out = {.draw = draw, .drawn = next};
    return eval("lmx_context_eval_draw", c, ids, n, &out, err);
}

lmx_status lmx_context_last_logits(lmx_context *c, float *logits, lmx_error *err)
{
    if (!c->top_logits)
        return lmx_fail(err, LMX_ERR_ARG, "lmx_context_last_logits: the last step was not lmx_context_eval_top's");
    return lmx_model_last_logits(c->m, &c->fs, logits, err);
}
