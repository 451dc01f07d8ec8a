/* safetensors: write/read round trips, shards, the real fixture, and one
 * case per malformed input, each checked for its status and message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"
#include "testutil.h"

static char *tmp_path(const char *name)
{
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", test_tmpdir(), name);
    return p;
}

static void make_dir(const char *name) { mkdir(tmp_path(name), 0700); }

static void write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(b, 1, n, f) == n, "cannot write %s", path);
    if (f)
        fclose(f);
}

/* A safetensors file with the given header text and data_len zero bytes. */
static void write_raw(const char *path, const char *header, size_t data_len)
{
    size_t h = strlen(header);
    uint8_t *b = calloc(1, 8 + h + data_len);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    write_bytes(path, b, 8 + h + data_len);
    free(b);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Checks the status and a message fragment of a failed call. */
#define EXPECT_FAIL(st, err, code, frag)                                                           \
    do {                                                                                           \
        CHECK((st) == (code), "status %s, want %s (%s)", lmx_status_name(st),                     \
              lmx_status_name(code), (err).message);                                               \
        CHECK(strstr((err).message, (frag)) != NULL, "message '%s' lacks '%s'", (err).message,     \
              (frag));                                                                             \
    } while (0)

/* Opens a file that must fail to load. */
static lmx_status open_bad(const char *path, lmx_error *err)
{
    lmx_st_set *s = (lmx_st_set *)1;
    memset(err, 0, sizeof *err);
    lmx_status st = lmx_st_open_file(path, &s, err);
    CHECK(s == NULL, "%s: set returned on failure", path);
    lmx_st_close(s);
    return st;
}

static lmx_status open_bad_dir(const char *dir, lmx_error *err)
{
    lmx_st_set *s = (lmx_st_set *)1;
    memset(err, 0, sizeof *err);
    lmx_status st = lmx_st_open_dir(dir, &s, err);
    CHECK(s == NULL, "%s: set returned on failure", dir);
    lmx_st_close(s);
    return st;
}

/* fill() callback: byte i of the stream is (i * 7 + 3) mod 251. */
static void fill_pattern(void *ctx, void *dst, size_t n)
{
    uint64_t *pos = ctx;
    uint8_t *d = dst;
    for (size_t i = 0; i < n; i++)
        d[i] = (uint8_t)((*pos + i) * 7 % 251 + 3);
    *pos += n;
}

static uint8_t pattern_at(uint64_t i) { return (uint8_t)(i * 7 % 251 + 3); }

static float f32_data[6] = {1, -2, 3.5f, 0, 1e-3f, 65504};
static uint16_t bf16_data[4] = {0x3f80, 0xc000, 0x0000, 0x7f80};
static int8_t i8_data[6] = {-128, -1, 0, 1, 2, 127};
static uint32_t u32_data[1] = {0xdeadbeefu};

static void check_roundtrip_set(const lmx_st_set *s, const char *label)
{
    CHECK(lmx_st_count(s) == 6, "%s: count %zu", label, lmx_st_count(s));
    for (size_t i = 1; i < lmx_st_count(s); i++)
        CHECK(strcmp(lmx_st_at(s, i - 1)->name, lmx_st_at(s, i)->name) < 0, "%s: not sorted at %zu",
              label, i);
    CHECK(lmx_st_at(s, 6) == NULL, "%s: at past end", label);
    CHECK(lmx_st_find(s, "nope") == NULL, "%s: found a missing tensor", label);

    const lmx_st_tensor *t = lmx_st_find(s, "a.f32");
    CHECK(t && t->dtype == LMX_DT_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 &&
              t->nbytes == 24 && memcmp(t->data, f32_data, 24) == 0,
          "%s: a.f32", label);
    t = lmx_st_find(s, "b.bf16");
    CHECK(t && t->dtype == LMX_DT_BF16 && t->ndim == 1 && t->shape[0] == 4 && t->nbytes == 8 &&
              memcmp(t->data, bf16_data, 8) == 0,
          "%s: b.bf16", label);
    t = lmx_st_find(s, "c.i8");
    CHECK(t && t->dtype == LMX_DT_I8 && t->ndim == 3 && t->shape[0] == 3 && t->shape[1] == 1 &&
              t->shape[2] == 2 && t->nbytes == 6 && memcmp(t->data, i8_data, 6) == 0,
          "%s: c.i8", label);
    t = lmx_st_find(s, "d.empty");
    CHECK(t && t->dtype == LMX_DT_F16 && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 5 &&
              t->nbytes == 0,
          "%s: d.empty", label);
    t = lmx_st_find(s, "e.scalar");
    CHECK(t && t->dtype == LMX_DT_U32 && t->ndim == 0 && t->nbytes == 4 &&
              memcmp(t->data, u32_data, 4) == 0,
          "%s: e.scalar", label);
    t = lmx_st_find(s, "f.filled");
    int ok = t && t->dtype == LMX_DT_U8 && t->ndim == 1 && t->shape[0] == 1000 && t->nbytes == 1000;
    for (uint64_t i = 0; ok && i < 1000; i++)
        ok = ((const uint8_t *)t->data)[i] == pattern_at(i);
    CHECK(ok, "%s: f.filled", label);
}

static void test_roundtrip(void)
{
    make_dir("rt");
    const char *path = tmp_path("rt/model.safetensors");
    uint64_t pos = 0;
    lmx_st_out o[6] = {
        {.name = "a.f32", .dtype = LMX_DT_F32, .ndim = 2, .shape = {2, 3}, .data = f32_data},
        {.name = "c.i8", .dtype = LMX_DT_I8, .ndim = 3, .shape = {3, 1, 2}, .data = i8_data},
        {.name = "b.bf16", .dtype = LMX_DT_BF16, .ndim = 1, .shape = {4}, .data = bf16_data},
        {.name = "d.empty", .dtype = LMX_DT_F16, .ndim = 2, .shape = {0, 5}},
        {.name = "e.scalar", .dtype = LMX_DT_U32, .ndim = 0, .data = u32_data},
        {.name = "f.filled", .dtype = LMX_DT_U8, .ndim = 1, .shape = {1000}, .fill = fill_pattern,
         .fill_ctx = &pos},
    };
    lmx_error err = {0};
    lmx_status st = lmx_st_write(path, o, 6, &err);
    CHECK(st == LMX_OK, "write: %s", err.message);
    CHECK(pos == 1000, "fill called for %llu bytes", (unsigned long long)pos);

    /* Layout as torch writes it: header padded to 8, metadata first, the
     * tensors in the order given, data right after the header. */
    FILE *f = fopen(path, "rb");
    uint8_t head[8] = {0};
    char json[1024] = {0};
    CHECK(f && fread(head, 1, 8, f) == 8, "read header length");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | head[i];
    CHECK(hlen % 8 == 0 && hlen < sizeof json, "header length %llu", (unsigned long long)hlen);
    CHECK(f && hlen < sizeof json && fread(json, 1, hlen, f) == hlen, "read header");
    if (f)
        fclose(f);
    const char *want = "{\"__metadata__\":{\"format\":\"pt\"},\"a.f32\":{\"dtype\":\"F32\",\"shape\":"
                       "[2,3],\"data_offsets\":[0,24]},\"c.i8\":{\"dtype\":\"I8\",\"shape\":[3,1,2],"
                       "\"data_offsets\":[24,30]},\"b.bf16\":";
    CHECK(strncmp(json, want, strlen(want)) == 0, "header starts %s", json);
    const char *close = strrchr(json, '}');
    size_t pad = close ? strlen(close + 1) : hlen;
    CHECK(close && pad < 8 && strspn(close + 1, " ") == pad, "header padding of %zu bytes", pad);
    CHECK(file_size(path) == (long)(8 + hlen + 24 + 6 + 8 + 0 + 4 + 1000), "file size %ld",
          file_size(path));

    lmx_st_set *s = NULL;
    st = lmx_st_open_file(path, &s, &err);
    CHECK(st == LMX_OK, "open_file: %s", err.message);
    if (s) {
        check_roundtrip_set(s, "open_file");
        CHECK(lmx_st_mapped_bytes(s) == (size_t)file_size(path), "mapped %zu",
              lmx_st_mapped_bytes(s));
        CHECK(strcmp(lmx_st_find(s, "a.f32")->file, path) == 0, "file %s",
              lmx_st_find(s, "a.f32")->file);
    }
    lmx_st_close(s);

    s = NULL;
    st = lmx_st_open_dir(tmp_path("rt"), &s, &err);
    CHECK(st == LMX_OK, "open_dir: %s", err.message);
    if (s)
        check_roundtrip_set(s, "open_dir");
    lmx_st_close(s);

    /* The same bytes through lmx_st_parse: names owned by the list. */
    char *buf = NULL;
    long n = file_size(path);
    f = fopen(path, "rb");
    buf = malloc((size_t)n);
    CHECK(f && buf && fread(buf, 1, (size_t)n, f) == (size_t)n, "reread");
    if (f)
        fclose(f);
    lmx_st_tensor *t = NULL;
    size_t nt = 0;
    st = lmx_st_parse((const uint8_t *)buf, (size_t)n, "mem", &t, &nt, &err);
    CHECK(st == LMX_OK && nt == 6, "parse: %s", err.message);
    CHECK(nt == 6 && strcmp(t[0].name, "a.f32") == 0 && t[0].data == buf + 8 + hlen &&
              strcmp(t[0].file, "mem") == 0,
          "parse: first tensor");
    lmx_st_free_tensors(t, nt);
    free(buf);
}

/* A fill()ed tensor over the 64 MiB chunk: the stream continues across chunks. */
static void test_large_fill(void)
{
    const char *path = tmp_path("large.safetensors");
    uint64_t pos = 0, n = ((uint64_t)64 << 20) + 3;
    lmx_st_out o = {.name = "big", .dtype = LMX_DT_U8, .ndim = 1, .shape = {(int64_t)n},
                    .fill = fill_pattern, .fill_ctx = &pos};
    lmx_error err = {0};
    CHECK(lmx_st_write(path, &o, 1, &err) == LMX_OK, "write large: %s", err.message);
    CHECK(pos == n, "filled %llu", (unsigned long long)pos);
    lmx_st_set *s = NULL;
    CHECK(lmx_st_open_file(path, &s, &err) == LMX_OK, "open large: %s", err.message);
    const lmx_st_tensor *t = lmx_st_find(s, "big");
    CHECK(t && t->nbytes == n, "large size");
    if (t && t->nbytes == n) {
        const uint8_t *d = t->data;
        uint64_t edge = (uint64_t)64 << 20, bad = 0;
        for (uint64_t i = edge - 1000; i < n; i++)
            bad += d[i] != pattern_at(i);
        CHECK(bad == 0 && d[0] == pattern_at(0), "large: %llu bytes differ near the chunk edge",
              (unsigned long long)bad);
    }
    lmx_st_close(s);
    unlink(path);
}

static void test_write_errors(void)
{
    lmx_error err = {0};
    lmx_st_out dup[2] = {
        {.name = "x", .dtype = LMX_DT_U8, .ndim = 1, .shape = {1}, .data = "a"},
        {.name = "x", .dtype = LMX_DT_U8, .ndim = 1, .shape = {1}, .data = "b"},
    };
    lmx_status st = lmx_st_write(tmp_path("dup.safetensors"), dup, 2, &err);
    EXPECT_FAIL(st, err, LMX_ERR_ARG, "tensor 'x' given twice");
    CHECK(!test_have_file(tmp_path("dup.safetensors")), "file left after a failed write");

    lmx_st_out neg = {.name = "n", .dtype = LMX_DT_U8, .ndim = 1, .shape = {-2}, .data = "a"};
    st = lmx_st_write(tmp_path("neg.safetensors"), &neg, 1, &err);
    EXPECT_FAIL(st, err, LMX_ERR_ARG, "tensor 'n': shape[0] = -2");

    lmx_st_out nodata = {.name = "z", .dtype = LMX_DT_F32, .ndim = 1, .shape = {2}};
    st = lmx_st_write(tmp_path("nodata.safetensors"), &nodata, 1, &err);
    EXPECT_FAIL(st, err, LMX_ERR_ARG, "neither data nor fill");

    st = lmx_st_write(tmp_path("no/such/dir/x.safetensors"), dup, 1, &err);
    EXPECT_FAIL(st, err, LMX_ERR_IO, "no/such/dir/x.safetensors: cannot create");
}

/* Writes one shard holding the named U8 [2] tensors. */
static void write_shard(const char *path, const char *const *names, int n)
{
    lmx_st_out o[4];
    for (int i = 0; i < n; i++)
        o[i] = (lmx_st_out){.name = names[i], .dtype = LMX_DT_U8, .ndim = 1, .shape = {2},
                            .data = names[i]};
    lmx_error err = {0};
    CHECK(lmx_st_write(path, o, (size_t)n, &err) == LMX_OK, "write shard: %s", err.message);
}

static void test_sharded(void)
{
    make_dir("sh");
    const char *a[] = {"w.b", "w.a"}, *b[] = {"w.c"};
    write_shard(tmp_path("sh/model-00001-of-00002.safetensors"), a, 2);
    write_shard(tmp_path("sh/model-00002-of-00002.safetensors"), b, 1);
    FILE *f = fopen(tmp_path("sh/model.safetensors.index.json"), "w");
    fputs("{\"metadata\": {\"total_size\": 6}, \"weight_map\": {"
          "\"w.a\": \"model-00001-of-00002.safetensors\","
          "\"w.b\": \"model-00001-of-00002.safetensors\","
          "\"w.c\": \"model-00002-of-00002.safetensors\"}}",
          f);
    fclose(f);
    lmx_st_set *s = NULL;
    lmx_error err = {0};
    lmx_status st = lmx_st_open_dir(tmp_path("sh"), &s, &err);
    CHECK(st == LMX_OK, "open sharded: %s", err.message);
    CHECK(lmx_st_count(s) == 3, "sharded count %zu", lmx_st_count(s));
    const char *want[] = {"w.a", "w.b", "w.c"};
    for (size_t i = 0; s && i < 3; i++) {
        const lmx_st_tensor *t = lmx_st_at(s, i);
        CHECK(t && strcmp(t->name, want[i]) == 0, "at(%zu) = %s", i, t ? t->name : "NULL");
        CHECK(t && t->nbytes == 2 && memcmp(t->data, want[i], 2) == 0, "%s data", want[i]);
        CHECK(t && lmx_st_find(s, want[i]) == t, "find %s", want[i]);
    }
    const lmx_st_tensor *c = lmx_st_find(s, "w.c");
    CHECK(c && strstr(c->file, "/model-00002-of-00002.safetensors"), "w.c in shard 2: %s",
          c ? c->file : "NULL");
    long total = file_size(tmp_path("sh/model-00001-of-00002.safetensors")) +
                 file_size(tmp_path("sh/model-00002-of-00002.safetensors"));
    CHECK(lmx_st_mapped_bytes(s) == (size_t)total, "sharded mapped %zu, want %ld",
          lmx_st_mapped_bytes(s), total);
    lmx_st_close(s);
}

static void test_fixture(void)
{
    lmx_st_set *s = NULL;
    lmx_error err = {0};
    const char *dir = LMX_TEST_DATA "/qwen3-tiny";
    CHECK(lmx_st_open_dir(dir, &s, &err) == LMX_OK, "fixture: %s", err.message);
    if (!s)
        return;
    /* Expected values from a manual header parse in Python. */
    CHECK(lmx_st_count(s) == 24, "fixture count %zu", lmx_st_count(s));
    CHECK(lmx_st_mapped_bytes(s) == 4898960, "fixture size %zu", lmx_st_mapped_bytes(s));
    const lmx_st_tensor *t = lmx_st_find(s, "model.embed_tokens.weight");
    CHECK(t && t->dtype == LMX_DT_BF16 && t->ndim == 2 && t->shape[0] == 151936 &&
              t->shape[1] == 16 && t->nbytes == 4861952,
          "embed_tokens");
    t = lmx_st_find(s, "model.norm.weight");
    CHECK(t && t->dtype == LMX_DT_BF16 && t->ndim == 1 && t->shape[0] == 16 && t->nbytes == 32,
          "norm");
    if (t) {
        uint16_t v[4];
        memcpy(v, t->data, sizeof v);
        CHECK(v[0] == 0x3f2d && v[1] == 0x3f8a && v[2] == 0x3fb0 && v[3] == 0x3f8b,
              "norm values %04x %04x %04x %04x", v[0], v[1], v[2], v[3]);
    }
    t = lmx_st_find(s, "model.layers.1.self_attn.q_proj.weight");
    CHECK(t && t->shape[0] == 128 && t->shape[1] == 16 && t->nbytes == 4096 &&
              ((const uint8_t *)t->data)[0] == 0x9c && ((const uint8_t *)t->data)[1] == 0xbd,
          "q_proj");
    CHECK(t && strcmp(t->file, LMX_TEST_DATA "/qwen3-tiny/model.safetensors") == 0, "fixture file %s",
          t ? t->file : "NULL");
    lmx_st_close(s);
}

/* Each malformed header, written as a file with data_len zero bytes. */
static void bad_header(const char *header, size_t data_len, lmx_status code, const char *frag)
{
    const char *path = tmp_path("bad.safetensors");
    write_raw(path, header, data_len);
    lmx_error err = {0};
    lmx_status st = open_bad(path, &err);
    EXPECT_FAIL(st, err, code, frag);
    CHECK(strstr(err.message, path) == err.message, "message '%s' does not start with the path",
          err.message);
}

static void test_bad_files(void)
{
    lmx_error err;
    lmx_status st = open_bad(tmp_path("missing.safetensors"), &err);
    EXPECT_FAIL(st, err, LMX_ERR_IO, "missing.safetensors: cannot open: No such file");

    make_dir("empty");
    st = open_bad_dir(tmp_path("empty"), &err);
    EXPECT_FAIL(st, err, LMX_ERR_IO, "empty: no model.safetensors or model.safetensors.index.json");

    /* Data cut off: a valid file loses its last bytes. */
    const char *trunc = tmp_path("trunc.safetensors");
    lmx_st_out o = {.name = "t", .dtype = LMX_DT_F32, .ndim = 1, .shape = {6}, .data = f32_data};
    CHECK(lmx_st_write(trunc, &o, 1, &err) == LMX_OK, "write: %s", err.message);
    CHECK(truncate(trunc, file_size(trunc) - 5) == 0, "truncate");
    st = open_bad(trunc, &err);
    EXPECT_FAIL(st, err, LMX_ERR_FORMAT, "tensor 't': data_offsets [0, 24] exceed the data section "
                                         "of 19 bytes");

    const char *tiny = tmp_path("tiny.safetensors");
    write_bytes(tiny, "\x10\0\0\0\0", 5);
    st = open_bad(tiny, &err);
    EXPECT_FAIL(st, err, LMX_ERR_FORMAT, "file is 5 bytes, shorter than the 8-byte header length");

    const char *big = tmp_path("biglen.safetensors");
    write_bytes(big, "\xe8\x03\0\0\0\0\0\0{\"a\":1}    \n", 20);
    st = open_bad(big, &err);
    EXPECT_FAIL(st, err, LMX_ERR_FORMAT, "header length 1000 exceeds file size 20");

    const char *huge = tmp_path("hugelen.safetensors");
    write_bytes(huge, "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10);
    st = open_bad(huge, &err);
    EXPECT_FAIL(st, err, LMX_ERR_FORMAT, "header length 18446744073709551615 exceeds file size 10");

    bad_header("{\"a\": {\"dtype\": ", 0, LMX_ERR_FORMAT, "header is not valid JSON");
    bad_header("", 0, LMX_ERR_FORMAT, "header is not valid JSON");
    bad_header("[1, 2]", 0, LMX_ERR_FORMAT, "header is not a JSON object");
    bad_header("{} x", 0, LMX_ERR_FORMAT, "header has bytes after the JSON value");
    bad_header("{\"x\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 2,
               LMX_ERR_FORMAT, "tensor 'x': data_offsets [0, 4] exceed the data section of 2 bytes");
    bad_header("{\"x\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]},"
               " \"y\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [2, 6]}}",
               8, LMX_ERR_FORMAT, "tensors 'x' [0, 4] and 'y' [2, 6] overlap");
    bad_header("{\"x\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]},"
               " \"y\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [7, 8]},"
               " \"z\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [8, 10]}}",
               10, LMX_ERR_FORMAT, "tensors 'x' [0, 8] and 'y' [7, 8] overlap");
    bad_header("{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 10]}}",
               16, LMX_ERR_FORMAT,
               "bad.safetensors: tensor 'model.norm.weight': data_offsets [0, 10] hold 10 bytes but "
               "shape [4] of F32 needs 16");
    bad_header("{\"x\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [4, 0]}}", 8,
               LMX_ERR_FORMAT, "tensor 'x': data_offsets [4, 0] end before they begin");
    bad_header("{\"x\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0]}}", 8,
               LMX_ERR_FORMAT, "tensor 'x': \"data_offsets\" missing or not a [begin, end] pair");
    bad_header("{\"x\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4.5]}}", 8,
               LMX_ERR_FORMAT, "tensor 'x': \"data_offsets\" are not non-negative integers");
    bad_header("{\"w\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8,
               LMX_ERR_UNSUPPORTED, "tensor 'w': dtype F64 is not supported");
    bad_header("{\"w\": {\"dtype\": \"F8_E4M3\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 8,
               LMX_ERR_UNSUPPORTED, "tensor 'w': dtype F8_E4M3 is not supported");
    bad_header("{\"w\": {\"dtype\": \"Q4\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 8,
               LMX_ERR_FORMAT, "tensor 'w': unknown dtype \"Q4\"");
    bad_header("{\"w\": {\"shape\": [1], \"data_offsets\": [0, 1]}}", 8, LMX_ERR_FORMAT,
               "tensor 'w': \"dtype\" missing");
    bad_header("{\"w\": {\"dtype\": \"U8\", \"shape\": [2, -1], \"data_offsets\": [0, 1]}}", 8,
               LMX_ERR_FORMAT, "tensor 'w': shape[1] is -1, not a non-negative integer");
    bad_header("{\"w\": {\"dtype\": \"U8\", \"shape\": [1.5], \"data_offsets\": [0, 1]}}", 8,
               LMX_ERR_FORMAT, "tensor 'w': shape[0] is 1.5, not a non-negative integer");
    bad_header("{\"w\": {\"dtype\": \"U8\", \"shape\": [\"2\"], \"data_offsets\": [0, 2]}}", 8,
               LMX_ERR_FORMAT, "tensor 'w': shape[0] is a string, not a non-negative integer");
    bad_header("{\"w\": {\"dtype\": \"U8\", \"shape\": 4, \"data_offsets\": [0, 4]}}", 8,
               LMX_ERR_FORMAT, "tensor 'w': \"shape\" missing or not an array");
    bad_header("{\"w\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}}",
               8, LMX_ERR_UNSUPPORTED, "tensor 'w': shape has 9 dims, at most 8");
    bad_header("{\"w\": {\"dtype\": \"U8\", \"shape\": [4294967296, 4294967296, 0],"
               " \"data_offsets\": [0, 0]}}",
               8, LMX_ERR_FORMAT, "tensor 'w': shape [4294967296, 4294967296] overflows");
    bad_header("{\"w\": {\"dtype\": \"F32\", \"shape\": [4611686018427387], \"data_offsets\": [0, 0]}}",
               8, LMX_ERR_FORMAT, "hold 0 bytes but shape [4611686018427387] of F32 needs");
    bad_header("{\"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
               " \"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}",
               8, LMX_ERR_FORMAT, "tensor 'w' appears twice in the header");
    bad_header("{\"w\": [1, 2]}", 8, LMX_ERR_FORMAT, "tensor 'w': entry is not an object");
    bad_header("{\"__metadata__\": {\"format\": 1}}", 0, LMX_ERR_FORMAT,
               "\"__metadata__\" entry 'format' is not a string");
    bad_header("{\"__metadata__\": []}", 0, LMX_ERR_FORMAT, "\"__metadata__\" is not an object");
}

/* Odd but valid: empty tensors anywhere, holes, whitespace padding. */
static void test_valid_edges(void)
{
    const char *path = tmp_path("edge.safetensors");
    write_raw(path,
              "{\"__metadata__\": {\"k\": \"v\"}, \"x\": {\"dtype\": \"U8\", \"shape\": [4],"
              " \"data_offsets\": [0, 4]}, \"e\": {\"dtype\": \"F32\", \"shape\": [3, 0],"
              " \"data_offsets\": [2, 2]}, \"y\": {\"dtype\": \"I32\", \"shape\": [1],"
              " \"data_offsets\": [8, 12]}}   \n",
              12);
    lmx_st_set *s = NULL;
    lmx_error err = {0};
    CHECK(lmx_st_open_file(path, &s, &err) == LMX_OK, "edge: %s", err.message);
    CHECK(lmx_st_count(s) == 3, "edge count %zu", lmx_st_count(s));
    const lmx_st_tensor *e = lmx_st_find(s, "e"), *y = lmx_st_find(s, "y");
    CHECK(e && e->nbytes == 0 && e->ndim == 2, "empty tensor inside another");
    CHECK(y && e && (const char *)y->data - (const char *)e->data == 6, "offsets kept");
    lmx_st_close(s);
}

/* Writes dir/model.safetensors.index.json with the given weight_map body. */
static void write_index(const char *dir, const char *map)
{
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp_path(dir));
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "create %s", path);
    if (f) {
        fprintf(f, "{\"metadata\": {}, \"weight_map\": {%s}}", map);
        fclose(f);
    }
}

static void test_bad_index(void)
{
    lmx_error err;
    make_dir("ix");
    const char *s1[] = {"w.a", "w.dup"}, *s2[] = {"w.dup"};
    write_shard(tmp_path("ix/s1.safetensors"), s1, 2);
    write_shard(tmp_path("ix/s2.safetensors"), s2, 1);
    const char *ix = tmp_path("ix");

    write_index("ix", "\"w.a\": \"s1.safetensors\", \"w.dup\": \"s2.safetensors\"");
    lmx_status st = open_bad_dir(ix, &err);
    EXPECT_FAIL(st, err, LMX_ERR_FORMAT, "tensor 'w.dup' is in both");
    CHECK(strstr(err.message, "s1.safetensors") && strstr(err.message, "s2.safetensors"),
          "duplicate names both shards: %s", err.message);

    write_index("ix", "\"w.a\": \"s1.safetensors\", \"w.b\": \"s3.safetensors\"");
    st = open_bad_dir(ix, &err);
    EXPECT_FAIL(st, err, LMX_ERR_IO, "s3.safetensors: cannot open: No such file");
    const char *index = tmp_path("ix/model.safetensors.index.json");
    CHECK(strncmp(err.message, index, strlen(index)) == 0, "missing shard names the index: %s",
          err.message);

    /* s1 alone holds w.a and w.dup; the map claims w.z is there too. */
    write_index("ix", "\"w.a\": \"s1.safetensors\", \"w.z\": \"s1.safetensors\"");
    st = open_bad_dir(ix, &err);
    EXPECT_FAIL(st, err, LMX_ERR_FORMAT,
                "tensor 'w.z' is mapped to shard 's1.safetensors', which does not hold it");

    write_index("ix", "\"w.a\": \"../ix/s1.safetensors\"");
    st = open_bad_dir(ix, &err);
    EXPECT_FAIL(st, err, LMX_ERR_FORMAT,
                "tensor 'w.a': shard '../ix/s1.safetensors' is not a plain file name");
    write_index("ix", "\"w.a\": \"..\"");
    st = open_bad_dir(ix, &err);
    EXPECT_FAIL(st, err, LMX_ERR_FORMAT, "shard '..' is not a plain file name");

    write_index("ix", "\"w.a\": 3");
    st = open_bad_dir(ix, &err);
    EXPECT_FAIL(st, err, LMX_ERR_FORMAT, "weight_map entry 'w.a' is not a string");

    write_index("ix", "");
    st = open_bad_dir(ix, &err);
    EXPECT_FAIL(st, err, LMX_ERR_FORMAT, "\"weight_map\" names no tensors");

    write_bytes(tmp_path("ix/model.safetensors.index.json"), "{\"weight_map\": {\"w.a\": ", 21);
    st = open_bad_dir(ix, &err);
    EXPECT_FAIL(st, err, LMX_ERR_FORMAT, "model.safetensors.index.json: not valid JSON");

    write_bytes(tmp_path("ix/model.safetensors.index.json"), "{\"weights\": {}}", 15);
    st = open_bad_dir(ix, &err);
    EXPECT_FAIL(st, err, LMX_ERR_FORMAT, "\"weight_map\" missing or not an object");

    /* A shard that is itself malformed: its error, prefixed by the index. */
    write_bytes(tmp_path("ix/s4.safetensors"), "\x02\0\0\0\0\0\0\0[]", 10);
    write_index("ix", "\"w.a\": \"s4.safetensors\"");
    st = open_bad_dir(ix, &err);
    EXPECT_FAIL(st, err, LMX_ERR_FORMAT, "s4.safetensors: header is not a JSON object");
}

int main(void)
{
    test_roundtrip();
    test_large_fill();
    test_write_errors();
    test_sharded();
    test_fixture();
    test_bad_files();
    test_valid_edges();
    test_bad_index();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", test_tmpdir());
    test_run(cmd, NULL);
    return test_finish();
}
