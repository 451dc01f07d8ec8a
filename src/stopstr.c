#include "stopstr.h"

#include <stdlib.h>
#include <string.h>

void lmx_stopstr_init(lmx_stopstr *s, const char *const *stops, int n_stops)
{
    memset(s, 0, sizeof *s);
    s->stops = stops;
    s->n_stops = n_stops;
}

void lmx_stopstr_free(lmx_stopstr *s)
{
    free(s->held);
    free(s->out);
    memset(s, 0, sizeof *s);
}

static int reserve(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    char *b = realloc(*buf, c);
    if (!b)
        return -1;
    *buf = b;
    *cap = c;
    return 0;
}

/* Moves the first n held bytes to the output. */
static int release(lmx_stopstr *s, size_t n, const char **emit, size_t *emit_len)
{
    if (reserve(&s->out, &s->out_cap, n + 1))
        return -1;
    memcpy(s->out, s->held, n);
    s->out[n] = 0;
    memmove(s->held, s->held + n, s->held_len - n);
    s->held_len -= n;
    *emit = s->out;
    *emit_len = n;
    return 0;
}

/* Length of the longest suffix of held that is a proper prefix of a stop string. */
static size_t partial_suffix(const lmx_stopstr *s)
{
    size_t best = 0;
    for (int i = 0; i < s->n_stops; i++) {
        size_t L = strlen(s->stops[i]);
        size_t max = L - 1 < s->held_len ? L - 1 : s->held_len;
        for (size_t k = max; k > best; k--)
            if (memcmp(s->held + s->held_len - k, s->stops[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

int lmx_stopstr_push(lmx_stopstr *s, const char *text, size_t len, const char **emit, size_t *emit_len)
{
    if (reserve(&s->held, &s->held_cap, s->held_len + len + 1))
        return -1;
    memcpy(s->held + s->held_len, text, len);
    s->held_len += len;
    /* the earliest match of any stop string wins */
    size_t first = (size_t)-1;
    for (int i = 0; i < s->n_stops; i++) {
        size_t L = strlen(s->stops[i]);
        if (L == 0 || L > s->held_len)
            continue;
        for (size_t p = 0; p + L <= s->held_len && p < first; p++)
            if (memcmp(s->held + p, s->stops[i], L) == 0) {
                first = p;
                break;
            }
    }
    if (first != (size_t)-1) {
        if (release(s, first, emit, emit_len))
            return -1;
        s->held_len = 0;
        return 1;
    }
    return release(s, s->held_len - partial_suffix(s), emit, emit_len);
}

void lmx_stopstr_flush(lmx_stopstr *s, const char **emit, size_t *emit_len)
{
    if (release(s, s->held_len, emit, emit_len)) {
        *emit = "";
        *emit_len = 0;
    }
}
