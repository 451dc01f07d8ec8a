/* Streams: prefill a prompt, then sample, stop and stream text token by
 * token (the engine behind lmx_generate, lmx_chat and sessions). */
#ifndef LMX_STREAM_H
#define LMX_STREAM_H

#include "lmx.h"

/* How a stream gets its context. */
typedef struct lmx_stream_ctx {
    lmx_context *ctx;        /* NULL: the stream makes and owns one */
    const int32_t *cached;   /* tokens ctx holds (borrowed), reused where the prompt starts with them */
    int n_cached;
    /* called at close with the tokens ctx then holds (a session keeps them) */
    void (*on_close)(void *owner, const int32_t *tokens, int n);
    void *owner;
} lmx_stream_ctx;

/* Takes ownership of ids (malloc'd). An error (err->code != LMX_OK, or
 * invalid arguments found here) gives a stream that has already ended. */
lmx_stream *lmx_stream_start(lmx_model *m, int32_t *ids, int n, const lmx_gen_config *cfg,
                             const lmx_stream_ctx *how, const lmx_error *err);

#endif
