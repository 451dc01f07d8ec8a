/* Normalizers (see tok_normalize.h). */
#include "tok_normalize.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "error.h"
#include "tok_regex.h"

typedef enum kind { K_UNICODE, K_LOWER, K_REPLACE, K_PREPEND, K_STRIP, K_SEQ } kind;

struct lmx_toknorm {
    kind k;
    int uflags;        /* K_UNICODE: utf8proc options */
    int ascii_stable;  /* K_UNICODE: 1 = ASCII-only text is unchanged; 2 = also all < U+0300 */
    lmx_tokre *re;     /* K_REPLACE */
    char *content;     /* K_REPLACE, K_PREPEND */
    int left, right;   /* K_STRIP */
    lmx_toknorm **sub; /* K_SEQ */
    int nsub;
};

void lmx_toknorm_free(lmx_toknorm *n)
{
    if (!n)
        return;
    for (int i = 0; i < n->nsub; i++)
        lmx_toknorm_free(n->sub[i]);
    free(n->sub);
    lmx_tokre_free(n->re);
    free(n->content);
    free(n);
}

static char *dup_field(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsString(v) ? strdup(v->valuestring) : NULL;
}

static lmx_status build_seq(lmx_toknorm *n, const cJSON *j, const char *what, lmx_error *err)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
    if (!cJSON_IsArray(arr))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: Sequence lacks \"normalizers\"", what);
    n->sub = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *n->sub);
    if (!n->sub)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        lmx_status st = lmx_toknorm_build(it, what, &n->sub[n->nsub], err);
        if (st != LMX_OK)
            return st;
        if (n->sub[n->nsub])
            n->nsub++;
    }
    return LMX_OK;
}

static lmx_status build_kind(lmx_toknorm *n, const char *type, const cJSON *j, const char *what,
                             lmx_error *err)
{
    static const struct { const char *name; int flags, ascii_stable; } uni[] = {
        {"NFC", UTF8PROC_STABLE | UTF8PROC_COMPOSE, 2},
        {"NFD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, 1},
        {"NFKC", UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, 1},
        {"NFKD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, 1},
    };
    for (size_t i = 0; i < sizeof uni / sizeof uni[0]; i++)
        if (!strcmp(type, uni[i].name)) {
            n->k = K_UNICODE;
            n->uflags = uni[i].flags;
            n->ascii_stable = uni[i].ascii_stable;
            return LMX_OK;
        }
    if (!strcmp(type, "Lowercase")) {
        n->k = K_LOWER;
    } else if (!strcmp(type, "Replace")) {
        n->k = K_REPLACE;
        n->content = dup_field(j, "content");
        if (!n->content)
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: Replace lacks \"content\"", what);
        return lmx_tokpattern_build(cJSON_GetObjectItemCaseSensitive(j, "pattern"), what, &n->re,
                                    err);
    } else if (!strcmp(type, "Prepend")) {
        n->k = K_PREPEND;
        n->content = dup_field(j, "prepend");
        if (!n->content)
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: Prepend lacks \"prepend\"", what);
    } else if (!strcmp(type, "Strip")) {
        n->k = K_STRIP;
        n->left = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_left"));
        n->right = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_right"));
    } else if (!strcmp(type, "Sequence")) {
        n->k = K_SEQ;
        return build_seq(n, j, what, err);
    } else {
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: normalizer \"%s\" is not supported", what,
                        type);
    }
    return LMX_OK;
}

lmx_status lmx_toknorm_build(const cJSON *j, const char *what, lmx_toknorm **out, lmx_error *err)
{
    *out = NULL;
    if (!j || cJSON_IsNull(j))
        return LMX_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(type))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: normalizer without \"type\"", what);
    lmx_toknorm *n = calloc(1, sizeof *n);
    if (!n)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    lmx_status st = build_kind(n, type->valuestring, j, what, err);
    if (st != LMX_OK) {
        lmx_toknorm_free(n);
        return st;
    }
    *out = n;
    return LMX_OK;
}

/* ---- running ------------------------------------------------------------------ */

static int stable_prefix(const char *s, size_t len, int level)
{
    unsigned char lim = level == 2 ? 0xCC : 0x80; /* U+0300 starts with 0xCC */
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] >= lim)
            return 0;
    return 1;
}

static lmx_status run_unicode(const lmx_toknorm *n, const char *s, size_t len, lmx_tokbuf *out,
                              lmx_error *err)
{
    if (stable_prefix(s, len, n->ascii_stable))
        return lmx_tokbuf_put(out, s, len) ? lmx_fail(err, LMX_ERR_NOMEM, "normalize: out of memory")
                                           : LMX_OK;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst,
                                      (utf8proc_option_t)n->uflags);
    if (r < 0)
        return lmx_fail(err, r == UTF8PROC_ERROR_NOMEM ? LMX_ERR_NOMEM : LMX_ERR_INTERNAL,
                        "normalize: %s", utf8proc_errmsg(r));
    int bad = lmx_tokbuf_put(out, dst, (size_t)r);
    free(dst);
    return bad ? lmx_fail(err, LMX_ERR_NOMEM, "normalize: out of memory") : LMX_OK;
}

/* Rust's char::to_lowercase: one code point each, except U+0130. */
static int run_lower(const char *s, size_t len, lmx_tokbuf *out)
{
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = lmx_tokutf8_next((const unsigned char *)s + i, len - i, &cp);
        if (!k)
            return lmx_tokbuf_putc(out, s[i++]);
        i += k;
        int r = cp == 0x130 ? lmx_tokbuf_put(out, "i\xCC\x87", 3)
                            : lmx_tokbuf_putcp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
        if (r)
            return -1;
    }
    return 0;
}

static lmx_status run_replace(const lmx_toknorm *n, const char *s, size_t len, lmx_tokbuf *out,
                              lmx_error *err)
{
    lmx_tokspans m = {0};
    lmx_status st = lmx_tokre_find_all(n->re, s, len, &m, err);
    size_t at = 0, clen = strlen(n->content);
    int bad = 0;
    for (size_t i = 0; st == LMX_OK && i < m.n; i++) {
        bad |= lmx_tokbuf_put(out, s + at, m.p[2 * i] - at);
        bad |= lmx_tokbuf_put(out, n->content, clen);
        at = m.p[2 * i + 1];
    }
    bad |= lmx_tokbuf_put(out, s + at, len - at);
    lmx_tokspans_free(&m);
    if (st == LMX_OK && bad)
        st = lmx_fail(err, LMX_ERR_NOMEM, "normalize: out of memory");
    return st;
}

static int run_strip(const lmx_toknorm *n, const char *s, size_t len, lmx_tokbuf *out)
{
    size_t a = 0, b = len;
    uint32_t cp;
    size_t k;
    while (n->left && a < b && (k = lmx_tokutf8_next((const unsigned char *)s + a, b - a, &cp)) &&
           lmx_tokuni_is_whitespace(cp))
        a += k;
    while (n->right && b > a) {
        size_t st = b - 1;
        while (st > a && ((unsigned char)s[st] & 0xC0) == 0x80)
            st--;
        if (!lmx_tokutf8_next((const unsigned char *)s + st, b - st, &cp) ||
            !lmx_tokuni_is_whitespace(cp))
            break;
        b = st;
    }
    return lmx_tokbuf_put(out, s + a, b - a);
}

static lmx_status run_seq(const lmx_toknorm *n, const char *s, size_t len, lmx_tokbuf *out,
                          lmx_error *err)
{
    lmx_tokbuf tmp = {0};
    lmx_status st = lmx_tokbuf_put(&tmp, s, len) ? lmx_fail(err, LMX_ERR_NOMEM, "normalize: out of memory") : LMX_OK;
    for (int i = 0; st == LMX_OK && i < n->nsub; i++) {
        st = lmx_toknorm_run(n->sub[i], tmp.p, tmp.n, out, err);
        lmx_tokbuf t = tmp;
        tmp = *out;
        *out = t;
    }
    out->n = 0;
    if (st == LMX_OK && lmx_tokbuf_put(out, tmp.p, tmp.n))
        st = lmx_fail(err, LMX_ERR_NOMEM, "normalize: out of memory");
    lmx_tokbuf_free(&tmp);
    return st;
}

lmx_status lmx_toknorm_run(const lmx_toknorm *n, const char *s, size_t len, lmx_tokbuf *out,
                           lmx_error *err)
{
    out->n = 0;
    int bad = 0;
    if (!n) {
        bad = lmx_tokbuf_put(out, s, len);
    } else {
        switch (n->k) {
        case K_UNICODE: return run_unicode(n, s, len, out, err);
        case K_REPLACE: return run_replace(n, s, len, out, err);
        case K_SEQ: return run_seq(n, s, len, out, err);
        case K_LOWER: bad = run_lower(s, len, out); break;
        case K_STRIP: bad = run_strip(n, s, len, out); break;
        case K_PREPEND:
            bad = (len && lmx_tokbuf_put(out, n->content, strlen(n->content))) ||
                  lmx_tokbuf_put(out, s, len);
            break;
        }
    }
    return bad ? lmx_fail(err, LMX_ERR_NOMEM, "normalize: out of memory") : LMX_OK;
}
