/* Added tokens of tokenizer.json ("added_tokens"): their flags, and finding
 * them in text as tokenizers' AddedVocabulary does (leftmost-longest, then
 * single_word / lstrip / rstrip), on the raw text for tokens with
 * normalized == false and on the normalized text for the others. */
#ifndef LMX_TOK_ADDED_H
#define LMX_TOK_ADDED_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "lmx.h"
#include "tok_normalize.h"

typedef struct lmx_tokadded lmx_tokadded;

/* A piece of text: [start, end) of the string split, id >= 0 for an added token. */
typedef struct lmx_tokseg {
    size_t start, end;
    int32_t id;
} lmx_tokseg;

typedef struct lmx_toksegs {
    lmx_tokseg *p;
    size_t n, cap;
} lmx_toksegs;

/* arr: the "added_tokens" array (NULL = none); norm builds the normalized
 * form of tokens with normalized == true; id_base is the model's largest id
 * + 1 (added ids beyond it must be about dense). */
lmx_status lmx_tokadded_build(const cJSON *arr, const lmx_toknorm *norm, int32_t id_base,
                              const char *what, lmx_tokadded **out, lmx_error *err);
void lmx_tokadded_free(lmx_tokadded *a);

/* Replaces out's content with the pieces of s: added-token matches and the
 * text between them (empty text pieces omitted). normalized selects the
 * tokens matched; plain_special skips matches of special tokens. */
lmx_status lmx_tokadded_split(const lmx_tokadded *a, int normalized, int plain_special,
                              const char *s, size_t len, lmx_toksegs *out, lmx_error *err);
void lmx_toksegs_free(lmx_toksegs *s);

int32_t lmx_tokadded_find(const lmx_tokadded *a, const char *content, size_t len); /* -1 if none */
/* The text an added token decodes to, NULL if id is no added token. */
const char *lmx_tokadded_token(const lmx_tokadded *a, int32_t id, size_t *len);
int32_t lmx_tokadded_id_limit(const lmx_tokadded *a); /* largest id + 1, 0 if none */
/* Calls fn for the content of every special token (to mark same-text ids). */
void lmx_tokadded_each_special(const lmx_tokadded *a, void (*fn)(void *, const char *, size_t),
                               void *ctx);

#endif
