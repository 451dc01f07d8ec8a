/* Private helpers of the tokenizer modules: growable buffers, UTF-8, hashing. */
#include "tok_util.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

int lmx_tokbuf_reserve(lmx_tokbuf *b, size_t extra)
{
    if (b->cap - b->n > extra)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->n <= extra) {
        if (cap > SIZE_MAX / 2)
            return -1;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

/* Keeps the content NUL-terminated so callers can hand it out as a string. */
int lmx_tokbuf_put(lmx_tokbuf *b, const void *s, size_t n)
{
    if (lmx_tokbuf_reserve(b, n))
        return -1;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int lmx_tokbuf_putc(lmx_tokbuf *b, char c)
{
    return lmx_tokbuf_put(b, &c, 1);
}

int lmx_tokbuf_putcp(lmx_tokbuf *b, uint32_t cp)
{
    char tmp[4];
    return lmx_tokbuf_put(b, tmp, lmx_tokutf8_encode(cp, tmp));
}

void lmx_tokbuf_free(lmx_tokbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

int lmx_tokids_push(lmx_tokids *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p)
            return -1;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = id;
    return 0;
}

size_t lmx_tokutf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2, v = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, v = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return len;
}

/* The second byte's allowed range narrows for E0, ED, F0 and F4. */
size_t lmx_tokutf8_bad_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        need = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        need = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return 1;
    size_t i = 1;
    if (i < n && s[i] >= lo && s[i] <= hi) {
        i++;
        while (i < need && i < n && (s[i] & 0xC0) == 0x80)
            i++;
    }
    return i;
}

int lmx_tokutf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    uint32_t cp;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = lmx_tokutf8_next(u + i, n - i, &cp);
        if (!k)
            return 0;
        i += k;
    }
    return 1;
}

int lmx_tokutf8_lossy(lmx_tokbuf *out, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    uint32_t cp;
    while (i < n) {
        size_t k = lmx_tokutf8_next(u + i, n - i, &cp);
        if (k) {
            i += k;
            continue;
        }
        if (lmx_tokbuf_put(out, s + run, i - run) || lmx_tokbuf_put(out, "\xEF\xBF\xBD", 3))
            return -1;
        i += lmx_tokutf8_bad_len(u + i, n - i);
        run = i;
    }
    return lmx_tokbuf_put(out, s + run, n - run);
}

size_t lmx_tokutf8_encode(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int lmx_tokuni_is_whitespace(uint32_t cp)
{
    if (cp < 0x80)
        return cp == ' ' || (cp >= 9 && cp <= 13);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

int lmx_tokuni_is_word(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || ((cp | 32) >= 'a' && (cp | 32) <= 'z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D)
        return 1;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

int lmx_tokuni_is_numeric(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

/* FNV-1a over 8-byte words then bytes: fast, and good enough for token strings. */
uint64_t lmx_tokhash(const void *s, size_t n)
{
    const unsigned char *p = s;
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    while (n--)
        h = (h ^ *p++) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}
