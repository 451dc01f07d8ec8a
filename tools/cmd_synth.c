/* lmx synth: a random-weight checkpoint with a real model's exact shapes,
 * laid out as on the hub (config.json, safetensors shards of at most 4 GB
 * with an index when larger), for tests and benchmarks. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "commands.h"
#include "safetensors.h"

typedef struct shape {
    const char *name, *model_type;
    int vocab, hidden, inter, layers, heads, kv_heads, head_dim, tied, max_pos;
    double rope_theta;
    int window, pattern;     /* Gemma: sliding window and its pattern */
    double rope_linear;      /* Gemma: linear factor on global layers, 0 = none */
    int query_pre_attn_scalar;
} shape;

/* Shapes of the published checkpoints (their config.json files). */
static const shape shapes[] = {
    {"qwen3-0.6b", "qwen3", 151936, 1024, 3072, 28, 16, 8, 128, 1, 40960, 1e6, 0, 0, 0, 0},
    {"qwen3-1.7b", "qwen3", 151936, 2048, 6144, 28, 16, 8, 128, 1, 40960, 1e6, 0, 0, 0, 0},
    {"qwen3-4b", "qwen3", 151936, 2560, 9728, 36, 32, 8, 128, 1, 40960, 1e6, 0, 0, 0, 0},
    {"qwen3-8b", "qwen3", 151936, 4096, 12288, 36, 32, 8, 128, 0, 40960, 1e6, 0, 0, 0, 0},
    {"qwen3-14b", "qwen3", 151936, 5120, 17408, 40, 40, 8, 128, 0, 40960, 1e6, 0, 0, 0, 0},
    {"gemma3-1b", "gemma3_text", 262144, 1152, 6912, 26, 4, 1, 256, 1, 32768, 1e6, 512, 6, 0, 256},
    {"gemma3-4b", "gemma3", 262208, 2560, 10240, 34, 8, 4, 256, 1, 131072, 1e6, 1024, 6, 8.0, 256},
    {"gemma3-12b", "gemma3", 262208, 3840, 15360, 48, 16, 8, 256, 1, 131072, 1e6, 1024, 6, 8.0, 256},
    {"gemma3-27b", "gemma3", 262208, 5376, 21504, 62, 32, 16, 128, 1, 131072, 1e6, 1024, 6, 8.0, 168},
};

/* Random values: uniform with the given standard deviation around `center`,
 * from a xorshift generator (deterministic for a seed). */
typedef struct filler {
    lmx_dtype dtype;
    uint64_t state;
    float center, spread;
} filler;

static float next_uniform(filler *f)
{
    f->state ^= f->state << 13;
    f->state ^= f->state >> 7;
    f->state ^= f->state << 17;
    return (float)(f->state >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

static void fill(void *ctx, void *dst, size_t nbytes)
{
    filler *f = ctx;
    size_t n = nbytes / lmx_dtype_size(f->dtype);
    for (size_t i = 0; i < n; i++) {
        float v = f->center + f->spread * next_uniform(f);
        if (f->dtype == LMX_DT_F32)
            ((float *)dst)[i] = v;
        else if (f->dtype == LMX_DT_BF16)
            ((uint16_t *)dst)[i] = lmx_f32_to_bf16(v);
        else
            ((uint16_t *)dst)[i] = lmx_f32_to_f16(v);
    }
}

typedef struct plan {
    lmx_st_out *t;
    filler *f;
    char **names;
    size_t n, cap;
} plan;

static int add(plan *p, const char *name, int64_t rows, int64_t cols, lmx_dtype dt, float center,
               uint64_t seed)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        lmx_st_out *t = realloc(p->t, cap * sizeof *t);
        if (t)
            p->t = t;
        filler *f = realloc(p->f, cap * sizeof *f);
        if (f)
            p->f = f;
        char **nm = realloc(p->names, cap * sizeof *nm);
        if (nm)
            p->names = nm;
        if (!t || !f || !nm)
            return -1;
        p->cap = cap;
    }
    char *nm = strdup(name);
    if (!nm)
        return -1;
    p->names[p->n] = nm;
    /* weights: std 1/sqrt(fan_in); norms: small noise around their neutral value */
    float spread = cols ? sqrtf(3.0f / (float)cols) : 0.05f;
    p->f[p->n] = (filler){dt, seed * 0x9E3779B97F4A7C15ull + p->n * 0xBF58476D1CE4E5B9ull + 1, center, spread};
    p->t[p->n] = (lmx_st_out){.name = nm, .dtype = dt, .ndim = cols ? 2 : 1,
                             .shape = {rows, cols}, .fill = fill, .fill_ctx = NULL};
    p->n++;
    return 0;
}

static int build_plan(const shape *s, int layers, lmx_dtype dt, uint64_t seed, plan *p)
{
    const char *pre = strcmp(s->model_type, "gemma3") ? "model." : "language_model.model.";
    int gemma = strncmp(s->model_type, "gemma3", 6) == 0;
    float norm_center = gemma ? 0.0f : 1.0f;
    int64_t D = s->hidden, I = s->inter, q = (int64_t)s->heads * s->head_dim,
            kv = (int64_t)s->kv_heads * s->head_dim;
    char name[160];
#define ADD(rows, cols, center, ...)                                                               \
    do {                                                                                           \
        snprintf(name, sizeof name, __VA_ARGS__);                                                  \
        if (add(p, name, rows, cols, dt, center, seed))                                            \
            return -1;                                                                             \
    } while (0)
    ADD(s->vocab, D, 0.0f, "%sembed_tokens.weight", pre);
    for (int i = 0; i < layers; i++) {
        ADD(D, 0, norm_center, "%slayers.%d.input_layernorm.weight", pre, i);
        ADD(q, D, 0.0f, "%slayers.%d.self_attn.q_proj.weight", pre, i);
        ADD(kv, D, 0.0f, "%slayers.%d.self_attn.k_proj.weight", pre, i);
        ADD(kv, D, 0.0f, "%slayers.%d.self_attn.v_proj.weight", pre, i);
        ADD(D, q, 0.0f, "%slayers.%d.self_attn.o_proj.weight", pre, i);
        ADD(s->head_dim, 0, norm_center, "%slayers.%d.self_attn.q_norm.weight", pre, i);
        ADD(s->head_dim, 0, norm_center, "%slayers.%d.self_attn.k_norm.weight", pre, i);
        ADD(D, 0, norm_center, "%slayers.%d.post_attention_layernorm.weight", pre, i);
        if (gemma) {
            ADD(D, 0, norm_center, "%slayers.%d.pre_feedforward_layernorm.weight", pre, i);
            ADD(D, 0, norm_center, "%slayers.%d.post_feedforward_layernorm.weight", pre, i);
        }
        ADD(I, D, 0.0f, "%slayers.%d.mlp.gate_proj.weight", pre, i);
        ADD(I, D, 0.0f, "%slayers.%d.mlp.up_proj.weight", pre, i);
        ADD(D, I, 0.0f, "%slayers.%d.mlp.down_proj.weight", pre, i);
    }
    ADD(D, 0, norm_center, "%snorm.weight", pre);
    if (!s->tied)
        ADD(s->vocab, D, 0.0f, "lm_head.weight");
#undef ADD
    for (size_t i = 0; i < p->n; i++)
        p->t[i].fill_ctx = &p->f[i];
    return 0;
}

static cJSON *text_config(const shape *s, int layers, const char *dtype_name)
{
    cJSON *c = cJSON_CreateObject();
    int gemma = strncmp(s->model_type, "gemma3", 6) == 0;
    cJSON_AddStringToObject(c, "model_type", strcmp(s->model_type, "gemma3") ? s->model_type : "gemma3_text");
    cJSON_AddNumberToObject(c, "vocab_size", s->vocab);
    cJSON_AddNumberToObject(c, "hidden_size", s->hidden);
    cJSON_AddNumberToObject(c, "intermediate_size", s->inter);
    cJSON_AddNumberToObject(c, "num_hidden_layers", layers);
    cJSON_AddNumberToObject(c, "num_attention_heads", s->heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", s->kv_heads);
    cJSON_AddNumberToObject(c, "head_dim", s->head_dim);
    cJSON_AddNumberToObject(c, "max_position_embeddings", s->max_pos);
    cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-6);
    cJSON_AddNumberToObject(c, "rope_theta", s->rope_theta);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", s->tied);
    cJSON_AddStringToObject(c, "torch_dtype", dtype_name);
    if (gemma) {
        cJSON_AddStringToObject(c, "hidden_activation", "gelu_pytorch_tanh");
        cJSON_AddNumberToObject(c, "query_pre_attn_scalar", s->query_pre_attn_scalar);
        cJSON_AddNumberToObject(c, "sliding_window", s->window);
        cJSON_AddNumberToObject(c, "sliding_window_pattern", s->pattern);
        cJSON_AddNumberToObject(c, "rope_local_base_freq", 10000);
        if (s->rope_linear > 0) {
            cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
            cJSON_AddStringToObject(rs, "rope_type", "linear");
            cJSON_AddNumberToObject(rs, "factor", s->rope_linear);
        }
        cJSON *eos = cJSON_AddArrayToObject(c, "eos_token_id");
        cJSON_AddItemToArray(eos, cJSON_CreateNumber(1));
        cJSON_AddItemToArray(eos, cJSON_CreateNumber(106));
        cJSON_AddNumberToObject(c, "bos_token_id", 2);
    } else {
        cJSON_AddStringToObject(c, "hidden_act", "silu");
        cJSON_AddNumberToObject(c, "eos_token_id", 151645);
        cJSON_AddNumberToObject(c, "bos_token_id", 151643);
    }
    return c;
}

static int write_json(const char *dir, const char *file, cJSON *j)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *text = cJSON_Print(j);
    FILE *f = fopen(path, "w");
    int ok = text && f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0)
        ok = 0;
    free(text);
    if (!ok)
        fprintf(stderr, "lmx synth: cannot write %s\n", path);
    return ok ? 0 : -1;
}

static int write_config(const char *dir, const shape *s, int layers, const char *dtype_name)
{
    cJSON *tc = text_config(s, layers, dtype_name), *root = tc;
    if (!strcmp(s->model_type, "gemma3")) { /* multimodal layout: text model under text_config */
        root = cJSON_CreateObject();
        cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
        cJSON_AddItemToArray(arch, cJSON_CreateString("Gemma3ForConditionalGeneration"));
        cJSON_AddStringToObject(root, "model_type", "gemma3");
        cJSON_AddItemToObject(root, "text_config", tc);
    } else {
        cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
        cJSON_AddItemToArray(arch, cJSON_CreateString(strcmp(s->model_type, "qwen3") ? "Gemma3ForCausalLM"
                                                                                  : "Qwen3ForCausalLM"));
    }
    int rc = write_json(dir, "config.json", root);
    cJSON_Delete(root);
    return rc;
}

enum { SHARD_BYTES = 4000000000 }; /* split as the hub does, a few GB a file */

static int write_weights(const char *dir, plan *p)
{
    size_t total = 0, shard_of[p->n ? p->n : 1], n_shards = 1, acc = 0;
    for (size_t i = 0; i < p->n; i++) {
        size_t b = lmx_dtype_size(p->t[i].dtype);
        for (int d = 0; d < p->t[i].ndim; d++)
            b *= (size_t)p->t[i].shape[d];
        if (acc > 0 && acc + b > SHARD_BYTES) {
            n_shards++;
            acc = 0;
        }
        acc += b;
        total += b;
        shard_of[i] = n_shards - 1;
    }
    lmx_error err = {0};
    char path[4096], file[64];
    cJSON *index = cJSON_CreateObject(), *map = NULL;
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(index, "metadata"), "total_size", (double)total);
    map = cJSON_AddObjectToObject(index, "weight_map");
    int rc = 0;
    for (size_t s = 0, first = 0; s < n_shards && rc == 0; s++) {
        size_t last = first;
        while (last < p->n && shard_of[last] == s)
            last++;
        if (n_shards == 1)
            snprintf(file, sizeof file, "model.safetensors");
        else
            snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        for (size_t i = first; i < last; i++)
            cJSON_AddStringToObject(map, p->t[i].name, file);
        if (lmx_st_write(path, p->t + first, last - first, &err)) {
            fprintf(stderr, "lmx synth: %s\n", err.message);
            rc = -1;
        }
        first = last;
    }
    if (rc == 0 && n_shards > 1)
        rc = write_json(dir, "model.safetensors.index.json", index);
    cJSON_Delete(index);
    return rc;
}

int cmd_synth(int argc, char **argv)
{
    const char *like = NULL, *dir = NULL, *dtype = "bf16";
    long layers = 0, seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--like")) {
            if (!(like = args_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--dtype")) {
            if (!(dtype = args_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--layers")) {
            if (!(v = args_value(argc, argv, &i)) || args_int(v, 1, 4096, "--layers", &layers))
                return 2;
        } else if (!strcmp(argv[i], "--seed")) {
            if (!(v = args_value(argc, argv, &i)) || args_int(v, 0, 1L << 62, "--seed", &seed))
                return 2;
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "lmx synth: unexpected argument '%s'\n", argv[i]);
            return 2;
        } else {
            dir = argv[i];
        }
    }
    const shape *s = NULL;
    for (size_t i = 0; like && i < sizeof shapes / sizeof *shapes; i++)
        if (!strcmp(like, shapes[i].name))
            s = &shapes[i];
    if (!s || !dir) {
        fprintf(stderr, "usage: lmx synth --like NAME DIR [--dtype bf16|f16|f32] [--layers N] [--seed S]\nNAME:");
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            fprintf(stderr, " %s", shapes[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    lmx_dtype dt;
    const char *torch_name;
    if (!strcmp(dtype, "bf16"))
        dt = LMX_DT_BF16, torch_name = "bfloat16";
    else if (!strcmp(dtype, "f16"))
        dt = LMX_DT_F16, torch_name = "float16";
    else if (!strcmp(dtype, "f32"))
        dt = LMX_DT_F32, torch_name = "float32";
    else {
        fprintf(stderr, "lmx synth: --dtype must be bf16, f16 or f32, got '%s'\n", dtype);
        return 2;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "lmx synth: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    int n_layers = layers ? (int)layers : s->layers;
    plan p = {0};
    int rc = build_plan(s, n_layers, dt, (uint64_t)seed, &p) || write_config(dir, s, n_layers, torch_name) ||
             write_weights(dir, &p);
    for (size_t i = 0; i < p.n; i++)
        free(p.names[i]);
    free(p.names);
    free(p.t);
    free(p.f);
    if (rc) {
        fprintf(stderr, "lmx synth: failed\n");
        return 1;
    }
    printf("wrote %s (%s, %d layers, %s)\n", dir, s->name, n_layers, dtype);
    return 0;
}
