/* A small JSON scanner for the tokenizer's large files: walks objects and
 * arrays in place without building a tree, so the 33 MB vocabulary of a
 * Gemma tokenizer.json loads without millions of allocations. Small
 * sub-values are handed to cJSON by their text span. */
#ifndef LMX_TOK_JSON_H
#define LMX_TOK_JSON_H

#include <stddef.h>

#include "tok_util.h"

/* A cursor over [p, end); p becomes NULL once an error is seen. */
typedef struct lmx_tokjson {
    const char *p, *end;
} lmx_tokjson;

/* Skips whitespace; returns the next byte or 0 at the end. */
char lmx_tokjson_skip_ws(lmx_tokjson *j);
/* The same, inline for the common case of no whitespace (called per token). */
static inline char lmx_tokjson_peek(lmx_tokjson *j)
{
    if (j->p && j->p < j->end && (unsigned char)*j->p > ' ')
        return *j->p;
    return lmx_tokjson_skip_ws(j);
}
/* Consumes c (after whitespace) or fails. Returns 0 on success. */
int lmx_tokjson_expect(lmx_tokjson *j, char c);
/* Decodes the string at the cursor into out (cleared first, NUL-terminated). */
int lmx_tokjson_string(lmx_tokjson *j, lmx_tokbuf *out);
/* Reads an integer value. */
int lmx_tokjson_int(lmx_tokjson *j, long long *v);
/* Skips any value; start and len (if not NULL) get its text span. */
int lmx_tokjson_skip(lmx_tokjson *j, const char **start, size_t *len);
/* Iterates members of an object: call with *first = 1 after '{' is consumed;
 * returns 1 with the key in key and the cursor at the value, 0 at '}', -1 on
 * error. Iterates arrays alike with key == NULL. */
int lmx_tokjson_next(lmx_tokjson *j, int *first, lmx_tokbuf *key);

#endif
