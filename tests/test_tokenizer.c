/* The tokenizer against tokenizers 0.23.2 (tests/data/tokenizer_refs.json):
 * every encode row's ids with and without special tokens, both decodes,
 * streaming decode of every row, and the chat rows' prompt encodings. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "fileutil.h"
#include "testutil.h"
#include "tokenizer.h"

static int same_ids(const int32_t *a, size_t na, const cJSON *ref)
{
    if (!cJSON_IsArray(ref) || (size_t)cJSON_GetArraySize(ref) != na)
        return 0;
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, ref) {
        if (v->valueint != a[i++])
            return 0;
    }
    return 1;
}

static int32_t *ids_of(const cJSON *arr, size_t *n)
{
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *ids = malloc((*n + 1) * sizeof *ids);
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) ids[i++] = v->valueint;
    return ids;
}

static void check_encode(const lmx_tokenizer *t, const char *fam, int row, const char *text,
                         int flags, const cJSON *ref)
{
    int32_t *ids = NULL;
    size_t n = 0;
    lmx_error err = {0};
    lmx_status st = lmx_tokenizer_encode(t, text, strlen(text), flags, &ids, &n, &err);
    CHECK(st == LMX_OK, "%s row %d: encode failed: %s", fam, row, err.message);
    int ok = st == LMX_OK && same_ids(ids, n, ref);
    CHECK(ok, "%s row %d flags %d: ids differ for %.60s", fam, row, flags, text);
    if (!ok && getenv("TOK_VERBOSE")) {
        char *got = malloc(n * 12 + 2), *p = got;
        for (size_t i = 0; i < n; i++)
            p += sprintf(p, "%d ", ids[i]);
        char *want = cJSON_PrintUnformatted(ref);
        fprintf(stderr, "  got  %s\n  want %s\n", got, want);
        free(got);
        free(want);
    }
    free(ids);
}

static void check_decode(const lmx_tokenizer *t, const char *fam, int row, const int32_t *ids,
                         size_t n, int skip, const char *want)
{
    char *text = NULL;
    size_t len = 0;
    lmx_error err = {0};
    lmx_status st = lmx_tokenizer_decode(t, ids, n, skip, &text, &len, &err);
    CHECK(st == LMX_OK && len == strlen(want) && !strcmp(text, want),
          "%s row %d skip %d: decode gives \"%.60s\", want \"%.60s\" (%s)", fam, row, skip,
          text ? text : "", want, err.message);
    free(text);
}

/* 1 if the piece ends inside a UTF-8 character. */
static int cuts_char(const char *p, size_t n)
{
    size_t i = n, k = 0;
    while (i > 0 && k < 4 && ((unsigned char)p[i - 1] & 0xC0) == 0x80)
        i--, k++;
    if (i == 0)
        return k > 0;
    unsigned char c = (unsigned char)p[i - 1];
    size_t need = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    return need != k;
}

static void check_stream(const lmx_tokenizer *t, const char *fam, int row, const int32_t *ids,
                         size_t n, int skip, const char *want)
{
    lmx_detok *d = lmx_detok_new(t, skip);
    char *all = calloc(1, strlen(want) * 2 + 64);
    size_t at = 0, cap = strlen(want) * 2 + 60;
    int cut = 0, ok = d != NULL;
    for (size_t i = 0; ok && i <= n; i++) {
        const char *piece;
        size_t len;
        lmx_error err = {0};
        lmx_status st = i < n ? lmx_detok_push(d, ids[i], &piece, &len, &err)
                              : lmx_detok_flush(d, &piece, &len);
        ok = st == LMX_OK && at + len <= cap;
        if (ok && len) {
            cut |= cuts_char(piece, len);
            memcpy(all + at, piece, len);
            at += len;
        }
    }
    CHECK(ok && at == strlen(want) && !memcmp(all, want, at),
          "%s row %d skip %d: stream gives \"%.60s\", want \"%.60s\"", fam, row, skip, all, want);
    CHECK(!cut, "%s row %d: a streamed piece ends inside a character", fam, row);
    lmx_detok_free(d);
    free(all);
}

static void check_row(const lmx_tokenizer *t, const char *fam, int row, const cJSON *r)
{
    const char *text = cJSON_GetObjectItem(r, "text")->valuestring;
    const cJSON *ws = cJSON_GetObjectItem(r, "ids_with_special");
    const char *dec = cJSON_GetObjectItem(r, "decoded")->valuestring;
    const char *dec_skip = cJSON_GetObjectItem(r, "decoded_skip_special")->valuestring;
    check_encode(t, fam, row, text, 0, cJSON_GetObjectItem(r, "ids"));
    check_encode(t, fam, row, text, LMX_TOK_ADD_SPECIAL, ws);
    size_t n;
    int32_t *ids = ids_of(ws, &n);
    check_decode(t, fam, row, ids, n, 0, dec);
    check_decode(t, fam, row, ids, n, 1, dec_skip);
    check_stream(t, fam, row, ids, n, 0, dec);
    check_stream(t, fam, row, ids, n, 1, dec_skip);
    free(ids);
}

static void check_family(const cJSON *refs, const char *fam)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tokenizers/%s", LMX_TEST_DATA, fam);
    lmx_tokenizer *t = NULL;
    lmx_error err = {0};
    lmx_status st = lmx_tokenizer_load(dir, &t, &err);
    CHECK(st == LMX_OK, "%s: load failed: %s", fam, err.message);
    if (st != LMX_OK)
        return;
    const cJSON *fr = cJSON_GetObjectItem(refs, fam), *r;
    int row = 0;
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(fr, "encode")) == 100, "%s: 100 encode rows", fam);
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(fr, "encode")) check_row(t, fam, row++, r);
    row = 0;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(fr, "chat")) {
        check_encode(t, fam, 1000 + row, cJSON_GetObjectItem(r, "rendered")->valuestring, 0,
                     cJSON_GetObjectItem(r, "ids"));
        row++;
    }
    CHECK(row >= 8, "%s: chat rows present (%d)", fam, row);
    lmx_tokenizer_free(t);
}

int main(void)
{
    char *text = NULL;
    size_t len = 0;
    lmx_error err = {0};
    lmx_status st = lmx_read_file(LMX_TEST_DATA "/tokenizer_refs.json", &text, &len, &err);
    CHECK(st == LMX_OK, "refs: %s", err.message);
    cJSON *refs = st == LMX_OK ? cJSON_ParseWithLength(text, len) : NULL;
    CHECK(refs != NULL, "refs parse");
    if (refs) {
        check_family(refs, "qwen3");
        check_family(refs, "gemma3");
    }
    cJSON_Delete(refs);
    free(text);
    return test_finish();
}
