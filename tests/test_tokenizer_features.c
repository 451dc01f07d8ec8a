/* Tokenizer behaviours beyond the reference rows: components the real files
 * do not use (on small hand-checked tokenizers), special-token handling,
 * invalid UTF-8, accessors, streaming of arbitrary id sequences, threads. */
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "tok_regex.h"
#include "tokenizer.h"

static lmx_tokenizer *load_json(const char *json)
{
    lmx_tokenizer *t = NULL;
    lmx_error err = {0};
    lmx_status st = lmx_tokenizer_load_json(json, strlen(json), "inline.json", &t, &err);
    CHECK(st == LMX_OK, "load: %s", err.message);
    return t;
}

static lmx_tokenizer *load_dir(const char *fam)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tokenizers/%s", LMX_TEST_DATA, fam);
    lmx_tokenizer *t = NULL;
    lmx_error err = {0};
    CHECK(lmx_tokenizer_load(dir, &t, &err) == LMX_OK, "%s: %s", fam, err.message);
    return t;
}

/* Encodes text and compares with the n ids that follow. */
static void expect_ids(const lmx_tokenizer *t, const char *text, size_t len, int flags, int n, ...)
{
    int32_t *ids = NULL;
    size_t k = 0;
    lmx_error err = {0};
    lmx_status st = lmx_tokenizer_encode(t, text, len, flags, &ids, &k, &err);
    va_list ap;
    va_start(ap, n);
    int same = st == LMX_OK && k == (size_t)n;
    for (int i = 0; i < n; i++) {
        int want = va_arg(ap, int);
        same = same && ids[i] == want;
    }
    va_end(ap);
    char got[256] = "", *p = got;
    for (size_t i = 0; st == LMX_OK && i < k && i < 20; i++)
        p += snprintf(p, sizeof got - (size_t)(p - got), "%d ", ids[i]);
    CHECK(same, "encode \"%.40s\" flags %d: got [%s] (%s)", text, flags, got, err.message);
    free(ids);
}

static void expect_text(const lmx_tokenizer *t, const int32_t *ids, size_t n, int skip,
                        const char *want)
{
    char *text = NULL;
    size_t len = 0;
    lmx_error err = {0};
    lmx_status st = lmx_tokenizer_decode(t, ids, n, skip, &text, &len, &err);
    CHECK(st == LMX_OK && !strcmp(text, want), "decode skip %d: \"%s\", want \"%s\" (%s)", skip,
          text ? text : "", want, err.message);
    free(text);
}

/* Streams ids and checks the pieces concatenate to the full decode. */
static int stream_matches(const lmx_tokenizer *t, const int32_t *ids, size_t n, int skip)
{
    char *full = NULL;
    size_t flen = 0;
    if (lmx_tokenizer_decode(t, ids, n, skip, &full, &flen, NULL) != LMX_OK)
        return 0;
    lmx_detok *d = lmx_detok_new(t, skip);
    lmx_tokbuf got = {0};
    int ok = d != NULL;
    for (size_t i = 0; ok && i <= n; i++) {
        const char *piece;
        size_t len;
        ok = (i < n ? lmx_detok_push(d, ids[i], &piece, &len, NULL)
                    : lmx_detok_flush(d, &piece, &len)) == LMX_OK;
        ok = ok && !lmx_tokbuf_put(&got, piece, len);
        /* a piece never ends inside a character */
        ok = ok && (!len || lmx_tokutf8_valid(piece, len));
    }
    ok = ok && got.n == flen && !memcmp(got.p ? got.p : "", full, flen);
    lmx_detok_free(d);
    lmx_tokbuf_free(&got);
    free(full);
    return ok;
}

/* Metaspace, NFKC + Lowercase, a normalized added token with lstrip/rstrip,
 * fused unknowns, a string-form template. */
static const char SP_JSON[] =
    "{\"added_tokens\":["
    "{\"id\":0,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
    "{\"id\":9,\"content\":\"[M]\",\"special\":false,\"lstrip\":true,\"rstrip\":true,"
    "\"normalized\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},{\"type\":\"Lowercase\"}]},"
    "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"always\","
    "\"split\":true},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[\"<s>\",\"$A\"],"
    "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[0],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"always\"},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
    "\"vocab\":{\"<s>\":0,\"<unk>\":1,\"\\u2581\":2,\"a\":3,\"b\":4,\"\\u2581a\":5,\"ab\":6,"
    "\"\\u2581ab\":7,\"c\":8},\"merges\":[\"\\u2581 a\",\"a b\",\"\\u2581a b\"]}}";

static void test_metaspace(void)
{
    lmx_tokenizer *t = load_json(SP_JSON);
    if (!t)
        return;
    expect_ids(t, "AB ab", 5, 0, 2, 7, 7);
    expect_ids(t, "AB ab", 5, LMX_TOK_ADD_SPECIAL, 3, 0, 7, 7);
    expect_ids(t, "\xEF\xBC\xA1\xEF\xBD\x82", 6, 0, 1, 7); /* fullwidth "Ab" -> NFKC "Ab" */
    expect_ids(t, "xy", 2, 0, 2, 2, 1);                     /* unknowns fused */
    expect_ids(t, "a [M] b", 7, 0, 4, 5, 9, 2, 4);          /* normalized "[m]", spaces stripped */
    int32_t ids[] = {0, 7, 7};
    expect_text(t, ids, 3, 0, "<s> ab ab");
    expect_text(t, ids, 3, 1, "ab ab");
    CHECK(stream_matches(t, ids, 3, 0) && stream_matches(t, ids, 3, 1), "metaspace stream");
    lmx_tokenizer_free(t);
}

/* Whitespace + Digits pre-tokenizers, ignore_merges, no decoder (joined by
 * spaces), Bert-style post-processor. */
static const char WS_JSON[] =
    "{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Whitespace\"},"
    "{\"type\":\"Digits\",\"individual_digits\":true}]},"
    "\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":[\"s\",6],\"cls\":[\"c\",5]},"
    "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,"
    "\"vocab\":{\"h\":0,\"i\":1,\"1\":2,\"2\":3,\"!\":4,\"c\":5,\"s\":6,\"hi\":7,\"hih\":8},"
    "\"merges\":[[\"h\",\"i\"]]}}";

static void test_whitespace(void)
{
    lmx_tokenizer *t = load_json(WS_JSON);
    if (!t)
        return;
    expect_ids(t, "hi  12!", 7, 0, 4, 7, 2, 3, 4);
    expect_ids(t, "hi", 2, LMX_TOK_ADD_SPECIAL, 3, 5, 7, 6);
    expect_ids(t, "hih", 3, 0, 1, 8); /* ignore_merges: a whole-word token wins */
    int32_t ids[] = {7, 2, 4};
    expect_text(t, ids, 3, 0, "hi 1 !");
    lmx_tokenizer_free(t);
}

/* Llama-2/Mistral style: Prepend + Replace normalizer, byte fallback, and
 * the decoder Replace, ByteFallback, Fuse, Strip. */
static const char LL_JSON[] =
    "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":"
    "\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
    "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\","
    "\"vocab\":{\"<unk>\":0,\"<0xC3>\":1,\"<0xA9>\":2,\"\\u2581\":3,\"h\":4,\"\\u2581h\":5,\"i\":6,"
    "\"\\u2581hi\":7},\"merges\":[\"\\u2581 h\",\"\\u2581h i\"]}}";

static void test_byte_fallback(void)
{
    lmx_tokenizer *t = load_json(LL_JSON);
    if (!t)
        return;
    expect_ids(t, "hi \xC3\xA9", 5, 0, 4, 7, 3, 1, 2);
    int32_t ids[] = {7, 3, 1, 2}, bad[] = {7, 1, 7};
    expect_text(t, ids, 4, 0, "hi \xC3\xA9");
    expect_text(t, bad, 3, 0, "hi\xEF\xBF\xBD hi"); /* a lone byte: one U+FFFD per byte */
    CHECK(stream_matches(t, ids, 4, 0), "byte fallback stream");
    CHECK(stream_matches(t, bad, 3, 0), "byte fallback stream, invalid run");
    lmx_tokenizer_free(t);
}

/* GPT-2 style: ByteLevel with its own regex and a prefix space. */
static const char BL_JSON[] =
    "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\u0120\":0,\"a\":1,\"b\":2,\"\\u0120a\":3,\"1\":4,"
    "\"\\u0120ab\":5},\"merges\":[\"\\u0120 a\",\"\\u0120a b\"]}}";

static void test_bytelevel_regex(void)
{
    lmx_tokenizer *t = load_json(BL_JSON);
    if (!t)
        return;
    expect_ids(t, "ab a1", 5, 0, 3, 5, 3, 4); /* " ab", " a", "1" */
    int32_t ids[] = {5, 3, 4};
    expect_text(t, ids, 3, 0, " ab a1");
    lmx_tokenizer_free(t);
}

static void test_real_specials(void)
{
    lmx_tokenizer *q = load_dir("qwen3"), *g = load_dir("gemma3");
    if (!q || !g) {
        lmx_tokenizer_free(q);
        lmx_tokenizer_free(g);
        return;
    }
    const char *s = "<|im_start|>user";
    expect_ids(q, s, strlen(s), 0, 2, 151644, 872);
    /* plain: the control string is ordinary text */
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(lmx_tokenizer_encode(q, s, strlen(s), LMX_TOK_PLAIN_SPECIAL, &ids, &n, NULL) == LMX_OK &&
          n > 2, "plain special splits into text tokens");
    for (size_t i = 0; i < n; i++)
        CHECK(!lmx_tokenizer_is_special(q, ids[i]), "no special id in plain encoding");
    char *text = NULL;
    CHECK(lmx_tokenizer_decode(q, ids, n, 1, &text, NULL, NULL) == LMX_OK && !strcmp(text, s),
          "plain special round-trips even when skipping specials");
    free(text);
    free(ids);
    /* non-special added tokens stay tokens in plain mode */
    expect_ids(q, "<think>", 7, LMX_TOK_PLAIN_SPECIAL, 1, 151667);
    CHECK(lmx_tokenizer_encode(g, "<bos>", 5, LMX_TOK_PLAIN_SPECIAL | LMX_TOK_ADD_SPECIAL, &ids,
                               &n, NULL) == LMX_OK && n > 2 && ids[0] == 2,
          "gemma: template <bos>, then text");
    for (size_t i = 1; i < n; i++)
        CHECK(ids[i] != 2, "gemma: a typed <bos> is not the control token");
    free(ids);

    CHECK(lmx_tokenizer_token_id(q, "<|im_start|>") == 151644, "qwen im_start id");
    CHECK(lmx_tokenizer_token_id(q, "hello") == 14990, "qwen vocab lookup");
    CHECK(lmx_tokenizer_token_id(q, "no such token") == -1, "absent token");
    CHECK(lmx_tokenizer_is_special(q, 151645) && !lmx_tokenizer_is_special(q, 151667) &&
          !lmx_tokenizer_is_special(q, 9707), "qwen special flags");
    CHECK(lmx_tokenizer_vocab_size(q) == 151669, "qwen vocab size %d", lmx_tokenizer_vocab_size(q));
    CHECK(lmx_tokenizer_vocab_size(g) == 262145, "gemma vocab size %d", lmx_tokenizer_vocab_size(g));
    CHECK(lmx_tokenizer_bos_id(q) == -1 && lmx_tokenizer_eos_id(q) == 151645, "qwen bos/eos");
    CHECK(lmx_tokenizer_bos_id(g) == 2 && lmx_tokenizer_eos_id(g) == 106, "gemma bos/eos");
    CHECK(lmx_tokenizer_chat_template(q) && strstr(lmx_tokenizer_chat_template(q), "<|im_start|>"),
          "qwen chat template");
    CHECK(lmx_tokenizer_chat_template(g) && strstr(lmx_tokenizer_chat_template(g), "<start_of_turn>"),
          "gemma chat template");
    int32_t out_of_range = 262145;
    CHECK(lmx_tokenizer_decode(g, &out_of_range, 1, 0, &text, NULL, NULL) == LMX_ERR_RANGE,
          "decode of an unknown id");
    lmx_tokenizer_free(q);
    lmx_tokenizer_free(g);
}

/* Invalid UTF-8 encodes as if each ill-formed sequence were U+FFFD. */
static void test_invalid_utf8(void)
{
    const char *fams[] = {"qwen3", "gemma3"};
    const char *bad[] = {"a\377b", "\xE6\x97", "x\xC0\xAF\xED\xA0\x80y", "\xF4\x90\x80\x80"};
    const char *good[] = {"a\357\277\275b", "\xEF\xBF\xBD", "x\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDy",
                          "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"};
    for (int f = 0; f < 2; f++) {
        lmx_tokenizer *t = load_dir(fams[f]);
        for (int i = 0; t && i < 4; i++) {
            int32_t *a = NULL, *b = NULL;
            size_t na = 0, nb = 0;
            CHECK(lmx_tokenizer_encode(t, bad[i], strlen(bad[i]), 0, &a, &na, NULL) == LMX_OK &&
                  lmx_tokenizer_encode(t, good[i], strlen(good[i]), 0, &b, &nb, NULL) == LMX_OK &&
                  na == nb && na > 0 && !memcmp(a, b, na * sizeof *a),
                  "%s: invalid UTF-8 case %d reads as U+FFFD", fams[f], i);
            free(a);
            free(b);
        }
        lmx_tokenizer_free(t);
    }
}

/* Random id sequences, weighted to byte tokens and specials, stream exactly. */
static void test_random_streams(void)
{
    const char *fams[] = {"qwen3", "gemma3"};
    unsigned seed = 12345;
    for (int f = 0; f < 2; f++) {
        lmx_tokenizer *t = load_dir(fams[f]);
        if (!t)
            continue;
        int vocab = lmx_tokenizer_vocab_size(t), bad = 0;
        for (int r = 0; r < 300; r++) {
            int32_t ids[24];
            for (int i = 0; i < 24; i++) {
                seed = seed * 1103515245u + 12345u;
                unsigned x = seed >> 8;
                /* Gemma: <0x00>..<0xFF> are 238..493; Qwen: 0..255 are single bytes */
                ids[i] = x % 4 == 0 ? (int32_t)(f ? 238 + (x / 4) % 256 : (x / 4) % 256)
                         : x % 4 == 1 ? (int32_t)((x / 4) % 8 + (f ? 0 : 151643))
                                      : (int32_t)((x / 4) % (unsigned)vocab);
            }
            bad += !stream_matches(t, ids, 24, r & 1);
        }
        CHECK(bad == 0, "%s: %d of 300 random streams differ from the full decode", fams[f], bad);
        lmx_tokenizer_free(t);
    }
}

/* Regexes mean what Oniguruma (tokenizers' engine) makes of them. */
static void expect_matches(const char *pat, const char *text, size_t n, ...)
{
    lmx_tokre *re = NULL;
    lmx_tokspans sp = {0};
    int ok = lmx_tokre_compile(pat, strlen(pat), 0, &re, NULL) == LMX_OK &&
             lmx_tokre_find_all(re, text, strlen(text), &sp, NULL) == LMX_OK && sp.n == n;
    va_list ap;
    va_start(ap, n);
    for (size_t i = 0; ok && i < 2 * n; i++)
        ok = sp.p[i] == (size_t)va_arg(ap, int);
    va_end(ap);
    CHECK(ok, "regex /%s/ on \"%s\": %zu matches", pat, text, sp.n);
    lmx_tokspans_free(&sp);
    lmx_tokre_free(re);
}

static void test_regex(void)
{
    expect_matches("\\w+", "a\302\262b c", 2, 0, 4, 5, 6);  /* U+00B2 (No) is a word char */
    expect_matches("\\s", "a\341\240\216b", 0);            /* U+180E is no space */
    expect_matches("\\s", "a\302\205b\343\200\200", 2, 1, 3, 4, 7); /* NEL, ideographic space */
    expect_matches("[^\\s\\p{L}]+", "ab 12\xC2\xA0", 1, 3, 5);
    expect_matches("x*", "ab", 3, 0, 0, 1, 1, 2, 2); /* empty matches, as Oniguruma's find_iter */
    expect_matches("(?i:'s)", "IT'S", 1, 2, 4);
}

typedef struct job {
    const lmx_tokenizer *t;
    uint32_t sum;
    int ok;
} job;

static void *encode_many(void *arg)
{
    job *j = arg;
    const char *text = "The quick brown fox 日本語 😀 <|im_start|> 12345 \n\n  code();";
    j->ok = 1;
    for (int i = 0; i < 300; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        j->ok &= lmx_tokenizer_encode(j->t, text, strlen(text), LMX_TOK_ADD_SPECIAL, &ids, &n, NULL) == LMX_OK;
        uint32_t s = 0;
        for (size_t k = 0; k < n; k++)
            s = s * 31 + (uint32_t)ids[k];
        if (i == 0)
            j->sum = s;
        j->ok &= s == j->sum;
        free(ids);
    }
    return NULL;
}

static void test_threads(void)
{
    lmx_tokenizer *t = load_dir("gemma3");
    if (!t)
        return;
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){t, 0, 0};
        pthread_create(&th[i], NULL, encode_many, &jobs[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        CHECK(jobs[i].ok && jobs[i].sum == jobs[0].sum, "thread %d agrees", i);
    lmx_tokenizer_free(t);
}

int main(void)
{
    test_metaspace();
    test_whitespace();
    test_byte_fallback();
    test_bytelevel_regex();
    test_regex();
    test_real_specials();
    test_invalid_utf8();
    test_random_streams();
    test_threads();
    return test_finish();
}
