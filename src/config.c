#include "config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fileutil.h"

/* The families lmx runs and what transformers assumes for fields a file
 * omits (Qwen3Config / Gemma3TextConfig defaults). */
typedef struct family_defaults {
    const char *name;
    lmx_family family;
    int vocab_size, hidden_size, intermediate_size, n_layers, n_heads, n_kv_heads, head_dim;
    int max_position, tied, sliding_pattern, sliding_window;
    double rope_theta, rope_local_theta, query_pre_attn_scalar;
    const char *act_field, *act_default;
} family_defaults;

static const family_defaults qwen3_defaults = {
    "qwen3", LMX_FAMILY_QWEN3, 151936, 4096, 22016, 32, 32, 32, 128,
    32768, 0, 0, 4096, 10000.0, 0.0, 0.0, "hidden_act", "silu",
};
static const family_defaults gemma3_defaults = {
    "gemma3", LMX_FAMILY_GEMMA3, 262208, 2304, 9216, 26, 8, 4, 256,
    131072, 1, 6, 4096, 1000000.0, 10000.0, 256.0, "hidden_activation", "gelu_pytorch_tanh",
};

const char *lmx_config_supported_types(void) { return "qwen3, gemma3_text, gemma3"; }

/* Reading fields -------------------------------------------------------- */

typedef struct reader {
    const cJSON *obj;   /* object the fields are read from */
    const char *what;   /* file name for messages */
    const char *prefix; /* "" or "text_config." */
    int use_defaults;   /* fill omitted shape fields with the family defaults */
    lmx_error *err;
} reader;

static const cJSON *field(const reader *r, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->obj, key);
    return cJSON_IsNull(v) ? NULL : v;
}

/* An integer field in [lo, hi]; `def` when absent and defaults apply. */
static lmx_status get_int(const reader *r, const char *key, int def, int required, long lo,
                          long hi, int *out)
{
    const cJSON *v = field(r, key);
    if (!v) {
        if (required && !r->use_defaults)
            return lmx_fail(r->err, LMX_ERR_FORMAT, "%s: required field '%s%s' is missing",
                            r->what, r->prefix, key);
        *out = def;
        return LMX_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return lmx_fail(r->err, LMX_ERR_FORMAT, "%s: field '%s%s' must be an integer", r->what,
                        r->prefix, key);
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return lmx_fail(r->err, LMX_ERR_FORMAT, "%s: field '%s%s' = %.17g is out of range [%ld, %ld]",
                        r->what, r->prefix, key, v->valuedouble, lo, hi);
    *out = (int)v->valuedouble;
    return LMX_OK;
}

/* A number field (finite, in [lo, hi]); `def` when absent or null. */
static lmx_status get_num(const reader *r, const char *key, double def, double lo, double hi,
                          double *out)
{
    const cJSON *v = field(r, key);
    if (!v) {
        *out = def;
        return LMX_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return lmx_fail(r->err, LMX_ERR_FORMAT, "%s: field '%s%s' must be a number in [%g, %g]",
                        r->what, r->prefix, key, lo, hi);
    *out = v->valuedouble;
    return LMX_OK;
}

static lmx_status get_bool(const reader *r, const char *key, int def, int *out)
{
    const cJSON *v = field(r, key);
    if (!v) {
        *out = def;
        return LMX_OK;
    }
    if (!cJSON_IsBool(v))
        return lmx_fail(r->err, LMX_ERR_FORMAT, "%s: field '%s%s' must be true or false", r->what,
                        r->prefix, key);
    *out = cJSON_IsTrue(v);
    return LMX_OK;
}

/* Token ids: an integer or a list of integers, appended to ids. */
static lmx_status get_ids(const reader *r, const char *key, int32_t *ids, int *n)
{
    const cJSON *v = field(r, key);
    if (!v)
        return LMX_OK;
    const cJSON *one = v;
    int count = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 1;
    for (int i = 0; i < count; i++) {
        if (cJSON_IsArray(v))
            one = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(one) || one->valuedouble < 0 || one->valuedouble > INT32_MAX ||
            one->valuedouble != floor(one->valuedouble))
            return lmx_fail(r->err, LMX_ERR_FORMAT,
                            "%s: field '%s%s' must be a token id or a list of token ids", r->what,
                            r->prefix, key);
        if (*n >= LMX_MAX_EOS)
            return lmx_fail(r->err, LMX_ERR_FORMAT, "%s: field '%s%s' lists more than %d ids",
                            r->what, r->prefix, key, LMX_MAX_EOS);
        ids[(*n)++] = (int32_t)one->valuedouble;
    }
    return LMX_OK;
}

/* RoPE ------------------------------------------------------------------ */

/* Reads one rope description: {"rope_type"|"type": "default"|"linear",
 * "factor": f, "rope_theta": t}; theta keeps its value when absent. */
static lmx_status parse_rope(const reader *r, const cJSON *obj, const char *name, lmx_rope *rope)
{
    if (!cJSON_IsObject(obj))
        return lmx_fail(r->err, LMX_ERR_FORMAT, "%s: field '%s%s' must be an object", r->what,
                        r->prefix, name);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(obj, "rope_type");
    if (!type)
        type = cJSON_GetObjectItemCaseSensitive(obj, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "default";
    reader sub = *r;
    sub.obj = obj;
    double theta = 0, factor = 1;
    lmx_status st;
    if ((st = get_num(&sub, "rope_theta", rope->theta, 1e-3, 1e12, &theta)))
        return st;
    rope->theta = (float)theta;
    if (!strcmp(t, "default")) {
        rope->factor = 1.0f;
    } else if (!strcmp(t, "linear")) {
        if ((st = get_num(&sub, "factor", 1.0, 1e-6, 1e6, &factor)))
            return st;
        rope->factor = (float)factor;
    } else {
        return lmx_fail(r->err, LMX_ERR_UNSUPPORTED,
                        "%s: field '%s%s': rope_type '%s' is not supported (supported: default, linear)",
                        r->what, r->prefix, name, t);
    }
    return LMX_OK;
}

/* Fills every layer's window and RoPE from either the legacy fields
 * (rope_theta, rope_scaling, rope_local_base_freq, sliding_window_pattern)
 * or the newer ones (layer_types, rope_parameters keyed by layer type). */
static lmx_status parse_layers(const reader *r, const family_defaults *fd, lmx_config *c)
{
    lmx_status st;
    int window = 0, pattern = fd->sliding_pattern;
    if (fd->family == LMX_FAMILY_GEMMA3) {
        if ((st = get_int(r, "sliding_window", fd->sliding_window, 0, 1, 1 << 30, &window)))
            return st;
        if (field(r, "_sliding_window_pattern") &&
            (st = get_int(r, "_sliding_window_pattern", pattern, 0, 1, 1 << 20, &pattern)))
            return st;
        if ((st = get_int(r, "sliding_window_pattern", pattern, 0, 1, 1 << 20, &pattern)))
            return st;
    } else {
        int use_sliding = 0;
        if ((st = get_bool(r, "use_sliding_window", 0, &use_sliding)))
            return st;
        if (use_sliding && field(r, "sliding_window") &&
            (st = get_int(r, "sliding_window", 0, 0, 1, 1 << 30, &window)))
            return st;
    }
    int max_window_layers = 0;
    if (fd->family == LMX_FAMILY_QWEN3 &&
        (st = get_int(r, "max_window_layers", c->n_layers, 0, 0, 1 << 20, &max_window_layers)))
        return st;

    /* layer types: 1 = sliding */
    const cJSON *types = field(r, "layer_types");
    if (types && (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->n_layers))
        return lmx_fail(r->err, LMX_ERR_FORMAT,
                        "%s: field '%slayer_types' must be a list of %d layer types", r->what,
                        r->prefix, c->n_layers);
    for (int i = 0; i < c->n_layers; i++) {
        int sliding;
        if (types) {
            const cJSON *t = cJSON_GetArrayItem(types, i);
            const char *s = cJSON_IsString(t) ? t->valuestring : "";
            if (!strcmp(s, "sliding_attention"))
                sliding = 1;
            else if (!strcmp(s, "full_attention"))
                sliding = 0;
            else
                return lmx_fail(r->err, LMX_ERR_UNSUPPORTED,
                                "%s: field '%slayer_types[%d]' = '%s' is not supported "
                                "(supported: full_attention, sliding_attention)",
                                r->what, r->prefix, i, s);
        } else if (fd->family == LMX_FAMILY_GEMMA3) {
            sliding = (i + 1) % pattern != 0;
        } else {
            sliding = window > 0 && i >= max_window_layers;
        }
        if (sliding && window <= 0)
            return lmx_fail(r->err, LMX_ERR_FORMAT,
                            "%s: layer %d uses sliding attention but '%ssliding_window' is not set",
                            r->what, i, r->prefix);
        c->layers[i].window = sliding ? window : 0;
    }

    /* RoPE per layer type */
    double theta = 0, local_theta = 0;
    if ((st = get_num(r, "rope_theta", fd->rope_theta, 1e-3, 1e12, &theta)))
        return st;
    if ((st = get_num(r, "rope_local_base_freq", fd->rope_local_theta ? fd->rope_local_theta : theta,
                      1e-3, 1e12, &local_theta)))
        return st;
    lmx_rope full = {(float)theta, 1.0f}, local = {(float)local_theta, 1.0f};
    const cJSON *params = field(r, "rope_parameters");
    const cJSON *scaling = field(r, "rope_scaling");
    if (params) {
        const cJSON *pf = cJSON_GetObjectItemCaseSensitive(params, "full_attention");
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(params, "sliding_attention");
        if (pf || ps) {
            if (pf && (st = parse_rope(r, pf, "rope_parameters.full_attention", &full)))
                return st;
            if (ps && (st = parse_rope(r, ps, "rope_parameters.sliding_attention", &local)))
                return st;
        } else {
            if ((st = parse_rope(r, params, "rope_parameters", &full)))
                return st;
            if (fd->family == LMX_FAMILY_QWEN3)
                local = full;
        }
    } else if (scaling) {
        if ((st = parse_rope(r, scaling, "rope_scaling", &full)))
            return st;
        if (fd->family == LMX_FAMILY_QWEN3)
            local = full;
    }
    for (int i = 0; i < c->n_layers; i++)
        c->layers[i].rope = c->layers[i].window ? local : full;
    return LMX_OK;
}

/* The whole config ------------------------------------------------------ */

static lmx_status parse_text_config(const reader *r, const family_defaults *fd, lmx_config *c)
{
    lmx_status st;
    const long big = 1L << 20;
    if ((st = get_int(r, "vocab_size", fd->vocab_size, 1, 1, 1L << 24, &c->vocab_size)) ||
        (st = get_int(r, "hidden_size", fd->hidden_size, 1, 1, big, &c->hidden_size)) ||
        (st = get_int(r, "intermediate_size", fd->intermediate_size, 1, 1, big, &c->intermediate_size)) ||
        (st = get_int(r, "num_hidden_layers", fd->n_layers, 1, 1, 4096, &c->n_layers)) ||
        (st = get_int(r, "num_attention_heads", fd->n_heads, 1, 1, 4096, &c->n_heads)) ||
        (st = get_int(r, "num_key_value_heads", fd->n_kv_heads, 0, 1, 4096, &c->n_kv_heads)) ||
        (st = get_int(r, "head_dim", fd->head_dim, 0, 2, LMX_MAX_HEAD_DIM, &c->head_dim)) ||
        (st = get_int(r, "max_position_embeddings", fd->max_position, 0, 1, 1L << 30, &c->max_position)))
        return st;
    if (c->head_dim % 2)
        return lmx_fail(r->err, LMX_ERR_FORMAT, "%s: field '%shead_dim' = %d must be even", r->what,
                        r->prefix, c->head_dim);
    if (c->n_heads % c->n_kv_heads)
        return lmx_fail(r->err, LMX_ERR_FORMAT,
                        "%s: num_attention_heads = %d is not a multiple of num_key_value_heads = %d",
                        r->what, c->n_heads, c->n_kv_heads);
    double eps = 0;
    if ((st = get_num(r, "rms_norm_eps", 1e-6, 0.0, 1.0, &eps)))
        return st;
    c->rms_eps = (float)eps;

    const cJSON *act = field(r, fd->act_field);
    const char *a = act ? (cJSON_IsString(act) ? act->valuestring : "") : fd->act_default;
    if (!strcmp(a, "silu") || !strcmp(a, "swish"))
        c->act = LMX_ACT_SILU;
    else if (!strcmp(a, "gelu_pytorch_tanh"))
        c->act = LMX_ACT_GELU_TANH;
    else
        return lmx_fail(r->err, LMX_ERR_UNSUPPORTED,
                        "%s: field '%s%s' = '%s' is not supported (supported: silu, gelu_pytorch_tanh)",
                        r->what, r->prefix, fd->act_field, a);

    double cap = 0;
    if ((st = get_num(r, "attn_logit_softcapping", 0.0, 0.0, 1e9, &cap)))
        return st;
    c->attn_softcap = (float)cap;
    if ((st = get_num(r, "final_logit_softcapping", 0.0, 0.0, 1e9, &cap)))
        return st;
    c->final_softcap = (float)cap;

    if (fd->family == LMX_FAMILY_GEMMA3) {
        double qpas = 1;
        if ((st = get_num(r, "query_pre_attn_scalar", fd->query_pre_attn_scalar, 1e-6, 1e9, &qpas)))
            return st;
        c->attn_scale = (float)(1.0 / sqrt(qpas));
        c->embed_scale = sqrtf((float)c->hidden_size);
        c->norm_plus_one = 1;
        c->sandwich_norms = 1;
    } else {
        c->attn_scale = (float)(1.0 / sqrt((double)c->head_dim));
        c->embed_scale = 1.0f;
    }
    c->layers = calloc((size_t)c->n_layers, sizeof *c->layers);
    if (!c->layers)
        return lmx_fail(r->err, LMX_ERR_NOMEM, "%s: out of memory", r->what);
    return parse_layers(r, fd, c);
}

static lmx_status parse_generation(const char *json, size_t len, lmx_config *c, lmx_error *err)
{
    const char *what = "generation_config.json";
    cJSON *g = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(g)) {
        cJSON_Delete(g);
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: not a JSON object", what);
    }
    reader r = {g, what, "", 1, err};
    lmx_status st;
    int n = 0, do_sample = 0, top_k = 0;
    int32_t eos[LMX_MAX_EOS];
    double temperature = 1, top_p = 1, min_p = 0, rep = 1;
    if ((st = get_ids(&r, "eos_token_id", eos, &n)) ||
        (st = get_bool(&r, "do_sample", 0, &do_sample)) ||
        (st = get_num(&r, "temperature", 1.0, 0.0, 1e6, &temperature)) ||
        (st = get_int(&r, "top_k", 50, 0, 0, INT32_MAX, &top_k)) ||
        (st = get_num(&r, "top_p", 1.0, 0.0, 1.0, &top_p)) ||
        (st = get_num(&r, "min_p", 0.0, 0.0, 1.0, &min_p)) ||
        (st = get_num(&r, "repetition_penalty", 1.0, 1e-6, 1e6, &rep))) {
        cJSON_Delete(g);
        return st;
    }
    if (n > 0) {
        memcpy(c->eos_ids, eos, sizeof eos);
        c->n_eos = n;
    }
    int bos_n = 0;
    int32_t bos[LMX_MAX_EOS];
    if ((st = get_ids(&r, "bos_token_id", bos, &bos_n)) == LMX_OK && bos_n > 0)
        c->bos_id = bos[0];
    cJSON_Delete(g);
    if (st)
        return st;
    /* transformers samples only when do_sample is true; otherwise greedy. */
    c->gen.temperature = do_sample ? (float)temperature : 0.0f;
    c->gen.top_k = do_sample ? top_k : 0;
    c->gen.top_p = do_sample ? (float)top_p : 1.0f;
    c->gen.min_p = do_sample ? (float)min_p : 0.0f;
    c->gen.repetition_penalty = (float)rep;
    return LMX_OK;
}

lmx_status lmx_config_parse(const char *config_json, size_t len, const char *gen_json,
                            size_t gen_len, const char *what, lmx_config *c, lmx_error *err)
{
    memset(c, 0, sizeof *c);
    c->bos_id = -1;
    c->gen = (lmx_generation_defaults){0.0f, 0, 1.0f, 0.0f, 1.0f};
    cJSON *root = cJSON_ParseWithLength(config_json, len);
    if (!root)
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: not valid JSON", what);
    lmx_status st = LMX_OK;
    if (!cJSON_IsObject(root)) {
        st = lmx_fail(err, LMX_ERR_FORMAT, "%s: not a JSON object", what);
        goto done;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt)) {
        st = lmx_fail(err, LMX_ERR_FORMAT, "%s: field 'model_type' is missing (supported: %s)",
                      what, lmx_config_supported_types());
        goto done;
    }
    reader r = {root, what, "", 0, err};
    const family_defaults *fd;
    if (!strcmp(mt->valuestring, "qwen3")) {
        fd = &qwen3_defaults;
    } else if (!strcmp(mt->valuestring, "gemma3_text")) {
        fd = &gemma3_defaults;
    } else if (!strcmp(mt->valuestring, "gemma3")) {
        /* Gemma3ForConditionalGeneration: the text model under text_config,
         * every omitted field from Gemma3TextConfig's defaults. */
        fd = &gemma3_defaults;
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
        static const cJSON empty = {.type = cJSON_Object};
        if (tc && !cJSON_IsObject(tc)) {
            st = lmx_fail(err, LMX_ERR_FORMAT, "%s: field 'text_config' must be an object", what);
            goto done;
        }
        r = (reader){tc ? tc : &empty, what, "text_config.", 1, err};
        c->text_in_multimodal = 1;
    } else {
        st = lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: model_type '%s' is not supported (supported: %s)",
                      what, mt->valuestring, lmx_config_supported_types());
        goto done;
    }
    snprintf(c->model_type, sizeof c->model_type, "%s", mt->valuestring);
    c->family = fd->family;
    c->family_name = fd->name;
    if ((st = parse_text_config(&r, fd, c)))
        goto done;
    /* tie_word_embeddings sits at the top level for multimodal checkpoints */
    reader top = {root, what, "", 1, err};
    if ((st = get_bool(c->text_in_multimodal ? &top : &r, "tie_word_embeddings", fd->tied,
                       &c->tied_embeddings)))
        goto done;
    int32_t bos[LMX_MAX_EOS];
    int bos_n = 0;
    if ((st = get_ids(&r, "eos_token_id", c->eos_ids, &c->n_eos)) ||
        (st = get_ids(&r, "bos_token_id", bos, &bos_n)))
        goto done;
    if (c->n_eos == 0 && c->text_in_multimodal && (st = get_ids(&top, "eos_token_id", c->eos_ids, &c->n_eos)))
        goto done;
    if (bos_n > 0)
        c->bos_id = bos[0];
    if (gen_json && (st = parse_generation(gen_json, gen_len, c, err)))
        goto done;
done:
    cJSON_Delete(root);
    if (st)
        lmx_config_free(c);
    return st;
}

lmx_status lmx_config_load(const char *dir, lmx_config *c, lmx_error *err)
{
    memset(c, 0, sizeof *c);
    char *path = lmx_path_join(dir, "config.json");
    char *gpath = lmx_path_join(dir, "generation_config.json");
    char *text = NULL, *gtext = NULL;
    size_t len = 0, glen = 0;
    lmx_status st;
    if (!path || !gpath) {
        st = lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
    } else if ((st = lmx_read_file(path, &text, &len, err)) == LMX_OK &&
               (!lmx_file_exists(gpath) || (st = lmx_read_file(gpath, &gtext, &glen, err)) == LMX_OK)) {
        st = lmx_config_parse(text, len, gtext, glen, path, c, err);
    }
    free(text);
    free(gtext);
    free(path);
    free(gpath);
    return st;
}

void lmx_config_free(lmx_config *c)
{
    free(c->layers);
    c->layers = NULL;
}
