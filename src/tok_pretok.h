/* Pre-tokenizers of tokenizer.json: Split (regex or string, every behaviour,
 * invert), ByteLevel (with or without its regex), Metaspace, Whitespace,
 * WhitespaceSplit, Digits, Punctuation and Sequence. They cut a piece of
 * normalized text into the words the model encodes one by one. */
#ifndef LMX_TOK_PRETOK_H
#define LMX_TOK_PRETOK_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "lmx.h"
#include "tok_util.h"

typedef struct lmx_tokpre lmx_tokpre;

/* A word: [off, off+len) of the arena; origin = it starts the whole input
 * (Metaspace's prepend_scheme "first" looks at that). */
typedef struct lmx_tokpiece {
    size_t off, len;
    int origin;
} lmx_tokpiece;

typedef struct lmx_tokpieces {
    lmx_tokpiece *p, *tmp;
    size_t n, cap, tmp_cap;
    lmx_tokbuf arena; /* piece text; pre-tokenizers that rewrite text append here */
} lmx_tokpieces;

/* j: the "pre_tokenizer" value; JSON null gives *out = NULL. */
lmx_status lmx_tokpre_build(const cJSON *j, const char *what, lmx_tokpre **out, lmx_error *err);
void lmx_tokpre_free(lmx_tokpre *p);
/* Sets ps to the single piece s, then cuts it (p may be NULL). */
lmx_status lmx_tokpre_run(const lmx_tokpre *p, const char *s, size_t len, int origin,
                          lmx_tokpieces *ps, lmx_error *err);
void lmx_tokpieces_free(lmx_tokpieces *ps);

/* The GPT-2 byte-to-character map of ByteLevel, and its inverse (-1 = none). */
uint32_t lmx_tokbyte_char(unsigned char b);
int lmx_tokbyte_of_char(uint32_t cp);

#endif
