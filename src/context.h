/* Internal: a context with an explicit prefill chunk size, and that size. */
#ifndef LMX_CONTEXT_H
#define LMX_CONTEXT_H

#include "lmx.h"

/* As lmx_context_new, with prefill split into chunks of at most chunk_rows
 * tokens (which also sizes sliding-window caches: window + chunk_rows - 1). */
lmx_context *lmx_context_new_chunked(lmx_model *m, int n_ctx, int chunk_rows, lmx_error *err);
/* The most tokens one forward step of c takes (its prefill chunk). */
int lmx_context_chunk_rows(const lmx_context *c);

#endif
