/* lmx tokenize / lmx detokenize: text <-> token ids with a checkpoint's
 * tokenizer (DIR needs only tokenizer.json, tokenizer_config.json optional).
 *
 *   lmx tokenize DIR [--no-special] [--plain-special] [--jsonl]
 *     stdin text -> one JSON id array; with --jsonl every input line is a
 *     JSON string and every output line the id array of that string.
 *   lmx detokenize DIR [--skip-special] [--jsonl]
 *     stdin JSON id array -> JSON string; --jsonl: one array per line. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "tok_json.h"
#include "tokenizer.h"

typedef struct opts {
    const char *dir;
    int flags, skip, jsonl;
} opts;

static int parse_opts(int argc, char **argv, int detok, opts *o)
{
    memset(o, 0, sizeof *o);
    o->flags = LMX_TOK_ADD_SPECIAL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--jsonl"))
            o->jsonl = 1;
        else if (!detok && !strcmp(a, "--no-special"))
            o->flags &= ~LMX_TOK_ADD_SPECIAL;
        else if (!detok && !strcmp(a, "--plain-special"))
            o->flags |= LMX_TOK_PLAIN_SPECIAL;
        else if (detok && !strcmp(a, "--skip-special"))
            o->skip = 1;
        else if (a[0] != '-' && !o->dir)
            o->dir = a;
        else
            return -1;
    }
    return o->dir ? 0 : -1;
}

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += k;
        if (cap - n < 2) {
            char *p = realloc(buf, cap * 2);
            if (!p)
                free(buf);
            buf = p;
            cap *= 2;
        }
    }
    if (buf)
        buf[n] = 0;
    *len = n;
    return buf;
}

/* Writes s as a JSON string (UTF-8 kept, control characters escaped). */
static void put_json_string(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static int encode_one(const lmx_tokenizer *t, const char *s, size_t n, int flags)
{
    int32_t *ids = NULL;
    size_t k = 0;
    lmx_error err = {0};
    if (lmx_tokenizer_encode(t, s, n, flags, &ids, &k, &err) != LMX_OK) {
        fprintf(stderr, "lmx tokenize: %s\n", err.message);
        return 1;
    }
    fputc('[', stdout);
    for (size_t i = 0; i < k; i++)
        printf(i ? ", %d" : "%d", ids[i]);
    fputs("]\n", stdout);
    free(ids);
    return 0;
}

/* Each line of the input, without its newline: calls fn(line, len); stops at
 * the first failure. */
static int each_line(char *in, size_t len, int (*fn)(void *, char *, size_t), void *ctx)
{
    for (size_t at = 0; at < len;) {
        char *nl = memchr(in + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - in) : len;
        if (end > at && fn(ctx, in + at, end - at))
            return 1;
        at = end + 1;
    }
    return 0;
}

typedef struct line_ctx {
    const lmx_tokenizer *t;
    const opts *o;
    int line;
} line_ctx;

static int encode_line(void *ctx, char *s, size_t n)
{
    line_ctx *c = ctx;
    lmx_tokjson j = {s, s + n};
    lmx_tokbuf str = {0};
    c->line++;
    int bad = lmx_tokjson_string(&j, &str) || lmx_tokjson_peek(&j);
    if (bad)
        fprintf(stderr, "lmx tokenize: line %d is not one JSON string\n", c->line);
    else
        bad = encode_one(c->t, str.p, str.n, c->o->flags);
    lmx_tokbuf_free(&str);
    return bad;
}

static int decode_array(void *ctx, char *s, size_t n)
{
    line_ctx *c = ctx;
    cJSON *arr = cJSON_ParseWithLength(s, n);
    int bad = !cJSON_IsArray(arr);
    size_t k = bad ? 0 : (size_t)cJSON_GetArraySize(arr), i = 0;
    int32_t *ids = malloc((k + 1) * sizeof *ids);
    const cJSON *v;
    c->line++;
    if (!bad && ids)
        cJSON_ArrayForEach(v, arr) {
            bad |= !cJSON_IsNumber(v) || v->valuedouble != (double)v->valueint;
            ids[i++] = v->valueint;
        }
    char *text = NULL;
    size_t len = 0;
    lmx_error err = {0};
    if (bad || !ids)
        fprintf(stderr, "lmx detokenize: input %d is not a JSON array of ids\n", c->line);
    else if (lmx_tokenizer_decode(c->t, ids, k, c->o->skip, &text, &len, &err) != LMX_OK)
        fprintf(stderr, "lmx detokenize: %s\n", err.message), bad = 1;
    else
        put_json_string(stdout, text, len), fputc('\n', stdout);
    free(text);
    free(ids);
    cJSON_Delete(arr);
    return bad;
}

static int run(int argc, char **argv, int detok)
{
    opts o;
    if (parse_opts(argc, argv, detok, &o)) {
        fprintf(stderr, detok ? "usage: lmx detokenize DIR [--skip-special] [--jsonl]\n"
                              : "usage: lmx tokenize DIR [--no-special] [--plain-special] [--jsonl]\n");
        return 2;
    }
    lmx_tokenizer *t = NULL;
    lmx_error err = {0};
    if (lmx_tokenizer_load(o.dir, &t, &err) != LMX_OK) {
        fprintf(stderr, "lmx %s: %s\n", argv[0], err.message);
        return 1;
    }
    size_t len;
    char *in = read_all(stdin, &len);
    line_ctx c = {t, &o, 0};
    int rc = !in;
    if (in && !detok && !o.jsonl)
        rc = encode_one(t, in, len, o.flags);
    else if (in && !o.jsonl)
        rc = decode_array(&c, in, len);
    else if (in)
        rc = each_line(in, len, detok ? decode_array : encode_line, &c);
    free(in);
    lmx_tokenizer_free(t);
    return rc;
}

int cmd_tokenize(int argc, char **argv)
{
    return run(argc, argv, 0);
}

int cmd_detokenize(int argc, char **argv)
{
    return run(argc, argv, 1);
}
