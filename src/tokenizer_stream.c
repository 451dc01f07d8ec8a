/* Streaming decode (see tokenizer_stream.h). */
#include "tokenizer_stream.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

struct lmx_detok {
    const lmx_tokenizer *t;
    int skip;
    lmx_tokids win;    /* recent ids: the first `done` were emitted already */
    size_t done;
    lmx_tokbuf prefix; /* decode of win[0..done) */
    lmx_tokbuf text;   /* decode of win, the returned piece points into it */
};

lmx_detok *lmx_detok_new(const lmx_tokenizer *t, int skip_special)
{
    lmx_detok *d = t ? calloc(1, sizeof *d) : NULL;
    if (!d)
        return NULL;
    d->t = t;
    d->skip = skip_special;
    if (lmx_tokbuf_put(&d->prefix, "", 0) || lmx_tokbuf_put(&d->text, "", 0)) {
        lmx_detok_free(d);
        return NULL;
    }
    return d;
}

void lmx_detok_free(lmx_detok *d)
{
    if (!d)
        return;
    free(d->win.p);
    lmx_tokbuf_free(&d->prefix);
    lmx_tokbuf_free(&d->text);
    free(d);
}

static int ends_incomplete(const lmx_tokbuf *b)
{
    return b->n >= 3 && !memcmp(b->p + b->n - 3, "\xEF\xBF\xBD", 3);
}

/* The emitted ids become the context of what follows: the window keeps only
 * the ids of the latest piece, and their decode is the new prefix. */
static lmx_status advance(lmx_detok *d, size_t old, lmx_error *err)
{
    size_t keep = d->win.n - old;
    memmove(d->win.p, d->win.p + old, keep * sizeof *d->win.p);
    d->win.n = keep;
    d->done = keep;
    return lmx_tokenizer_decode_buf(d->t, d->win.p, d->win.n, &d->prefix, err);
}

/* Decodes the window; *piece is the part past the prefix, or "" to wait. */
static lmx_status step(lmx_detok *d, int final, const char **piece, size_t *len, lmx_error *err)
{
    *piece = "";
    *len = 0;
    if (d->done == d->win.n)
        return LMX_OK;
    lmx_status st = lmx_tokenizer_decode_buf(d->t, d->win.p, d->win.n, &d->text, err);
    if (st != LMX_OK)
        return st;
    int prefix_ok = d->text.n >= d->prefix.n && !memcmp(d->text.p, d->prefix.p, d->prefix.n);
    if (!final && (!prefix_ok || ends_incomplete(&d->text) ||
                   lmx_tokenizer_is_byte_piece(d->t, d->win.p[d->win.n - 1])))
        return LMX_OK;
    if (!prefix_ok)
        return lmx_fail(err, LMX_ERR_INTERNAL, "stream decode: text changed behind the stream");
    *piece = d->text.p + d->prefix.n;
    *len = d->text.n - d->prefix.n;
    size_t old = d->done;
    d->done = d->win.n;
    return final ? LMX_OK : advance(d, old, err);
}

lmx_status lmx_detok_push(lmx_detok *d, int32_t id, const char **piece, size_t *len,
                          lmx_error *err)
{
    if (!d || !piece || !len)
        return lmx_fail(err, LMX_ERR_ARG, "detok: NULL argument");
    *piece = "";
    *len = 0;
    if (id < 0 || id >= lmx_tokenizer_vocab_size(d->t))
        return lmx_fail(err, LMX_ERR_RANGE, "detok: id %d is not in the vocabulary", id);
    if (d->skip && lmx_tokenizer_is_special(d->t, id))
        return LMX_OK;
    if (lmx_tokids_push(&d->win, id))
        return lmx_fail(err, LMX_ERR_NOMEM, "detok: out of memory");
    lmx_status st = step(d, 0, piece, len, err);
    if (st != LMX_OK)
        d->win.n--; /* the bad id is not kept */
    return st;
}

lmx_status lmx_detok_flush(lmx_detok *d, const char **piece, size_t *len)
{
    if (!d || !piece || !len)
        return LMX_ERR_ARG;
    lmx_status st = step(d, 1, piece, len, NULL);
    if (st == LMX_OK) {
        /* a later push starts afresh */
        d->win.n = d->done = 0;
        d->prefix.n = 0;
    }
    return st;
}
