/* A small in-place JSON scanner (see tok_json.h). */
#include "tok_json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Nesting beyond this is refused: the real files nest 6 deep. */
#define MAX_DEPTH 64

static int fail(lmx_tokjson *j)
{
    j->p = NULL;
    return -1;
}

char lmx_tokjson_skip_ws(lmx_tokjson *j)
{
    const char *p = j->p, *e = j->end;
    if (!p)
        return 0;
    /* pretty-printed files indent with runs of spaces: take 8 at a time,
     * and the end of a run from the first differing byte */
    for (;;) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        uint64_t x;
        if (e - p >= 8 && (memcpy(&x, p, 8), x ^= 0x2020202020202020ull, 1)) {
            if (!x) {
                p += 8;
                continue;
            }
            p += __builtin_ctzll(x) >> 3;
        }
#endif
        while (p < e && *p == ' ')
            p++;
        if (p < e && (*p == '\n' || *p == '\r' || *p == '\t'))
            p++;
        else
            break;
    }
    j->p = p;
    return p < e ? *p : 0;
}

int lmx_tokjson_expect(lmx_tokjson *j, char c)
{
    if (lmx_tokjson_peek(j) != c)
        return fail(j);
    j->p++;
    return 0;
}

static int hex4(const char *p, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : (c | 32) >= 'a' && (c | 32) <= 'f' ? (unsigned)((c | 32) - 'a' + 10) : 99u;
        if (d > 15)
            return -1;
        *v = *v * 16 + d;
    }
    return 0;
}

/* A \u escape, with a surrogate pair when there is one; lone surrogates are
 * refused as serde_json (which tokenizers uses) refuses them. */
static int unicode_escape(lmx_tokjson *j, lmx_tokbuf *out)
{
    unsigned hi, lo;
    if (j->end - j->p < 4 || hex4(j->p, &hi))
        return fail(j);
    j->p += 4;
    uint32_t cp = hi;
    if (hi >= 0xDC00 && hi <= 0xDFFF)
        return fail(j);
    if (hi >= 0xD800 && hi <= 0xDBFF) {
        if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || hex4(j->p + 2, &lo) ||
            lo < 0xDC00 || lo > 0xDFFF)
            return fail(j);
        j->p += 6;
        cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
    }
    return lmx_tokbuf_putcp(out, cp) ? fail(j) : 0;
}

static int escape(lmx_tokjson *j, lmx_tokbuf *out)
{
    if (j->p >= j->end)
        return fail(j);
    char c = *j->p++, r;
    switch (c) {
    case '"': case '\\': case '/': r = c; break;
    case 'b': r = '\b'; break;
    case 'f': r = '\f'; break;
    case 'n': r = '\n'; break;
    case 'r': r = '\r'; break;
    case 't': r = '\t'; break;
    case 'u': return unicode_escape(j, out);
    default: return fail(j);
    }
    return lmx_tokbuf_putc(out, r) ? fail(j) : 0;
}

/* The usual string has no escapes: find its end with memchr and copy it whole. */
static int plain_string(lmx_tokjson *j, lmx_tokbuf *out)
{
    const char *p = j->p, *q = memchr(p, '"', (size_t)(j->end - p));
    unsigned char hi = 0;
    if (!q)
        return fail(j);
    for (const char *c = p; c < q; c++) {
        if (*c == '\\' || (unsigned char)*c < 0x20)
            return 1; /* not plain: take the slow path */
        hi |= (unsigned char)*c;
    }
    size_t n = (size_t)(q - p);
    if (lmx_tokbuf_reserve(out, n))
        return fail(j);
    memcpy(out->p, p, n);
    out->p[n] = 0;
    out->n = n;
    if (hi >= 0x80 && !lmx_tokutf8_valid(p, n))
        return fail(j);
    j->p = q + 1;
    return 0;
}

int lmx_tokjson_string(lmx_tokjson *j, lmx_tokbuf *out)
{
    out->n = 0;
    if (lmx_tokjson_expect(j, '"'))
        return fail(j);
    int r = plain_string(j, out);
    if (r <= 0)
        return r;
    if (lmx_tokbuf_reserve(out, 16))
        return fail(j);
    out->p[0] = 0;
    for (;;) {
        const char *s = j->p, *e = j->end, *p = s;
        while (p < e && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
            p++;
        j->p = p;
        if (lmx_tokbuf_put(out, s, (size_t)(p - s)) || p >= e)
            return fail(j);
        char c = *j->p++;
        if (c == '"')
            break;
        if (c != '\\' || escape(j, out))
            return fail(j);
    }
    return lmx_tokutf8_valid(out->p, out->n) ? 0 : fail(j);
}

int lmx_tokjson_int(lmx_tokjson *j, long long *v)
{
    char c = lmx_tokjson_peek(j);
    if (c != '-' && (c < '0' || c > '9'))
        return fail(j);
    int neg = c == '-';
    j->p += neg;
    long long x = 0;
    const char *s = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        if (x > (1LL << 40))
            return fail(j);
        x = x * 10 + (*j->p++ - '0');
    }
    if (j->p == s || (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E')))
        return fail(j);
    *v = neg ? -x : x;
    return 0;
}

static int skip_literal(lmx_tokjson *j, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n))
        return fail(j);
    j->p += n;
    return 0;
}

static int skip_number(lmx_tokjson *j)
{
    const char *s = j->p;
    while (j->p < j->end && strchr("+-0123456789.eE", *j->p))
        j->p++;
    return j->p == s ? fail(j) : 0;
}

static int skip_value(lmx_tokjson *j, lmx_tokbuf *tmp, int depth)
{
    char c = lmx_tokjson_peek(j);
    if (depth > MAX_DEPTH)
        return fail(j);
    if (c == '"')
        return lmx_tokjson_string(j, tmp);
    if (c == '{' || c == '[') {
        j->p++;
        int first = 1, r;
        while ((r = lmx_tokjson_next(j, &first, c == '{' ? tmp : NULL)) == 1)
            if (skip_value(j, tmp, depth + 1))
                return -1;
        return r;
    }
    if (c == 't')
        return skip_literal(j, "true");
    if (c == 'f')
        return skip_literal(j, "false");
    if (c == 'n')
        return skip_literal(j, "null");
    return c ? skip_number(j) : fail(j);
}

int lmx_tokjson_skip(lmx_tokjson *j, const char **start, size_t *len)
{
    lmx_tokbuf tmp = {0};
    lmx_tokjson_peek(j);
    const char *s = j->p;
    int r = skip_value(j, &tmp, 0);
    lmx_tokbuf_free(&tmp);
    if (r || !j->p)
        return fail(j);
    if (start)
        *start = s;
    if (len)
        *len = (size_t)(j->p - s);
    return 0;
}

int lmx_tokjson_next(lmx_tokjson *j, int *first, lmx_tokbuf *key)
{
    char close = key ? '}' : ']';
    char c = lmx_tokjson_peek(j);
    if (c == close) {
        j->p++;
        return 0;
    }
    if (!*first && (lmx_tokjson_expect(j, ',') || !lmx_tokjson_peek(j)))
        return fail(j);
    *first = 0;
    if (key && (lmx_tokjson_string(j, key) || lmx_tokjson_expect(j, ':')))
        return fail(j);
    return lmx_tokjson_peek(j) ? 1 : fail(j);
}

