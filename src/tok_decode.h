/* Decoders of tokenizer.json: ByteLevel, Replace, ByteFallback, Fuse, Strip,
 * Metaspace and Sequence, run as tokenizers' decode_chain runs them: each
 * maps the list of token strings to a new list, which is finally joined. */
#ifndef LMX_TOK_DECODE_H
#define LMX_TOK_DECODE_H

#include <cjson/cJSON.h>

#include "lmx.h"
#include "tok_util.h"

typedef struct lmx_tokdec lmx_tokdec;

/* A list of strings in one arena. */
typedef struct lmx_tokstrs {
    lmx_tokbuf arena;
    size_t *off, *len;
    size_t n, cap;
} lmx_tokstrs;

int lmx_tokstrs_add(lmx_tokstrs *l, const char *s, size_t len);
void lmx_tokstrs_free(lmx_tokstrs *l);

/* j: the "decoder" value; JSON null gives *out = NULL (tokens joined by " "). */
lmx_status lmx_tokdec_build(const cJSON *j, const char *what, lmx_tokdec **out, lmx_error *err);
void lmx_tokdec_free(lmx_tokdec *d);
/* Decodes the tokens (consumed: toks is left in an unspecified state) into
 * out (cleared first; NUL-terminated, valid UTF-8). d may be NULL. */
lmx_status lmx_tokdec_run(const lmx_tokdec *d, lmx_tokstrs *toks, lmx_tokbuf *out,
                          lmx_error *err);
/* 1 if a ByteFallback decoder is part of d: a run of <0xXX> tokens then
 * decodes as a whole, so streaming holds such runs back until they end. */
int lmx_tokdec_has_byte_fallback(const lmx_tokdec *d);
/* 1 if tok is a byte-fallback token "<0xXX>". */
int lmx_tokdec_is_byte_token(const char *tok, size_t len, unsigned char *byte);

#endif
