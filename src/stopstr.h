/* Stop strings matched across token boundaries: text is held back while it
 * could still be the start of a stop string, and nothing from a stop string
 * on is ever released. */
#ifndef LMX_STOPSTR_H
#define LMX_STOPSTR_H

#include <stddef.h>

typedef struct lmx_stopstr {
    const char *const *stops; /* borrowed */
    int n_stops;
    char *held;               /* text not yet released */
    size_t held_len, held_cap;
    char *out;                /* what the last call released */
    size_t out_cap;
} lmx_stopstr;

void lmx_stopstr_init(lmx_stopstr *s, const char *const *stops, int n_stops);
void lmx_stopstr_free(lmx_stopstr *s);

/* Appends text. *emit and *emit_len: the text now safe to release (valid until
 * the next call). Returns 1 when a stop string matched (the text before it
 * is released; the rest is dropped), 0 otherwise, -1 when out of memory. */
int lmx_stopstr_push(lmx_stopstr *s, const char *text, size_t len, const char **emit, size_t *emit_len);

/* At the end of a stream without a match: releases everything held. */
void lmx_stopstr_flush(lmx_stopstr *s, const char **emit, size_t *emit_len);

#endif
