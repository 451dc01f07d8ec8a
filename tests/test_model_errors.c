/* Bad checkpoints and bad calls: each gives an error status and a message
 * naming the file, tensor or field at fault, without a crash or a leak. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lmx.h"
#include "safetensors.h"
#include "testutil.h"

#define SRC LMX_TEST_DATA "/qwen3-small"

static char *dir_for(const char *label)
{
    static char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), label);
    mkdir(dir, 0755);
    return dir;
}

static void copy_file(const char *from, const char *dir, const char *name)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/%s'", from, dir, name);
    CHECK(system(cmd) == 0, "%s", cmd);
}

/* Writes SRC's config.json into dir after `edit` changes it. */
static void write_config(const char *dir, void (*edit)(cJSON *))
{
    FILE *f = fopen(SRC "/config.json", "rb");
    char buf[8192];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    cJSON *c = cJSON_Parse(buf);
    if (edit)
        edit(c);
    char *text = cJSON_Print(c), path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
    free(text);
    cJSON_Delete(c);
}

/* Loads dir and expects failure with `code` and every needle in the message. */
static void expect_load_error(const char *label, const char *dir, lmx_status code, const char *n1,
                              const char *n2)
{
    lmx_error err = {0};
    lmx_model *m = lmx_load(dir, NULL, &err);
    CHECK(m == NULL, "%s: loaded", label);
    lmx_close(m);
    CHECK(err.code == code, "%s: status %s, want %s (%s)", label, lmx_status_name(err.code),
          lmx_status_name(code), err.message);
    CHECK(strstr(err.message, n1) != NULL, "%s: message '%s' lacks '%s'", label, err.message, n1);
    if (n2)
        CHECK(strstr(err.message, n2) != NULL, "%s: message '%s' lacks '%s'", label, err.message, n2);
}

static void set_type_llama(cJSON *c) { cJSON_ReplaceItemInObject(c, "model_type", cJSON_CreateString("llama")); }
static void drop_hidden(cJSON *c) { cJSON_DeleteItemFromObject(c, "hidden_size"); }
static void zero_layers(cJSON *c) { cJSON_ReplaceItemInObject(c, "num_hidden_layers", cJSON_CreateNumber(0)); }
static void odd_heads(cJSON *c) { cJSON_ReplaceItemInObject(c, "num_attention_heads", cJSON_CreateNumber(3)); }
static void small_head_dim(cJSON *c) { cJSON_ReplaceItemInObject(c, "head_dim", cJSON_CreateNumber(64)); }
static void big_inter(cJSON *c) { cJSON_ReplaceItemInObject(c, "intermediate_size", cJSON_CreateNumber(512)); }
static void yarn(cJSON *c)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "rope_type", "yarn");
    cJSON_AddNumberToObject(r, "factor", 4);
    cJSON_ReplaceItemInObject(c, "rope_scaling", r);
}
static void string_layers(cJSON *c) { cJSON_ReplaceItemInObject(c, "num_hidden_layers", cJSON_CreateString("3")); }

static void config_errors(void)
{
    expect_load_error("missing dir", "/nonexistent/model", LMX_ERR_IO, "/nonexistent/model/config.json", NULL);

    char *d = dir_for("no-config");
    expect_load_error("no config", d, LMX_ERR_IO, "config.json", NULL);

    d = dir_for("no-weights");
    write_config(d, NULL);
    expect_load_error("no weights", d, LMX_ERR_IO, "model.safetensors", NULL);

    struct {
        const char *label;
        void (*edit)(cJSON *);
        lmx_status code;
        const char *n1, *n2;
    } cases[] = {
        {"unknown model_type", set_type_llama, LMX_ERR_UNSUPPORTED, "'llama'", "qwen3, gemma3_text, gemma3"},
        {"missing hidden_size", drop_hidden, LMX_ERR_FORMAT, "hidden_size", "missing"},
        {"zero layers", zero_layers, LMX_ERR_FORMAT, "num_hidden_layers", "out of range"},
        {"heads do not divide", odd_heads, LMX_ERR_FORMAT, "num_attention_heads = 3", "num_key_value_heads = 2"},
        {"head_dim vs weights", small_head_dim, LMX_ERR_FORMAT, "layers.0.self_attn.q_proj.weight", "[256, 128]"},
        {"intermediate vs weights", big_inter, LMX_ERR_FORMAT, "layers.0.mlp.gate_proj.weight", "intermediate_size"},
        {"unsupported rope", yarn, LMX_ERR_UNSUPPORTED, "rope_scaling", "'yarn'"},
        {"layers not a number", string_layers, LMX_ERR_FORMAT, "num_hidden_layers", "integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        d = dir_for(cases[i].label);
        write_config(d, cases[i].edit);
        copy_file(SRC "/model.safetensors", d, "model.safetensors");
        expect_load_error(cases[i].label, d, cases[i].code, cases[i].n1, cases[i].n2);
    }

    d = dir_for("config not json");
    FILE *f = fopen(strcat(strcpy((char[700]){0}, d), "/config.json"), "wb");
    fputs("{\"model_type\": \"qwen3\", ", f);
    fclose(f);
    expect_load_error("config not json", d, LMX_ERR_FORMAT, "config.json", "not valid JSON");
}

/* Writes SRC's tensors to dir/model.safetensors, less `drop` (NULL: none). */
static void write_weights(const char *dir, const char *drop, lmx_dtype force_dtype_of_norm)
{
    lmx_st_set *st = NULL;
    lmx_error err = {0};
    CHECK(lmx_st_open_file(SRC "/model.safetensors", &st, &err) == LMX_OK, "%s", err.message);
    if (!st)
        return;
    size_t n = lmx_st_count(st), k = 0;
    lmx_st_out *out = calloc(n, sizeof *out);
    for (size_t i = 0; i < n; i++) {
        const lmx_st_tensor *t = lmx_st_at(st, i);
        if (drop && !strcmp(t->name, drop))
            continue;
        out[k] = (lmx_st_out){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
        memcpy(out[k].shape, t->shape, sizeof t->shape);
        if (force_dtype_of_norm != LMX_DT_F32 && !strcmp(t->name, "model.norm.weight"))
            out[k].dtype = force_dtype_of_norm; /* same byte size: I32 for F32 */
        k++;
    }
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(lmx_st_write(path, out, k, &err) == LMX_OK, "%s", err.message);
    free(out);
    lmx_st_close(st);
}

static void weight_errors(void)
{
    char *d = dir_for("missing-tensor");
    write_config(d, NULL);
    write_weights(d, "model.layers.1.mlp.up_proj.weight", LMX_DT_F32);
    expect_load_error("missing tensor", d, LMX_ERR_FORMAT, "model.layers.1.mlp.up_proj.weight", "missing");

    d = dir_for("int-weight");
    write_config(d, NULL);
    write_weights(d, NULL, LMX_DT_I32);
    expect_load_error("integer weight", d, LMX_ERR_UNSUPPORTED, "model.norm.weight", "I32");

    d = dir_for("truncated");
    write_config(d, NULL);
    copy_file(SRC "/model.safetensors", d, "model.safetensors");
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    struct stat sb;
    stat(path, &sb);
    CHECK(truncate(path, sb.st_size - 1000) == 0, "truncate");
    expect_load_error("truncated weights", d, LMX_ERR_FORMAT, "model.safetensors", NULL);

    d = dir_for("missing-shard");
    write_config(d, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", d);
    FILE *f = fopen(path, "wb");
    fputs("{\"weight_map\": {\"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}", f);
    fclose(f);
    expect_load_error("index names a missing shard", d, LMX_ERR_IO, "model-00002-of-00002.safetensors", NULL);
}

static void call_errors(void)
{
    lmx_error err = {0};
    lmx_model *m = lmx_load(SRC, NULL, &err);
    CHECK(m != NULL, "load: %s", err.message);
    if (!m)
        return;
    lmx_context *c = lmx_context_new(m, 16, &err);
    CHECK(c != NULL, "context: %s", err.message);
    int32_t ids[20] = {1, 2, 2048};
    int32_t ok_ids[20] = {0};
    float *logits = malloc(2048 * sizeof(float));
    CHECK(lmx_context_eval(c, ids, 3, logits, 0, &err) == LMX_ERR_RANGE && strstr(err.message, "2048"),
          "id >= vocab: %s", err.message);
    CHECK(lmx_context_length(c) == 0, "nothing evaluated after a rejected call");
    CHECK(lmx_context_eval(c, ok_ids, 17, logits, 0, &err) == LMX_ERR_RANGE && strstr(err.message, "context full"),
          "too long: %s", err.message);
    CHECK(lmx_context_eval(c, ids, 0, logits, 0, &err) == LMX_ERR_ARG, "n = 0: %s", err.message);
    CHECK(lmx_context_eval(NULL, ids, 1, logits, 0, &err) == LMX_ERR_ARG, "NULL context");
    CHECK(lmx_context_eval(c, ids, 2, logits, 0, &err) == LMX_OK, "valid eval: %s", err.message);
    CHECK(lmx_context_truncate(c, 5, &err) == LMX_ERR_ARG, "truncate beyond length");
    CHECK(lmx_context_new(m, -1, &err) == NULL && err.code == LMX_ERR_ARG, "negative n_ctx");
    CHECK(lmx_context_new(m, 1 << 30, &err) == NULL && err.code == LMX_ERR_ARG, "n_ctx beyond the model");
    lmx_load_options o = lmx_load_defaults();
    o.n_threads = -3;
    CHECK(lmx_load(SRC, &o, &err) == NULL && err.code == LMX_ERR_ARG && strstr(err.message, "n_threads"),
          "negative threads: %s", err.message);
    CHECK(lmx_load(NULL, NULL, &err) == NULL && err.code == LMX_ERR_ARG, "NULL dir");
    free(logits);
    lmx_context_free(c);
    lmx_close(m);
}

static void cli_errors(void)
{
    char cmd[1200], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s logits /nonexistent --ids 1 --out %s/x.safetensors 2>&1", LMX_BIN, test_tmpdir());
    int rc = test_run(cmd, &out);
    CHECK(rc == 1 && out && strstr(out, "/nonexistent/config.json"), "cli missing dir: rc %d, '%s'", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s logits %s --ids 1,99999 --out %s/x.safetensors 2>&1", LMX_BIN, SRC, test_tmpdir());
    rc = test_run(cmd, &out);
    CHECK(rc == 1 && out && strstr(out, "99999"), "cli id >= vocab: rc %d, '%s'", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s logits %s --ids 1,x --out %s/x.safetensors 2>&1", LMX_BIN, SRC, test_tmpdir());
    rc = test_run(cmd, &out);
    CHECK(rc == 2 && out && strstr(out, "--ids"), "cli bad ids: rc %d, '%s'", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s info %s/missing-tensor 2>&1", LMX_BIN, test_tmpdir());
    rc = test_run(cmd, &out);
    CHECK(rc == 1 && out && strstr(out, "up_proj"), "cli info: rc %d, '%s'", rc, out);
    free(out);
}

/* Weights larger than this machine's memory: loading fails before it
 * copies any, saying what they take and what to do; read in place from
 * the checkpoint (--mmap) they load. The model (a sparse file) is sized
 * so that even its q8 copy takes more than the physical memory. */
static void too_large(void)
{
    size_t phys = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    char *dir = dir_for("too-large");
    size_t bytes = test_write_sparse_model(dir, 2 * phys);
    CHECK(bytes > 2 * phys, "sparse checkpoint in %s: %zu bytes", dir, bytes);
    lmx_load_options o = lmx_load_defaults();
    o.device = LMX_DEVICE_CPU;
    o.quant = 8;
    lmx_error err = {0};
    lmx_model *m = lmx_load(dir, &o, &err);
    CHECK(!m && err.code == LMX_ERR_NOMEM, "q8 copy of %zu bytes of weights: %s", bytes,
          m ? "loaded" : err.message);
    CHECK(strstr(err.message, "GB of memory once quantized") && strstr(err.message, "--quant q4"),
          "the message says what the weights take and what to do: %s", err.message);
    printf("too large: %s\n", err.message);
    lmx_close(m);
    o.quant = 0;
    o.mmap_weights = 1;
    m = lmx_load(dir, &o, &err);
    CHECK(m != NULL, "the same weights in place (--mmap): %s", err.message);
    /* a KV cache larger than the memory: refused before any is allocated */
    lmx_context *c = m ? lmx_context_new(m, TEST_SPARSE_POSITIONS, &err) : NULL;
    CHECK(!c && err.code == LMX_ERR_NOMEM && strstr(err.message, "KV cache of") && strstr(err.message, "--ctx"),
          "a context of %d positions: %s", TEST_SPARSE_POSITIONS, c ? "made" : err.message);
    printf("too large: %s\n", err.message);
    lmx_context_free(c);
    c = m ? lmx_context_new(m, 64, &err) : NULL;
    CHECK(c != NULL, "a context of 64 positions: %s", err.message);
    lmx_context_free(c);
    lmx_close(m);
}

int main(void)
{
    config_errors();
    weight_errors();
    call_errors();
    cli_errors();
    too_large();
    return test_finish();
}
