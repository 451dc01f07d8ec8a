/* Sessions: one context kept across calls; each call reuses the longest
 * prefix of its prompt that the cache already holds. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "model.h"
#include "prompt.h"
#include "stream.h"

struct lmx_session {
    lmx_model *m;
    lmx_context *ctx;
    int32_t *cached; /* the tokens ctx holds */
    int n_cached;
    int busy;        /* a stream is open */
};

lmx_session *lmx_session_new(lmx_model *m, int n_ctx, lmx_error *err)
{
    if (!m) {
        lmx_fail(err, LMX_ERR_ARG, "lmx_session_new: model is NULL");
        return NULL;
    }
    lmx_session *s = calloc(1, sizeof *s);
    if (!s) {
        lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
        return NULL;
    }
    s->m = m;
    if (!(s->ctx = lmx_context_new(m, n_ctx, err))) {
        free(s);
        return NULL;
    }
    return s;
}

void lmx_session_free(lmx_session *s)
{
    if (!s)
        return;
    lmx_context_free(s->ctx);
    free(s->cached);
    free(s);
}

/* The stream ended: remember what the cache now holds. */
static void on_close(void *owner, const int32_t *tokens, int n)
{
    lmx_session *s = owner;
    s->busy = 0;
    int32_t *copy = n > 0 ? malloc((size_t)n * sizeof *copy) : NULL;
    if (n > 0 && !copy) { /* forget the cache rather than trust it */
        n = 0;
        lmx_context_truncate(s->ctx, 0, NULL);
    }
    if (copy)
        memcpy(copy, tokens, (size_t)n * sizeof *copy);
    free(s->cached);
    s->cached = copy;
    s->n_cached = n;
}

static lmx_stream *start(lmx_session *s, int32_t *ids, int n, const lmx_gen_config *cfg, lmx_error *err)
{
    if (s->busy && err->code == LMX_OK)
        lmx_fail(err, LMX_ERR_ARG, "the session's previous stream is still open: close it first");
    lmx_stream_ctx how = {s->ctx, s->cached, s->n_cached, on_close, s};
    int ok = err->code == LMX_OK;
    lmx_stream *st = lmx_stream_start(s->m, ids, n, cfg, ok ? &how : NULL, err);
    if (st && ok)
        s->busy = 1;
    return st;
}

lmx_stream *lmx_session_chat(lmx_session *s, const lmx_message *msgs, int n, const lmx_gen_config *cfg)
{
    lmx_error err = {0};
    if (!s) {
        lmx_fail(&err, LMX_ERR_ARG, "lmx_session_chat: session is NULL");
        return lmx_stream_start(NULL, NULL, 0, cfg, NULL, &err);
    }
    int32_t *ids = NULL;
    int n_ids = 0;
    lmx_gen_config c = cfg ? *cfg : lmx_gen_defaults(s->m);
    lmx_prompt_chat(s->m, msgs, n, 1, c.enable_thinking, &ids, &n_ids, &err);
    return start(s, ids, n_ids, &c, &err);
}

lmx_stream *lmx_session_generate_ids(lmx_session *s, const int32_t *ids, int n, const lmx_gen_config *cfg)
{
    lmx_error err = {0};
    int32_t *copy = NULL;
    if (!s)
        lmx_fail(&err, LMX_ERR_ARG, "lmx_session_generate_ids: session is NULL");
    else if (!ids || n <= 0)
        lmx_fail(&err, LMX_ERR_ARG, "lmx_session_generate_ids: no prompt ids (n = %d)", n);
    else if (!(copy = malloc((size_t)n * sizeof *copy)))
        lmx_fail(&err, LMX_ERR_NOMEM, "out of memory");
    else
        memcpy(copy, ids, (size_t)n * sizeof *copy);
    if (!s)
        return lmx_stream_start(NULL, NULL, 0, cfg, NULL, &err);
    return start(s, copy, copy ? n : 0, cfg, &err);
}
