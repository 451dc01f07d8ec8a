/* Patterns of tokenizer.json (Split, Replace): a literal string, or a regex
 * run by PCRE2 (JIT) with the meaning Oniguruma, which tokenizers uses,
 * gives it: \s, \S, \w and \W are rewritten to Oniguruma's Unicode classes. */
#ifndef LMX_TOK_REGEX_H
#define LMX_TOK_REGEX_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "lmx.h"

typedef struct lmx_tokre lmx_tokre;

/* A growable list of match spans: p[2i], p[2i+1] = start, end. */
typedef struct lmx_tokspans {
    size_t *p;
    size_t n, cap; /* n counts spans */
} lmx_tokspans;

/* literal != 0: pat is matched as a plain string. */
lmx_status lmx_tokre_compile(const char *pat, size_t len, int literal, lmx_tokre **out,
                             lmx_error *err);
void lmx_tokre_free(lmx_tokre *re);
/* Every non-overlapping match in s (valid UTF-8), left to right, replacing
 * out's content. Empty matches are kept (as Oniguruma's find_iter). */
lmx_status lmx_tokre_find_all(const lmx_tokre *re, const char *s, size_t len, lmx_tokspans *out,
                              lmx_error *err);
void lmx_tokspans_free(lmx_tokspans *s);
/* The pattern of Replace and Split: {"String": s} or {"Regex": r}. */
lmx_status lmx_tokpattern_build(const cJSON *pat, const char *what, lmx_tokre **out,
                                lmx_error *err);

#endif
