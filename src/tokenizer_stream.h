/* Streaming decode: tokens in one by one, text out as soon as it is final.
 * Pieces concatenate to exactly lmx_tokenizer_decode of all the ids, and a
 * piece never ends inside a UTF-8 character.
 *
 * How: a window of recent ids is decoded whole; the text beyond what the
 * window's already-emitted ids decode to is new. It is emitted unless it
 * ends with U+FFFD (an incomplete character may still complete) or the last
 * id is a byte-fallback token (a run of <0xXX> decodes as a whole, so its
 * text is final only when the run ends). */
#ifndef LMX_TOKENIZER_STREAM_H
#define LMX_TOKENIZER_STREAM_H

#include "tokenizer.h"

typedef struct lmx_detok lmx_detok;

/* NULL when memory runs out. t must outlive the decoder. */
lmx_detok *lmx_detok_new(const lmx_tokenizer *t, int skip_special);
/* Feeds one id; *piece points to the text now complete (may be ""), valid
 * until the next call on d. */
lmx_status lmx_detok_push(lmx_detok *d, int32_t id, const char **piece, size_t *len,
                          lmx_error *err);
/* At the end: whatever remains (an incomplete trailing character as U+FFFD,
 * as a full decode would give it). */
lmx_status lmx_detok_flush(lmx_detok *d, const char **piece, size_t *len);
void lmx_detok_free(lmx_detok *d);

#endif
