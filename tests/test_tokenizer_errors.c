/* Malformed and unsupported tokenizer.json files fail with a clear error
 * that names what is wrong. */
#include <string.h>

#include "testutil.h"
#include "tokenizer.h"

static void expect_fail(const char *json, lmx_status code, const char *needle)
{
    lmx_tokenizer *t = (lmx_tokenizer *)1;
    lmx_error err = {0};
    lmx_status st = lmx_tokenizer_load_json(json, strlen(json), "t.json", &t, &err);
    CHECK(st == code, "status %d, want %d for %.80s (%s)", st, code, json, err.message);
    CHECK(t == NULL, "no tokenizer on failure for %.60s", json);
    CHECK(strstr(err.message, needle) != NULL, "message \"%s\" lacks \"%s\"", err.message, needle);
    CHECK(strstr(err.message, "t.json") != NULL, "message \"%s\" names the file", err.message);
}

#define MODEL(vocab, merges) "{\"model\":{\"type\":\"BPE\",\"vocab\":" vocab ",\"merges\":" merges "}"
#define GOOD_MODEL MODEL("{\"a\":0,\"b\":1,\"ab\":2}", "[\"a b\"]")

int main(void)
{
    expect_fail("hello", LMX_ERR_FORMAT, "not a JSON object");
    expect_fail("", LMX_ERR_FORMAT, "not a JSON object");
    expect_fail("{\"version\": \"1.0\"}", LMX_ERR_FORMAT, "no \"model\"");
    expect_fail("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", LMX_ERR_FORMAT,
                "lacks merges");
    expect_fail(GOOD_MODEL, LMX_ERR_FORMAT, "malformed JSON"); /* unclosed */
    expect_fail(GOOD_MODEL "} trailing", LMX_ERR_FORMAT, "malformed JSON");
    expect_fail(MODEL("{\"a\":0,\"b\":1,\"ab\":2}", "[\"a c\"]") "}", LMX_ERR_FORMAT,
                "unknown token \"c\"");
    expect_fail(MODEL("{\"a\":0,\"b\":1,\"ab\":2}", "[[\"x\", \"b\"]]") "}", LMX_ERR_FORMAT,
                "unknown token \"x\"");
    expect_fail(MODEL("{\"a\":0,\"b\":1}", "[\"a b\"]") "}", LMX_ERR_FORMAT,
                "merged token \"ab\" is not in the vocab");
    expect_fail(MODEL("{\"a\":0,\"b\":1}", "[\"a b c\"]") "}", LMX_ERR_FORMAT, "is not \"a b\"");
    expect_fail(MODEL("{\"a\":0,\"b\":0}", "[]") "}", LMX_ERR_FORMAT, "duplicate id 0");
    expect_fail(MODEL("{\"a\":0,\"a\":1}", "[]") "}", LMX_ERR_FORMAT, "duplicate token \"a\"");
    expect_fail(MODEL("{\"a\":-1}", "[]") "}", LMX_ERR_FORMAT, "out of range");
    expect_fail(MODEL("{\"a\":99999999999}", "[]") "}", LMX_ERR_FORMAT, "out of range");
    expect_fail(MODEL("{\"a\":1.5}", "[]") "}", LMX_ERR_FORMAT, "bad id");
    /* ids far beyond the number of tokens would size tables by the id */
    expect_fail(MODEL("{\"a\":0,\"b\":9000000}", "[]") "}", LMX_ERR_FORMAT,
                "ids out of range (largest 9000000 for 2 tokens)");
    expect_fail(MODEL("{\"a\":0}", "[]") ",\"added_tokens\":[{\"id\":9000000,\"content\":\"x\"}]}",
                LMX_ERR_FORMAT, "added_tokens: id 9000000 out of range");
    expect_fail("{\"model\":{\"vocab\":{\"a\":0},\"vocab\":{\"a\":0},\"merges\":[]}}",
                LMX_ERR_FORMAT, "model.vocab given twice");
    expect_fail(MODEL("{\"a\":0}", "[]") ",\"added_tokens\":[{\"id\":-3,\"content\":\"x\"}]}",
                LMX_ERR_FORMAT, "out of range");
    expect_fail(MODEL("{\"a\":0}", "[]") ",\"added_tokens\":[{\"id\":5,\"content\":\"x\"},"
                "{\"id\":5,\"content\":\"y\"}]}", LMX_ERR_FORMAT, "duplicate id 5");
    expect_fail("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", LMX_ERR_UNSUPPORTED, "Unigram");
    expect_fail(GOOD_MODEL ",\"normalizer\":{\"type\":\"Precompiled\"}}", LMX_ERR_UNSUPPORTED,
                "normalizer \"Precompiled\"");
    expect_fail(GOOD_MODEL ",\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"}}",
                LMX_ERR_UNSUPPORTED, "pre_tokenizer \"BertPreTokenizer\"");
    expect_fail(GOOD_MODEL ",\"decoder\":{\"type\":\"WordPiece\"}}", LMX_ERR_UNSUPPORTED,
                "decoder \"WordPiece\"");
    expect_fail(GOOD_MODEL ",\"post_processor\":{\"type\":\"Magic\"}}", LMX_ERR_UNSUPPORTED,
                "post_processor \"Magic\"");
    expect_fail(GOOD_MODEL ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
                "\"behavior\":\"Isolated\"}}", LMX_ERR_UNSUPPORTED, "regex \"(\"");
    expect_fail(GOOD_MODEL ",\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":"
                "[\"<s>\",\"$A\"],\"special_tokens\":{\"<s>\":{\"ids\":[7]}}}}",
                LMX_ERR_FORMAT, "post_processor adds id 7, which is no token");
    expect_fail(GOOD_MODEL ",\"decoder\":{\"type\":\"Sequence\"}}", LMX_ERR_FORMAT,
                "lacks \"decoders\"");
    expect_fail(GOOD_MODEL ",\"normalizer\":[1,}", LMX_ERR_FORMAT, "malformed JSON");

    /* a well-formed minimal file loads */
    lmx_tokenizer *t = NULL;
    lmx_error err = {0};
    const char *ok = GOOD_MODEL "}";
    CHECK(lmx_tokenizer_load_json(ok, strlen(ok), "ok.json", &t, &err) == LMX_OK, "%s", err.message);
    CHECK(lmx_tokenizer_vocab_size(t) == 3, "vocab size 3");
    lmx_tokenizer_free(t);

    /* a missing directory is an I/O error naming the path */
    t = NULL;
    CHECK(lmx_tokenizer_load("/nonexistent/dir", &t, &err) == LMX_ERR_IO && !t, "missing dir");
    CHECK(strstr(err.message, "/nonexistent/dir/tokenizer.json") != NULL, "names %s", err.message);
    return test_finish();
}
