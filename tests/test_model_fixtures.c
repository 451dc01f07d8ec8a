/* Logits of every fixture checkpoint against transformers' references
 * (tests/data/<name>/refs.safetensors): one-shot prefill, token-at-a-time
 * decode and prefill in chunks of 5, plus the 20 greedy tokens; then the
 * fixtures again with the float16 KV cache (lmx_load_options.kv_f16), with
 * the weights read in place from the mapping (mmap_weights), and with
 * prompts' x rounded to bf16 (prefill_bf16). */
#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cpu.h"
#include "bigbuf.h"
#include "context.h"
#include "cpu_kernels.h"
#include "lmx.h"
#include "model.h"
#include "safetensors.h"
#include "testutil.h"

/* The pass under way: the logit tolerance, relative to max(1, max |logit|)
 * of the row, whether the KV cache is float16, the weights read in place
 * and prompts' x rounded to bf16; the worst error seen. */
static struct {
    float rel;
    int kv_f16, mmap_weights, prefill_bf16;
    float worst_rel;
} pass = {1e-3f, 0, 0, 0, 0};

/* Reference margins below which top-1 may legitimately differ: 1e-3 with
 * float32 (as always), twice the tolerance with float16 or bf16. */
static float top1_margin(float tol) { return pass.kv_f16 || pass.prefill_bf16 ? 2 * tol : 1e-3f; }

/* Records and checks the worst |diff| of a row against its tolerance. */
static void check_worst(const char *tag, int pos, float worst, float scale, const char *what)
{
    float tol = pass.rel * scale;
    pass.worst_rel = fmaxf(pass.worst_rel, worst / scale);
    CHECK(worst <= tol, "%s pos %d: max |diff|%s %g > tol %g", tag, pos, what, worst, tol);
}

/* Compares one row of our logits with a full reference row. */
static void check_full_row(const char *tag, int pos, const float *ours, const float *want, int V)
{
    float scale = fmaxf(1.0f, test_max_abs(want, (size_t)V)), worst = 0;
    for (int i = 0; i < V; i++)
        worst = fmaxf(worst, fabsf(ours[i] - want[i]));
    check_worst(tag, pos, worst, scale, "");
    int a = test_argmax(want, V);
    float second = -INFINITY;
    for (int i = 0; i < V; i++)
        if (i != a && want[i] > second)
            second = want[i];
    if (want[a] - second > top1_margin(pass.rel * scale))
        CHECK(test_argmax(ours, V) == a, "%s pos %d: top-1 %d, want %d", tag, pos, test_argmax(ours, V), a);
}

/* Compares with the 8 reference top logits of a row (-tiny fixtures). */
static void check_top_row(const char *tag, int pos, const float *ours, const int32_t *ids,
                          const float *vals, int V)
{
    float scale = fmaxf(1.0f, test_max_abs(vals, 8)), worst = 0;
    for (int j = 0; j < 8; j++)
        worst = fmaxf(worst, fabsf(ours[ids[j]] - vals[j]));
    check_worst(tag, pos, worst, scale, " over top-8");
    if (vals[0] - vals[1] > top1_margin(pass.rel * scale))
        CHECK(test_argmax(ours, V) == ids[0], "%s pos %d: top-1 %d, want %d", tag, pos, test_argmax(ours, V),
              (int)ids[0]);
}

/* The top-1 margin under which a greedy step may pick another id. */
static float greedy_margin(const float *last, int V)
{
    return top1_margin(pass.rel * fmaxf(1.0f, test_max_abs(last, (size_t)V)));
}

/* Runs the prompt in calls of `chunk` tokens (0 = all at once), with the
 * context's own prefill chunk of `rows` tokens, and checks the logits at
 * every position. Small `rows` make sliding-window caches wrap around. */
static void check_prompt(lmx_model *m, const lmx_st_set *r, int k, int chunk, int rows, const char *name)
{
    const lmx_st_tensor *ids_t = test_ref(r, k, "ids");
    int L = (int)ids_t->shape[0], V = lmx_model_vocab_size(m);
    const int32_t *ids = ids_t->data;
    float *logits = malloc((size_t)L * V * sizeof(float));
    lmx_context *c = test_eval_prompt(m, ids, L, chunk, rows, logits);
    if (!c) {
        free(logits);
        return;
    }
    char tag[96];
    snprintf(tag, sizeof tag, "%s p%d chunk %d rows %d", name, k, chunk, rows);
    const lmx_st_tensor *full = test_ref(r, k, "logits");
    if (full) {
        for (int p = 0; p < L; p++)
            check_full_row(tag, p, logits + (size_t)p * V, (const float *)full->data + (size_t)p * V, V);
    } else {
        const int32_t *top_ids = test_ref(r, k, "top_ids")->data;
        const float *top_vals = test_ref(r, k, "top_vals")->data;
        for (int p = 0; p < L; p++)
            check_top_row(tag, p, logits + (size_t)p * V, top_ids + p * 8, top_vals + p * 8, V);
        check_full_row(tag, L - 1, logits + (size_t)(L - 1) * V, test_ref(r, k, "logits_last")->data, V);
    }
    /* greedy continuation through the cache, after a full-prompt run */
    if (chunk == 0) {
        test_greedy(m, c, rows, ids, L, logits + (size_t)(L - 1) * V, V, test_ref(r, k, "greedy"),
                    test_ref(r, k, "margin")->data, greedy_margin, tag);
        if (rows == 3 && !pass.kv_f16 && !pass.mmap_weights && !pass.prefill_bf16) { /* prefill in chunks */
            test_sampled(m, rows, ids, L, 6, tag);
            /* the CPU draws on the host: the context says so, and refuses */
            lmx_error err = {0};
            lmx_draw d = {1, 0, 0.5};
            int32_t next = -1;
            CHECK(!lmx_context_can_draw(c) && test_drawn(m, rows, ids, L, 2, tag) == 0 &&
                      lmx_context_eval_draw(c, ids, 1, &d, &next, &err) == LMX_ERR_UNSUPPORTED &&
                      strstr(err.message, "does not draw") && next == -1,
                  "%s: a CPU context drew where the logits are (%s)", tag, err.message);
        }
    }
    lmx_context_free(c);
    free(logits);
}

/* Checks the checkpoint in dir against the references of fixture `name`. */
static void check_model_dir(const char *name, const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s/refs.safetensors", LMX_TEST_DATA, name);
    lmx_error err = {0};
    lmx_load_options o = lmx_load_defaults();
    o.kv_f16 = pass.kv_f16;
    o.mmap_weights = pass.mmap_weights;
    o.prefill_bf16 = pass.prefill_bf16;
    lmx_model *m = lmx_load(dir, &o, &err);
    CHECK(m != NULL, "load %s: %s", name, err.message);
    lmx_st_set *r = NULL;
    CHECK(lmx_st_open_file(path, &r, &err) == LMX_OK, "refs %s: %s", name, err.message);
    if (m && r) {
        int prompts = 0;
        for (int k = 0; test_ref(r, k, "ids"); k++, prompts++) {
            check_prompt(m, r, k, 0, 64, name);
            check_prompt(m, r, k, 1, 64, name);
            check_prompt(m, r, k, 5, 64, name);
            check_prompt(m, r, k, 0, 3, name);
            check_prompt(m, r, k, 5, 2, name);
        }
        CHECK(prompts >= 2, "%s: only %d prompts in refs", name, prompts);
    }
    lmx_st_close(r);
    lmx_close(m);
}

static void check_model(const char *name)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", LMX_TEST_DATA, name);
    check_model_dir(name, dir);
}

/* Variants real hubs have, made from the fixtures ---------------------------- */

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n)
        buf[n] = 0;
    else {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

static void write_text(const char *dir, const char *file, const char *text)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    CHECK(f && fputs(text, f) >= 0, "write %s", path);
    if (f)
        fclose(f);
}

static void write_json(const char *dir, const char *file, const cJSON *j)
{
    char *text = cJSON_Print(j);
    write_text(dir, file, text);
    free(text);
}

static const char *variant_dir(const char *label)
{
    static char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), label);
    mkdir(dir, 0755);
    return dir;
}

/* Rewrites fixture `name`'s weights into dir: renamed by `prefix` (replacing
 * "model."), converted to `dtype` (F16 keeps BF16 values: exact in range),
 * split over `shards` files with an index when shards > 1. */
static void rewrite_weights(const char *name, const char *dir, const char *prefix, lmx_dtype dtype,
                            int shards, int add_vision)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s/model.safetensors", LMX_TEST_DATA, name);
    lmx_st_set *st = NULL;
    lmx_error err = {0};
    CHECK(lmx_st_open_file(path, &st, &err) == LMX_OK, "%s", err.message);
    if (!st)
        return;
    size_t n = lmx_st_count(st);
    lmx_st_out *out = calloc(n + 1, sizeof *out);
    char **names = calloc(n + 1, sizeof *names);
    void **bufs = calloc(n + 1, sizeof *bufs);
    for (size_t i = 0; i < n; i++) {
        const lmx_st_tensor *t = lmx_st_at(st, i);
        names[i] = malloc(strlen(t->name) + strlen(prefix) + 1);
        const char *rest = strncmp(t->name, "model.", 6) == 0 ? t->name + 6 : NULL;
        if (rest)
            sprintf(names[i], "%s%s", prefix, rest);
        else
            strcpy(names[i], t->name);
        out[i] = (lmx_st_out){.name = names[i], .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
        memcpy(out[i].shape, t->shape, sizeof t->shape);
        if (dtype != t->dtype) {
            size_t count = t->nbytes / lmx_dtype_size(t->dtype);
            uint16_t *b = malloc(count * sizeof *b);
            for (size_t k = 0; k < count; k++) {
                float v = t->dtype == LMX_DT_BF16 ? lmx_bf16_to_f32(((const uint16_t *)t->data)[k])
                                                  : ((const float *)t->data)[k];
                b[k] = lmx_f32_to_f16(v);
            }
            bufs[i] = b;
            out[i].dtype = dtype;
            out[i].data = b;
        }
    }
    static const float vision[4] = {1, 2, 3, 4};
    if (add_vision) /* multimodal checkpoints carry a vision tower lmx ignores */
        out[n++] = (lmx_st_out){.name = "vision_tower.patch_embedding.weight", .dtype = LMX_DT_F32,
                                .ndim = 1, .shape = {4}, .data = vision};
    if (shards <= 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK(lmx_st_write(path, out, n, &err) == LMX_OK, "%s", err.message);
    } else {
        cJSON *index = cJSON_CreateObject(), *map = cJSON_AddObjectToObject(index, "weight_map");
        size_t per = (n + (size_t)shards - 1) / (size_t)shards;
        for (int s = 0; s < shards; s++) {
            char file[64];
            snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, shards);
            size_t a = (size_t)s * per, b = a + per < n ? a + per : n;
            for (size_t i = a; i < b; i++)
                cJSON_AddStringToObject(map, out[i].name, file);
            snprintf(path, sizeof path, "%s/%s", dir, file);
            CHECK(lmx_st_write(path, out + a, b - a, &err) == LMX_OK, "%s", err.message);
        }
        write_json(dir, "model.safetensors.index.json", index);
        cJSON_Delete(index);
    }
    for (size_t i = 0; i < lmx_st_count(st); i++) {
        free(names[i]);
        free(bufs[i]);
    }
    free(names);
    free(bufs);
    free(out);
    lmx_st_close(st);
}

static cJSON *fixture_json(const char *name, const char *file)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s/%s", LMX_TEST_DATA, name, file);
    char *text = read_text(path);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(j != NULL, "read %s", path);
    return j;
}

static void copy_config(const char *name, const char *dir)
{
    cJSON *c = fixture_json(name, "config.json");
    write_json(dir, "config.json", c);
    cJSON_Delete(c);
}

static void check_variants(void)
{
    const char *dir = variant_dir("qwen3-tiny-sharded");
    copy_config("qwen3-tiny", dir);
    rewrite_weights("qwen3-tiny", dir, "model.", LMX_DT_BF16, 3, 0);
    check_model_dir("qwen3-tiny", dir);

    dir = variant_dir("gemma3-tiny-f16");
    copy_config("gemma3-tiny", dir);
    rewrite_weights("gemma3-tiny", dir, "model.", LMX_DT_F16, 1, 0);
    check_model_dir("gemma3-tiny", dir);

    /* new-style config: transformers' own resolved form (layer_types,
     * rope_parameters keyed by layer type), no legacy rope fields */
    dir = variant_dir("gemma3-small-newconfig");
    cJSON *meta = fixture_json("gemma3-small", "refs_meta.json");
    cJSON *resolved = cJSON_DetachItemFromObject(meta, "resolved_config");
    CHECK(cJSON_GetObjectItem(resolved, "layer_types") && !cJSON_GetObjectItem(resolved, "rope_scaling"),
          "resolved config is new-style");
    cJSON_DeleteItemFromObject(resolved, "sliding_window_pattern");
    cJSON_DeleteItemFromObject(resolved, "_sliding_window_pattern");
    write_json(dir, "config.json", resolved);
    cJSON_Delete(resolved);
    cJSON_Delete(meta);
    rewrite_weights("gemma3-small", dir, "model.", LMX_DT_F32, 1, 0);
    check_model_dir("gemma3-small", dir);

    /* Gemma3ForConditionalGeneration: text model under text_config, weights
     * under language_model.model.* (legacy) or model.language_model.* (new) */
    const char *prefixes[] = {"language_model.model.", "model.language_model."};
    for (int k = 0; k < 2; k++) {
        dir = variant_dir(k ? "gemma3-small-mm-new" : "gemma3-small-mm-legacy");
        cJSON *text = fixture_json("gemma3-small", "config.json");
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "model_type", "gemma3");
        cJSON_AddItemToObject(root, "text_config", text);
        cJSON_AddItemToObject(root, "vision_config", cJSON_CreateObject());
        write_json(dir, "config.json", root);
        cJSON_Delete(root);
        rewrite_weights("gemma3-small", dir, prefixes[k], LMX_DT_F32, 2, 1);
        check_model_dir("gemma3-small", dir);
    }
}

/* Final logit soft-capping (Gemma2-style configs): the logits become
 * cap * tanh(logits / cap), which the references give exactly. */
static void check_final_softcap(void)
{
    const char *dir = variant_dir("gemma3-small-softcap");
    cJSON *c = fixture_json("gemma3-small", "config.json");
    cJSON_ReplaceItemInObject(c, "final_logit_softcapping", cJSON_CreateNumber(2.0));
    write_json(dir, "config.json", c);
    cJSON_Delete(c);
    rewrite_weights("gemma3-small", dir, "model.", LMX_DT_F32, 1, 0);
    lmx_error err = {0};
    lmx_model *m = lmx_load(dir, NULL, &err);
    lmx_st_set *r = NULL;
    CHECK(m && lmx_st_open_file(LMX_TEST_DATA "/gemma3-small/refs.safetensors", &r, &err) == LMX_OK,
          "%s", err.message);
    for (int k = 0; m && r && test_ref(r, k, "ids"); k++) {
        const lmx_st_tensor *ids = test_ref(r, k, "ids");
        const float *want = test_ref(r, k, "logits")->data;
        int L = (int)ids->shape[0], V = lmx_model_vocab_size(m);
        float *ours = malloc((size_t)L * V * sizeof(float)), *capped = malloc((size_t)V * sizeof(float));
        lmx_context *ctx = lmx_context_new(m, L, &err);
        CHECK(ctx && lmx_context_eval(ctx, ids->data, L, ours, 1, &err) == LMX_OK, "%s", err.message);
        for (int p = 0; p < L; p++) {
            for (int v = 0; v < V; v++)
                capped[v] = 2.0f * tanhf(want[(size_t)p * V + v] / 2.0f);
            check_full_row("gemma3-small softcap 2", p, ours + (size_t)p * V, capped, V);
        }
        lmx_context_free(ctx);
        free(ours);
        free(capped);
    }
    lmx_st_close(r);
    lmx_close(m);
}

/* `lmx logits` writes the same rows, whole-prompt, token by token and in chunks. */
static void check_cli_logits(void)
{
    lmx_st_set *rs = NULL, *out = NULL;
    lmx_error err = {0};
    CHECK(lmx_st_open_file(LMX_TEST_DATA "/qwen3-small/refs.safetensors", &rs, &err) == LMX_OK, "%s", err.message);
    if (!rs)
        return;
    const lmx_st_tensor *ids = lmx_st_find(rs, "p1.ids"), *want = lmx_st_find(rs, "p1.logits");
    char list[4096] = "", path[600], cmd[8192];
    for (int i = 0; i < ids->shape[0]; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), i ? ",%d" : "%d", ((const int32_t *)ids->data)[i]);
    const char *modes[] = {"", "--decode", "--chunk 5"};
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/cli-%d.safetensors", test_tmpdir(), k);
        snprintf(cmd, sizeof cmd, "%s logits %s/qwen3-small --ids %s --out %s %s", LMX_BIN, LMX_TEST_DATA, list,
                 path, modes[k]);
        CHECK(test_run(cmd, NULL) == 0, "%s", cmd);
        CHECK(lmx_st_open_file(path, &out, &err) == LMX_OK, "%s", err.message);
        const lmx_st_tensor *l = out ? lmx_st_find(out, "logits") : NULL;
        CHECK(l && l->dtype == LMX_DT_F32 && l->ndim == 2 && l->shape[0] == ids->shape[0] &&
                  l->shape[1] == want->shape[1], "lmx logits %s: one F32 tensor [L, V]", modes[k]);
        for (int p = 0; l && p < l->shape[0]; p++)
            check_full_row(modes[k], p, (const float *)l->data + p * l->shape[1],
                           (const float *)want->data + p * want->shape[1], (int)want->shape[1]);
        lmx_st_close(out);
        out = NULL;
    }
    lmx_st_close(rs);
}

static const char *const fixtures[] = {"qwen3-small", "gemma3-small", "qwen3-tiny", "gemma3-tiny"};

/* Every fixture again with one of pass's options on (*option = 1), at
 * tolerance tol; returns the worst error seen. */
static float fixtures_with(int *option, float tol)
{
    pass.rel = tol;
    *option = 1;
    pass.worst_rel = 0;
    for (int i = 0; i < 4; i++)
        check_model(fixtures[i]);
    *option = 0;
    return pass.worst_rel;
}

/* Every fixture again, the KV cache in float16. */
static void check_kv_f16(void)
{
    float worst = fixtures_with(&pass.kv_f16, TEST_KV_F16_TOL);
    printf("kv f16: worst max |diff| / max(1, max |logit|) %.3g (tolerance %.3g)\n", worst, pass.rel);
}

/* Every fixture again, the weights read in place from the mapping (the
 * passes above copied them, into huge pages where the kernel grants them). */
static void check_mmap_weights(void)
{
    float worst = fixtures_with(&pass.mmap_weights, 1e-3f);
    printf("weights mapped: worst max |diff| / max(1, max |logit|) %.3g (tolerance %.3g)\n", worst, pass.rel);

    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3-tiny", LMX_TEST_DATA);
    lmx_load_options o = lmx_load_defaults();
    o.device = LMX_DEVICE_CPU;
    lmx_error err = {0};
    for (int mapped = 0; mapped < 2; mapped++) {
        o.mmap_weights = mapped;
        lmx_model *m = lmx_load(dir, &o, &err);
        CHECK(m != NULL, "load qwen3-tiny: %s", err.message);
        const char *want = !mapped && lmx_bigbuf_huge_pages() ? "huge pages" : "mapped";
        CHECK(m && !strcmp(lmx_backend_cpu_weights(m->be), want), "mmap_weights = %d: weights %s, want %s", mapped,
              m ? lmx_backend_cpu_weights(m->be) : "-", want);
        lmx_close(m);
    }
    o.mmap_weights = 2;
    lmx_model *m = lmx_load(dir, &o, &err);
    CHECK(!m && err.code == LMX_ERR_ARG && strstr(err.message, "mmap_weights"), "mmap_weights = 2: %s",
          m ? "loaded" : err.message);
    lmx_close(m);
}

/* Every fixture again, prompts' products with bf16 weights on x rounded to
 * bf16 (the -tiny fixtures; the -small ones, float32, keep float32 x), then
 * the option's state: in force where the path has the bf16 tile and the
 * CPU runs it, an error value when neither 0 nor 1. */
static void check_prefill_bf16(void)
{
    float worst = fixtures_with(&pass.prefill_bf16, TEST_PREFILL_BF16_TOL);

    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3-tiny", LMX_TEST_DATA);
    lmx_load_options o = lmx_load_defaults();
    o.device = LMX_DEVICE_CPU;
    o.prefill_bf16 = 1;
    lmx_cpu_path p = LMX_CPU_SCALAR;
    lmx_error err = {0};
    lmx_model *m = lmx_load(dir, &o, &err);
    CHECK(m != NULL && lmx_cpu_path_select(&p, NULL) == LMX_OK, "load qwen3-tiny: %s", err.message);
    const char *want = lmx_cpu_kernels_for(p)->bf16_tile && lmx_cpu_avx512_bf16(NULL) ? "bf16" : "f32";
    const char *got = m ? lmx_backend_cpu_prefill_x(m->be) : "-";
    CHECK(!strcmp(got, want), "prefill_bf16 = 1: x %s, want %s", got, want);
    printf("prefill bf16 (x %s here): worst max |diff| / max(1, max |logit|) %.3g (tolerance %.3g)\n", got, worst,
           pass.rel);
    lmx_close(m);
    o.prefill_bf16 = 2;
    m = lmx_load(dir, &o, &err);
    CHECK(!m && err.code == LMX_ERR_ARG && strstr(err.message, "prefill_bf16"), "prefill_bf16 = 2: %s",
          m ? "loaded" : err.message);
    lmx_close(m);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            check_model(argv[i]);
        return test_finish();
    }
    for (int i = 0; i < 4; i++)
        check_model(fixtures[i]);
    check_variants();
    check_final_softcap();
    check_cli_logits();
    printf("kv f32: worst max |diff| / max(1, max |logit|) %.3g (tolerance %.3g)\n", pass.worst_rel, pass.rel);
    check_kv_f16();
    check_mmap_weights();
    check_prefill_bf16();
    return test_finish();
}
