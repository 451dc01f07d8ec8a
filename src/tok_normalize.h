/* Normalizers of tokenizer.json: NFC, NFD, NFKC, NFKD (utf8proc), Lowercase,
 * Replace, Prepend, Strip and Sequence. */
#ifndef LMX_TOK_NORMALIZE_H
#define LMX_TOK_NORMALIZE_H

#include <cjson/cJSON.h>

#include "lmx.h"
#include "tok_util.h"

typedef struct lmx_toknorm lmx_toknorm;

/* j: the "normalizer" value; JSON null gives *out = NULL (no normalizer). */
lmx_status lmx_toknorm_build(const cJSON *j, const char *what, lmx_toknorm **out, lmx_error *err);
void lmx_toknorm_free(lmx_toknorm *n);
/* Replaces out's content with the normalized s (valid UTF-8). n may be NULL. */
lmx_status lmx_toknorm_run(const lmx_toknorm *n, const char *s, size_t len, lmx_tokbuf *out,
                           lmx_error *err);

#endif
