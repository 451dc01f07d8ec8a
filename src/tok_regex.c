/* Literal and PCRE2 patterns for the tokenizer (see tok_regex.h). */
#include "tok_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tok_util.h"

struct lmx_tokre {
    char *lit; /* literal pattern, or NULL for a regex */
    size_t lit_len;
    pcre2_code *code;
};

/* Oniguruma's Unicode classes (doc/RE): \s is 9-13, U+85 and Z*; \w is L, M, N, Pc. */
#define ONIG_SPACE "\\t-\\r\\x{85}\\p{Z}"
#define ONIG_WORD "\\p{L}\\p{M}\\p{N}\\p{Pc}"

/* Rewrites \s \S \w \W to Oniguruma's sets; in a class only the positive
 * forms can be spelled out, so the negated ones stay PCRE2's there. */
static int translate(const char *p, size_t n, lmx_tokbuf *out)
{
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[++i];
            const char *set = e == 's' || e == 'S' ? ONIG_SPACE : e == 'w' || e == 'W' ? ONIG_WORD : NULL;
            int neg = e == 'S' || e == 'W';
            int r;
            if (!set || (in_class && neg))
                r = lmx_tokbuf_putc(out, '\\') || lmx_tokbuf_putc(out, e);
            else if (in_class)
                r = lmx_tokbuf_put(out, set, strlen(set));
            else
                r = lmx_tokbuf_put(out, neg ? "[^" : "[", neg ? 2 : 1) ||
                    lmx_tokbuf_put(out, set, strlen(set)) || lmx_tokbuf_putc(out, ']');
            if (r)
                return -1;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            if (lmx_tokbuf_putc(out, c))
                return -1;
            /* a ']' right after '[' or '[^' is a literal member */
            if (i + 1 < n && p[i + 1] == '^' && lmx_tokbuf_putc(out, p[++i]))
                return -1;
            if (i + 1 < n && p[i + 1] == ']' && lmx_tokbuf_putc(out, p[++i]))
                return -1;
            continue;
        }
        if (c == ']' && in_class)
            in_class = 0;
        if (lmx_tokbuf_putc(out, c))
            return -1;
    }
    return lmx_tokbuf_put(out, "", 0);
}

static lmx_status compile_regex(lmx_tokre *re, const char *pat, size_t len, lmx_error *err)
{
    lmx_tokbuf t = {0};
    if (translate(pat, len, &t))
        return lmx_fail(err, LMX_ERR_NOMEM, "regex: out of memory");
    int code;
    PCRE2_SIZE off;
    re->code = pcre2_compile((PCRE2_SPTR)t.p, t.n, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
    lmx_tokbuf_free(&t);
    if (!re->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "regex \"%.60s\": %s", pat, (char *)msg);
    }
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
    return LMX_OK;
}

lmx_status lmx_tokre_compile(const char *pat, size_t len, int literal, lmx_tokre **out,
                             lmx_error *err)
{
    lmx_tokre *re = calloc(1, sizeof *re);
    if (!re)
        return lmx_fail(err, LMX_ERR_NOMEM, "regex: out of memory");
    lmx_status st = LMX_OK;
    if (literal) {
        re->lit = malloc(len + 1);
        if (!re->lit)
            st = lmx_fail(err, LMX_ERR_NOMEM, "regex: out of memory");
        else
            memcpy(re->lit, pat, len), re->lit[len] = 0, re->lit_len = len;
    } else {
        st = compile_regex(re, pat, len, err);
    }
    if (st != LMX_OK) {
        lmx_tokre_free(re);
        re = NULL;
    }
    *out = re;
    return st;
}

void lmx_tokre_free(lmx_tokre *re)
{
    if (!re)
        return;
    free(re->lit);
    pcre2_code_free(re->code);
    free(re);
}

void lmx_tokspans_free(lmx_tokspans *s)
{
    free(s->p);
    memset(s, 0, sizeof *s);
}

static int span_add(lmx_tokspans *s, size_t a, size_t b)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        size_t *p = realloc(s->p, cap * 2 * sizeof *p);
        if (!p)
            return -1;
        s->p = p;
        s->cap = cap;
    }
    s->p[2 * s->n] = a;
    s->p[2 * s->n + 1] = b;
    s->n++;
    return 0;
}

/* memmem is a GNU extension; the patterns are short, so this is enough. */
static const char *find_bytes(const char *s, size_t n, const char *pat, size_t m)
{
    for (const char *p = s; m <= n && (size_t)(p - s) <= n - m; p++) {
        p = memchr(p, pat[0], n - m + 1 - (size_t)(p - s));
        if (!p)
            return NULL;
        if (!memcmp(p, pat, m))
            return p;
    }
    return NULL;
}

static lmx_status find_literal(const lmx_tokre *re, const char *s, size_t len, lmx_tokspans *out,
                               lmx_error *err)
{
    size_t i = 0, m = re->lit_len;
    if (!m)
        return LMX_OK;
    while (i + m <= len) {
        const char *hit = find_bytes(s + i, len - i, re->lit, m);
        if (!hit)
            break;
        size_t a = (size_t)(hit - s);
        if (span_add(out, a, a + m))
            return lmx_fail(err, LMX_ERR_NOMEM, "regex: out of memory");
        i = a + m;
    }
    return LMX_OK;
}

/* The JIT's fixed stack can run out on a pathological input: the
 * interpreter, whose frames live on the heap, takes over then. */
static int match_at(const lmx_tokre *re, const char *s, size_t len, size_t at, pcre2_match_data *md)
{
    int rc = pcre2_match(re->code, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re->code, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                         NULL);
    return rc;
}

static size_t char_len(const char *s, size_t len, size_t at)
{
    size_t k = at + 1;
    while (k < len && ((unsigned char)s[k] & 0xC0) == 0x80)
        k++;
    return k - at;
}

lmx_status lmx_tokre_find_all(const lmx_tokre *re, const char *s, size_t len, lmx_tokspans *out,
                              lmx_error *err)
{
    out->n = 0;
    if (re->lit)
        return find_literal(re, s, len, out, err);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re->code, NULL);
    if (!md)
        return lmx_fail(err, LMX_ERR_NOMEM, "regex: out of memory");
    lmx_status st = LMX_OK;
    size_t at = 0, last_end = SIZE_MAX;
    while (at <= len) {
        int rc = match_at(re, s, len, at, md);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            st = lmx_fail(err, LMX_ERR_INTERNAL, "regex match failed (PCRE2 error %d)", rc);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        /* an empty match right where the last one ended is skipped (onig's find_iter) */
        if (ov[0] == ov[1] && ov[1] == last_end) {
            at = at < len ? at + char_len(s, len, at) : len + 1;
            continue;
        }
        if (span_add(out, ov[0], ov[1])) {
            st = lmx_fail(err, LMX_ERR_NOMEM, "regex: out of memory");
            break;
        }
        at = last_end = ov[1];
    }
    pcre2_match_data_free(md);
    return st;
}

lmx_status lmx_tokpattern_build(const cJSON *pat, const char *what, lmx_tokre **out, lmx_error *err)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *v = cJSON_IsString(s) ? s : r;
    if (!cJSON_IsString(v))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: pattern is neither {\"String\"} nor {\"Regex\"}",
                        what);
    lmx_status st = lmx_tokre_compile(v->valuestring, strlen(v->valuestring), v == s, out, err);
    if (st != LMX_OK)
        lmx_error_prefix(err, what);
    return st;
}

