/* lmx tokenize / detokenize against the reference rows: plain text in, the
 * JSON id array out (with and without special tokens, --jsonl), and back. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "fileutil.h"
#include "testutil.h"

static char *write_tmp(const char *name, const char *text)
{
    char *path = lmx_path_join(test_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "open %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return path;
}

/* Runs `lmx ARGS < input` and returns stdout parsed as JSON (caller frees). */
static cJSON *run_json(const char *args, const char *input_path)
{
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s %s < %s", LMX_BIN, args, input_path);
    int rc = test_run(cmd, &out);
    CHECK(rc == 0, "%s exits %d", cmd, rc);
    cJSON *j = out ? cJSON_Parse(out) : NULL;
    CHECK(j != NULL, "%s prints JSON: %.80s", cmd, out ? out : "");
    free(out);
    return j;
}

static int same(const cJSON *a, const cJSON *b)
{
    return a && b && cJSON_Compare(a, b, 1);
}

static void check_family(const cJSON *refs, const char *fam)
{
    char dir[512], args[700];
    snprintf(dir, sizeof dir, "%s/tokenizers/%s", LMX_TEST_DATA, fam);
    const cJSON *rows = cJSON_GetObjectItem(cJSON_GetObjectItem(refs, fam), "encode");
    /* row 7: plain prose; row 29: a text with special-token strings */
    int picks[] = {7, 29};
    for (int k = 0; k < 2; k++) {
        const cJSON *r = cJSON_GetArrayItem(rows, picks[k]);
        char *in = write_tmp("tok_in.txt", cJSON_GetObjectItem(r, "text")->valuestring);
        snprintf(args, sizeof args, "tokenize %s", dir);
        cJSON *ids = run_json(args, in);
        CHECK(same(ids, cJSON_GetObjectItem(r, "ids_with_special")), "%s row %d with special", fam,
              picks[k]);
        cJSON_Delete(ids);
        snprintf(args, sizeof args, "tokenize %s --no-special", dir);
        ids = run_json(args, in);
        CHECK(same(ids, cJSON_GetObjectItem(r, "ids")), "%s row %d --no-special", fam, picks[k]);
        cJSON_Delete(ids);
        free(in);
        char *arr = cJSON_PrintUnformatted(cJSON_GetObjectItem(r, "ids_with_special"));
        in = write_tmp("tok_ids.json", arr);
        snprintf(args, sizeof args, "detokenize %s --skip-special", dir);
        cJSON *text = run_json(args, in);
        CHECK(cJSON_IsString(text) &&
              !strcmp(text->valuestring, cJSON_GetObjectItem(r, "decoded_skip_special")->valuestring),
              "%s row %d detokenize --skip-special", fam, picks[k]);
        cJSON_Delete(text);
        free(arr);
        free(in);
    }
}

/* --jsonl both ways, and --plain-special, on Qwen3. */
static void check_jsonl(void)
{
    char dir[512], cmd[2048], *out = NULL;
    snprintf(dir, sizeof dir, "%s/tokenizers/qwen3", LMX_TEST_DATA);
    char *in = write_tmp("tok_lines.jsonl", "\"<|im_start|>user\"\n\"Hello, world!\"\n");
    snprintf(cmd, sizeof cmd, "%s tokenize %s --jsonl < %s", LMX_BIN, dir, in);
    CHECK(test_run(cmd, &out) == 0 && out && !strcmp(out, "[151644, 872]\n[9707, 11, 1879, 0]\n"),
          "tokenize --jsonl: %s", out ? out : "");
    free(out);
    out = NULL;
    snprintf(cmd, sizeof cmd, "%s tokenize %s --jsonl --plain-special < %s", LMX_BIN, dir, in);
    CHECK(test_run(cmd, &out) == 0 && out && strncmp(out, "[151644", 7) && strstr(out, "\n[9707, 11"),
          "--plain-special keeps <|im_start|> as text: %s", out ? out : "");
    free(out);
    free(in);
    out = NULL;
    in = write_tmp("tok_ids.jsonl", "[151644, 872]\n[9707, 11, 1879, 0]\n");
    snprintf(cmd, sizeof cmd, "%s detokenize %s --jsonl < %s", LMX_BIN, dir, in);
    CHECK(test_run(cmd, &out) == 0 && out && !strcmp(out, "\"<|im_start|>user\"\n\"Hello, world!\"\n"),
          "detokenize --jsonl: %s", out ? out : "");
    free(out);
    free(in);
    snprintf(cmd, sizeof cmd, "%s tokenize /nonexistent-dir < /dev/null", LMX_BIN);
    CHECK(test_run(cmd, NULL) == 1, "tokenize without a tokenizer fails");
}

int main(void)
{
    char *text = NULL;
    size_t len = 0;
    lmx_error err = {0};
    CHECK(lmx_read_file(LMX_TEST_DATA "/tokenizer_refs.json", &text, &len, &err) == LMX_OK, "%s",
          err.message);
    cJSON *refs = text ? cJSON_ParseWithLength(text, len) : NULL;
    CHECK(refs != NULL, "refs parse");
    if (refs) {
        check_family(refs, "qwen3");
        check_family(refs, "gemma3");
    }
    check_jsonl();
    cJSON_Delete(refs);
    free(text);
    return test_finish();
}
