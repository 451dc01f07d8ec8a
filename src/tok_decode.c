/* Decoders (see tok_decode.h). */
#include "tok_decode.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tok_pretok.h"
#include "tok_regex.h"

typedef enum kind { K_BYTELEVEL, K_REPLACE, K_BYTEFALLBACK, K_FUSE, K_STRIP, K_METASPACE,
                    K_SEQ } kind;

struct lmx_tokdec {
    kind k;
    lmx_tokre *re;   /* K_REPLACE */
    char *content;   /* K_REPLACE */
    uint32_t ch;     /* K_STRIP content, K_METASPACE replacement */
    int start, stop; /* K_STRIP */
    int prepend;     /* K_METASPACE: prepend_scheme != never */
    lmx_tokdec **sub;
    int nsub;
};

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

int lmx_tokstrs_add(lmx_tokstrs *l, const char *s, size_t len)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        size_t *o = realloc(l->off, cap * sizeof *o);
        if (!o)
            return -1;
        l->off = o;
        size_t *n = realloc(l->len, cap * sizeof *n);
        if (!n)
            return -1;
        l->len = n;
        l->cap = cap;
    }
    size_t off = l->arena.n;
    if (lmx_tokbuf_put(&l->arena, s, len))
        return -1;
    l->off[l->n] = off;
    l->len[l->n++] = len;
    return 0;
}

void lmx_tokstrs_free(lmx_tokstrs *l)
{
    lmx_tokbuf_free(&l->arena);
    free(l->off);
    free(l->len);
    memset(l, 0, sizeof *l);
}

void lmx_tokdec_free(lmx_tokdec *d)
{
    if (!d)
        return;
    for (int i = 0; i < d->nsub; i++)
        lmx_tokdec_free(d->sub[i]);
    free(d->sub);
    lmx_tokre_free(d->re);
    free(d->content);
    free(d);
}

/* ---- building ------------------------------------------------------------------- */

static int one_char(const cJSON *v, uint32_t *cp)
{
    if (!cJSON_IsString(v))
        return 0;
    size_t n = strlen(v->valuestring);
    return n && lmx_tokutf8_next((const unsigned char *)v->valuestring, n, cp) == n;
}

static lmx_status build_seq(lmx_tokdec *d, const cJSON *j, const char *what, lmx_error *err)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "decoders");
    if (!cJSON_IsArray(arr))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: Sequence lacks \"decoders\"", what);
    d->sub = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *d->sub);
    if (!d->sub)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        lmx_status st = lmx_tokdec_build(it, what, &d->sub[d->nsub], err);
        if (st != LMX_OK)
            return st;
        if (d->sub[d->nsub])
            d->nsub++;
    }
    return LMX_OK;
}

static lmx_status build_metaspace(lmx_tokdec *d, const cJSON *j, const char *what, lmx_error *err)
{
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
    d->ch = 0x2581;
    if (cJSON_GetObjectItemCaseSensitive(j, "replacement") &&
        !one_char(cJSON_GetObjectItemCaseSensitive(j, "replacement"), &d->ch))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: Metaspace replacement is not one character",
                        what);
    d->prepend = cJSON_IsString(ps) ? strcmp(ps->valuestring, "never") != 0 : !cJSON_IsFalse(aps);
    return LMX_OK;
}

static lmx_status build_kind(lmx_tokdec *d, const char *type, const cJSON *j, const char *what,
                             lmx_error *err)
{
    if (!strcmp(type, "ByteLevel")) {
        d->k = K_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        d->k = K_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        d->k = K_FUSE;
    } else if (!strcmp(type, "Replace")) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        d->k = K_REPLACE;
        if (!cJSON_IsString(c) || !(d->content = strdup(c->valuestring)))
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: Replace lacks \"content\"", what);
        return lmx_tokpattern_build(cJSON_GetObjectItemCaseSensitive(j, "pattern"), what, &d->re,
                                    err);
    } else if (!strcmp(type, "Strip")) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "start");
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "stop");
        d->k = K_STRIP;
        if (!one_char(cJSON_GetObjectItemCaseSensitive(j, "content"), &d->ch) ||
            !cJSON_IsNumber(a) || !cJSON_IsNumber(b) || a->valueint < 0 || b->valueint < 0)
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: Strip needs content, start, stop", what);
        d->start = a->valueint;
        d->stop = b->valueint;
    } else if (!strcmp(type, "Metaspace")) {
        d->k = K_METASPACE;
        return build_metaspace(d, j, what, err);
    } else if (!strcmp(type, "Sequence")) {
        d->k = K_SEQ;
        return build_seq(d, j, what, err);
    } else {
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: decoder \"%s\" is not supported", what,
                        type);
    }
    return LMX_OK;
}

lmx_status lmx_tokdec_build(const cJSON *j, const char *what, lmx_tokdec **out, lmx_error *err)
{
    *out = NULL;
    if (!j || cJSON_IsNull(j))
        return LMX_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(type))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: decoder without \"type\"", what);
    lmx_tokdec *d = calloc(1, sizeof *d);
    if (!d)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    lmx_status st = build_kind(d, type->valuestring, j, what, err);
    if (st != LMX_OK) {
        lmx_tokdec_free(d);
        return st;
    }
    *out = d;
    return LMX_OK;
}

int lmx_tokdec_has_byte_fallback(const lmx_tokdec *d)
{
    if (!d)
        return 0;
    for (int i = 0; i < d->nsub; i++)
        if (lmx_tokdec_has_byte_fallback(d->sub[i]))
            return 1;
    return d->k == K_BYTEFALLBACK;
}

/* u8::from_str_radix(&tok[3..5], 16): two hex digits, or '+' and one. */
int lmx_tokdec_is_byte_token(const char *t, size_t len, unsigned char *byte)
{
    if (len != 6 || memcmp(t, "<0x", 3) || t[5] != '>')
        return 0;
    unsigned v = 0;
    for (int i = 3; i < 5; i++) {
        char c = t[i];
        if (i == 3 && c == '+')
            continue;
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : (c | 32) >= 'a' && (c | 32) <= 'f' ? (unsigned)((c | 32) - 'a' + 10) : 99u;
        if (d > 15)
            return 0;
        v = v * 16 + d;
    }
    *byte = (unsigned char)v;
    return 1;
}

/* ---- running ------------------------------------------------------------------------ */

/* ByteLevel: each token's characters back to bytes (a token with a character
 * outside the map keeps its UTF-8), then one lossy UTF-8 string. */
static int dec_bytelevel(const lmx_tokstrs *in, lmx_tokstrs *out, lmx_tokbuf *tmp)
{
    tmp->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->arena.p + in->off[i];
        size_t len = in->len[i], start = tmp->n, k;
        int whole = 1;
        for (size_t j = 0; j < len && whole; j += k) {
            uint32_t cp = 0;
            k = lmx_tokutf8_next((const unsigned char *)s + j, len - j, &cp);
            int b = k ? lmx_tokbyte_of_char(cp) : -1;
            if (b < 0)
                whole = 0;
            else if (lmx_tokbuf_putc(tmp, (char)b))
                return -1;
        }
        if (!whole) {
            tmp->n = start;
            if (lmx_tokbuf_put(tmp, s, len))
                return -1;
        }
    }
    lmx_tokbuf fixed = {0};
    int bad = lmx_tokutf8_lossy(&fixed, tmp->p ? tmp->p : "", tmp->n) ||
              lmx_tokstrs_add(out, fixed.p ? fixed.p : "", fixed.n);
    lmx_tokbuf_free(&fixed);
    return bad;
}

static int flush_bytes(lmx_tokstrs *out, const lmx_tokbuf *bytes)
{
    if (lmx_tokutf8_valid(bytes->p, bytes->n))
        return lmx_tokstrs_add(out, bytes->p, bytes->n);
    for (size_t i = 0; i < bytes->n; i++)
        if (lmx_tokstrs_add(out, REPLACEMENT, 3))
            return -1;
    return 0;
}

static int dec_bytefallback(const lmx_tokstrs *in, lmx_tokstrs *out, lmx_tokbuf *bytes)
{
    bytes->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->arena.p + in->off[i];
        unsigned char b;
        if (lmx_tokdec_is_byte_token(s, in->len[i], &b)) {
            if (lmx_tokbuf_putc(bytes, (char)b))
                return -1;
            continue;
        }
        if (bytes->n && flush_bytes(out, bytes))
            return -1;
        bytes->n = 0;
        if (lmx_tokstrs_add(out, s, in->len[i]))
            return -1;
    }
    return bytes->n ? flush_bytes(out, bytes) : 0;
}

static lmx_status dec_replace(const lmx_tokdec *d, const lmx_tokstrs *in, lmx_tokstrs *out,
                              lmx_tokbuf *tmp, lmx_error *err)
{
    lmx_tokspans m = {0};
    size_t clen = strlen(d->content);
    int bad = 0;
    for (size_t i = 0; i < in->n && !bad; i++) {
        const char *s = in->arena.p + in->off[i];
        lmx_status st = lmx_tokre_find_all(d->re, s, in->len[i], &m, err);
        if (st != LMX_OK) {
            lmx_tokspans_free(&m);
            return st;
        }
        size_t at = 0;
        tmp->n = 0;
        for (size_t k = 0; k < m.n; k++) {
            bad |= lmx_tokbuf_put(tmp, s + at, m.p[2 * k] - at);
            bad |= lmx_tokbuf_put(tmp, d->content, clen);
            at = m.p[2 * k + 1];
        }
        bad |= lmx_tokbuf_put(tmp, s + at, in->len[i] - at);
        bad |= lmx_tokstrs_add(out, tmp->p, tmp->n);
    }
    lmx_tokspans_free(&m);
    return bad ? lmx_fail(err, LMX_ERR_NOMEM, "decode: out of memory") : LMX_OK;
}

/* Code point boundaries of s: offsets of each character start, plus len. */
static size_t char_starts(const char *s, size_t len, size_t *pos)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            pos[n++] = i;
    pos[n] = len;
    return n;
}

static uint32_t char_at(const char *s, const size_t *pos, size_t i)
{
    uint32_t cp = 0xFFFD;
    lmx_tokutf8_next((const unsigned char *)s + pos[i], pos[i + 1] - pos[i], &cp);
    return cp;
}

static int dec_strip(const lmx_tokdec *d, const lmx_tokstrs *in, lmx_tokstrs *out)
{
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->arena.p + in->off[i];
        size_t *pos = malloc((in->len[i] + 1) * sizeof *pos);
        if (!pos)
            return -1;
        size_t n = char_starts(s, in->len[i], pos), a = 0, b = n;
        for (size_t k = 0; k < (size_t)d->start && k < n && char_at(s, pos, k) == d->ch; k++)
            a = k + 1;
        for (size_t k = 0; k < (size_t)d->stop && k < n && char_at(s, pos, n - k - 1) == d->ch; k++)
            b = n - k - 1;
        int bad = lmx_tokstrs_add(out, s + pos[a], b > a ? pos[b] - pos[a] : 0);
        free(pos);
        if (bad)
            return -1;
    }
    return 0;
}

/* Metaspace: the replacement becomes ' ', and disappears from the first
 * token unless prepend_scheme is "never" (as tokenizers does). */
static int dec_metaspace(const lmx_tokdec *d, const lmx_tokstrs *in, lmx_tokstrs *out,
                         lmx_tokbuf *tmp)
{
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->arena.p + in->off[i];
        size_t len = in->len[i], k;
        tmp->n = 0;
        for (size_t j = 0; j < len; j += k) {
            uint32_t cp = 0;
            k = lmx_tokutf8_next((const unsigned char *)s + j, len - j, &cp);
            k = k ? k : 1;
            int bad = cp != d->ch ? lmx_tokbuf_put(tmp, s + j, k)
                      : i == 0 && d->prepend ? 0 : lmx_tokbuf_putc(tmp, ' ');
            if (bad)
                return -1;
        }
        if (lmx_tokstrs_add(out, tmp->p ? tmp->p : "", tmp->n))
            return -1;
    }
    return 0;
}

static int dec_fuse(const lmx_tokstrs *in, lmx_tokstrs *out, lmx_tokbuf *tmp)
{
    tmp->n = 0;
    for (size_t i = 0; i < in->n; i++)
        if (lmx_tokbuf_put(tmp, in->arena.p + in->off[i], in->len[i]))
            return -1;
    return lmx_tokstrs_add(out, tmp->p ? tmp->p : "", tmp->n);
}

static lmx_status step(const lmx_tokdec *d, lmx_tokstrs *toks, lmx_tokstrs *next, lmx_tokbuf *tmp,
                       lmx_error *err)
{
    if (d->k == K_SEQ) {
        for (int i = 0; i < d->nsub; i++) {
            lmx_status st = step(d->sub[i], toks, next, tmp, err);
            if (st != LMX_OK)
                return st;
        }
        return LMX_OK;
    }
    next->n = 0;
    next->arena.n = 0;
    int bad = 0;
    switch (d->k) {
    case K_BYTELEVEL: bad = dec_bytelevel(toks, next, tmp); break;
    case K_BYTEFALLBACK: bad = dec_bytefallback(toks, next, tmp); break;
    case K_FUSE: bad = dec_fuse(toks, next, tmp); break;
    case K_STRIP: bad = dec_strip(d, toks, next); break;
    case K_METASPACE: bad = dec_metaspace(d, toks, next, tmp); break;
    case K_REPLACE: {
        lmx_status st = dec_replace(d, toks, next, tmp, err);
        if (st != LMX_OK)
            return st;
        break;
    }
    case K_SEQ: break;
    }
    if (bad)
        return lmx_fail(err, LMX_ERR_NOMEM, "decode: out of memory");
    lmx_tokstrs t = *toks;
    *toks = *next;
    *next = t;
    return LMX_OK;
}

lmx_status lmx_tokdec_run(const lmx_tokdec *d, lmx_tokstrs *toks, lmx_tokbuf *out, lmx_error *err)
{
    lmx_tokstrs next = {0};
    lmx_tokbuf tmp = {0};
    lmx_status st = d ? step(d, toks, &next, &tmp, err) : LMX_OK;
    out->n = 0;
    int bad = lmx_tokbuf_put(out, "", 0);
    for (size_t i = 0; st == LMX_OK && i < toks->n; i++) {
        if (!d && i)
            bad |= lmx_tokbuf_putc(out, ' ');
        bad |= lmx_tokbuf_put(out, toks->arena.p + toks->off[i], toks->len[i]);
    }
    lmx_tokstrs_free(&next);
    lmx_tokbuf_free(&tmp);
    if (st == LMX_OK && bad)
        st = lmx_fail(err, LMX_ERR_NOMEM, "decode: out of memory");
    return st;
}
