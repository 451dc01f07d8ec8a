#include "model.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "argmax.h"
#include "backend_cpu.h"
#include "backend_cuda.h"
#include "error.h"
#include "fileutil.h"

/* Weight names ------------------------------------------------------------ */

/* Where each family keeps its per-layer norms (the rest is shared). Qwen's
 * "post_attention_layernorm" is the norm before the MLP; Gemma's is applied
 * to the attention output. */
typedef struct family_names {
    const char *attn_norm, *ffn_norm, *post_attn_norm, *post_ffn_norm;
} family_names;

static const family_names qwen3_names = {"input_layernorm", "post_attention_layernorm", NULL, NULL};
static const family_names gemma3_names = {"input_layernorm", "pre_feedforward_layernorm",
                                          "post_attention_layernorm", "post_feedforward_layernorm"};

/* Text-model prefixes: causal LM, multimodal (new), multimodal (legacy). */
static const char *const text_prefixes[] = {"model.", "model.language_model.", "language_model.model."};
static const char *const head_names[] = {"lm_head.weight", "language_model.lm_head.weight"};

typedef struct binder {
    lmx_model *m;
    lmx_rank *rank; /* binds this rank's share (shard.h) */
    const char *prefix;
    lmx_error *err;
    int lookup; /* its tensors are only looked up by rows (lmx_backend_ops.weight) */
    size_t *measure; /* non-NULL: a dry run that adds up the bytes the tensors would take */
} binder;

static void format_shape(char *buf, size_t size, const int64_t *shape, int ndim)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, size - k, "[");
    for (int d = 0; d < ndim && k < size; d++)
        k += (size_t)snprintf(buf + k, size - k, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (k < size)
        snprintf(buf + k, size - k, "]");
}

/* Binds tensor `name` (after the prefix), or the slice s of it (NULL:
 * whole), after checking its shape is [rows, cols] (cols = 0: a vector of
 * rows elements). */
static lmx_tensor *bind(binder *b, const char *name, int64_t rows, int64_t cols, const lmx_slice *s,
                        const char *why)
{
    char full[256];
    snprintf(full, sizeof full, "%s%s", b->prefix, name);
    const lmx_st_tensor *t = lmx_st_find(b->m->st, full);
    if (!t) {
        lmx_fail(b->err, LMX_ERR_FORMAT, "checkpoint: tensor '%s' is missing", full);
        return NULL;
    }
    int64_t want[2] = {rows, cols};
    int want_dims = cols ? 2 : 1;
    if (t->ndim != want_dims || t->shape[0] != rows || (cols && t->shape[1] != cols)) {
        char have[96], need[96];
        format_shape(have, sizeof have, t->shape, t->ndim);
        format_shape(need, sizeof need, want, want_dims);
        lmx_fail(b->err, LMX_ERR_FORMAT, "%s: tensor '%s' has shape %s but config.json implies %s (%s)",
                 t->file, full, have, need, why);
        return NULL;
    }
    lmx_backend *be = b->rank->be;
    const lmx_slice *part = b->m->n_ranks > 1 ? s : NULL;
    if (b->measure) { /* what comes back is a placeholder that nothing reads */
        static max_align_t placeholder;
        *b->measure += be->ops->weight_bytes(be, t, part, b->lookup);
        return (lmx_tensor *)&placeholder;
    }
    lmx_tensor *w = be->ops->weight(be, t, part, b->lookup, b->err);
    if (w && b->rank == b->m->ranks) { /* the checkpoint's bytes, counted once */
        b->m->weight_bytes += t->nbytes;
        b->m->n_params += t->nbytes / lmx_dtype_size(t->dtype);
        b->m->dtypes_used |= 1u << t->dtype;
    }
    return w;
}

static lmx_status bind_layer(binder *b, int i, const family_names *fn, lmx_layer_weights *L)
{
    const lmx_config *c = &b->m->cfg;
    const lmx_shard_plan *P = &b->rank->plan;
    int D = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    int64_t q = (int64_t)c->n_heads * hd, kv = (int64_t)c->n_kv_heads * hd;
    /* column-parallel weights by rows, row-parallel ones by columns */
    lmx_slice q_rows = {P->q_head0 * hd, P->q_heads * hd, 0, D}, kv_rows = {P->kv_head0 * hd, P->kv_heads * hd, 0, D};
    lmx_slice o_cols = {0, D, P->q_head0 * hd, P->q_heads * hd};
    lmx_slice mlp_rows = {P->inter0, P->inter, 0, D}, down_cols = {0, D, P->inter0, P->inter};
    char name[128];
#define BIND(field, suffix, rows, cols, slice, why)                                                \
    do {                                                                                           \
        snprintf(name, sizeof name, "layers.%d.%s.weight", i, suffix);                             \
        if (!(L->field = bind(b, name, rows, cols, slice, why)))                                   \
            return b->err ? b->err->code : LMX_ERR_FORMAT;                                         \
    } while (0)
    BIND(attn_norm, fn->attn_norm, D, 0, NULL, "hidden_size");
    BIND(wq, "self_attn.q_proj", q, D, &q_rows, "num_attention_heads x head_dim, hidden_size");
    BIND(wk, "self_attn.k_proj", kv, D, &kv_rows, "num_key_value_heads x head_dim, hidden_size");
    BIND(wv, "self_attn.v_proj", kv, D, &kv_rows, "num_key_value_heads x head_dim, hidden_size");
    BIND(wo, "self_attn.o_proj", D, q, &o_cols, "hidden_size, num_attention_heads x head_dim");
    BIND(q_norm, "self_attn.q_norm", hd, 0, NULL, "head_dim");
    BIND(k_norm, "self_attn.k_norm", hd, 0, NULL, "head_dim");
    BIND(ffn_norm, fn->ffn_norm, D, 0, NULL, "hidden_size");
    BIND(w_gate, "mlp.gate_proj", I, D, &mlp_rows, "intermediate_size, hidden_size");
    BIND(w_up, "mlp.up_proj", I, D, &mlp_rows, "intermediate_size, hidden_size");
    BIND(w_down, "mlp.down_proj", D, I, &down_cols, "hidden_size, intermediate_size");
    if (fn->post_attn_norm) {
        BIND(post_attn_norm, fn->post_attn_norm, D, 0, NULL, "hidden_size");
        BIND(post_ffn_norm, fn->post_ffn_norm, D, 0, NULL, "hidden_size");
    }
#undef BIND
    return LMX_OK;
}

static lmx_status bind_weights(lmx_model *m, lmx_rank *rk, size_t *measure, lmx_error *err)
{
    const lmx_config *c = &m->cfg;
    binder b = {m, rk, NULL, err, 0, measure};
    lmx_slice vocab_rows = {rk->plan.vocab0, rk->plan.vocab, 0, c->hidden_size};
    char name[128];
    for (size_t i = 0; i < sizeof text_prefixes / sizeof *text_prefixes && !b.prefix; i++) {
        snprintf(name, sizeof name, "%sembed_tokens.weight", text_prefixes[i]);
        if (lmx_st_find(m->st, name))
            b.prefix = text_prefixes[i];
    }
    if (!b.prefix)
        return lmx_fail(err, LMX_ERR_FORMAT,
                        "checkpoint: tensor 'model.embed_tokens.weight' is missing (also looked for "
                        "the multimodal names 'model.language_model.*' and 'language_model.model.*')");
    binder table = b; /* untied, the table is only looked up; tied, it is the output head too */
    table.lookup = !c->tied_embeddings;
    if (!(rk->embed = bind(&table, "embed_tokens.weight", c->vocab_size, c->hidden_size, &vocab_rows,
                           "vocab_size, hidden_size")) ||
        !(rk->final_norm = bind(&b, "norm.weight", c->hidden_size, 0, NULL, "hidden_size")))
        return err ? err->code : LMX_ERR_FORMAT;
    rk->layers = calloc((size_t)c->n_layers, sizeof *rk->layers);
    if (!rk->layers)
        return lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
    const family_names *fn = c->family == LMX_FAMILY_GEMMA3 ? &gemma3_names : &qwen3_names;
    for (int i = 0; i < c->n_layers; i++) {
        lmx_status st = bind_layer(&b, i, fn, &rk->layers[i]);
        if (st)
            return st;
    }
    if (c->tied_embeddings) {
        rk->lm_head = rk->embed;
        return LMX_OK;
    }
    binder top = {m, rk, "", err, 0, measure};
    for (size_t i = 0; i < sizeof head_names / sizeof *head_names; i++)
        if (lmx_st_find(m->st, head_names[i]))
            return (rk->lm_head = bind(&top, head_names[i], c->vocab_size, c->hidden_size, &vocab_rows,
                                       "vocab_size, hidden_size"))
                       ? LMX_OK
                       : (err ? err->code : LMX_ERR_FORMAT);
    return lmx_fail(err, LMX_ERR_FORMAT,
                    "checkpoint: tensor 'lm_head.weight' is missing (tie_word_embeddings is false)");
}

/* Whether every rank's weights fit the memory its backend keeps them in
 * (check_room), from a dry run of binding them that checks their names
 * and shapes as loading does: a model too large fails before any copy. */
static lmx_status check_room(lmx_model *m, lmx_error *err)
{
    const lmx_backend_ops *ops = m->be->ops; /* the ranks' backends are of one kind */
    if (!ops->weight_bytes || !ops->check_room)
        return LMX_OK;
    size_t share[LMX_MAX_RANKS] = {0}, total = 0;
    for (int r = 0; r < m->n_ranks; r++) {
        lmx_rank probe = m->ranks[r];
        probe.layers = NULL;
        lmx_status st = bind_weights(m, &probe, &share[r], err);
        free(probe.layers);
        if (st)
            return st;
        total += share[r];
    }
    for (int r = 0; r < m->n_ranks; r++) {
        lmx_status st = ops->check_room(m->ranks[r].be, share[r], total, err);
        if (st)
            return st;
    }
    return LMX_OK;
}

static void free_weights(const lmx_model *m, lmx_rank *rk)
{
    const lmx_backend_ops *ops = rk->be->ops;
    if (rk->layers)
        for (int i = 0; i < m->cfg.n_layers; i++) {
            lmx_tensor **t = (lmx_tensor **)&rk->layers[i];
            for (size_t k = 0; k < sizeof rk->layers[i] / sizeof *t; k++)
                ops->free(rk->be, t[k]);
        }
    free(rk->layers);
    if (rk->lm_head != rk->embed)
        ops->free(rk->be, rk->lm_head);
    ops->free(rk->be, rk->embed);
    ops->free(rk->be, rk->final_norm);
}

/* Public API: loading ------------------------------------------------------ */

lmx_load_options lmx_load_defaults(void)
{
    return (lmx_load_options){.n_threads = 0, .n_ctx = 0, .quant = 0, .device = LMX_DEVICE_AUTO, .n_gpus = 0,
                              .kv_f16 = 0, .mmap_weights = 0, .prefill_bf16 = 0};
}

/* The tokenizer is optional: logits need none, text generation does. */
static lmx_status load_tokenizer(lmx_model *m, const char *dir, lmx_error *err)
{
    char *path = lmx_path_join(dir, "tokenizer.json");
    if (!path)
        return lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
    int present = lmx_file_exists(path);
    free(path);
    return present ? lmx_tokenizer_load(dir, &m->tok, err) : LMX_OK;
}

/* The backends o->device asks for (lmx.h: LMX_DEVICE_*), one per rank. */
static lmx_status new_backends(const lmx_load_options *o, int n_ranks, lmx_backend **out, lmx_error *err)
{
    int dev = o->device;
    if (dev == LMX_DEVICE_AUTO) {
        const char *env = getenv("LMX_DEVICE");
        if (env && *env && strcmp(env, "cpu") && strcmp(env, "cuda"))
            return lmx_fail(err, LMX_ERR_ARG, "LMX_DEVICE = '%s'; want cpu or cuda", env);
        if (env && *env)
            dev = strcmp(env, "cuda") ? LMX_DEVICE_CPU : LMX_DEVICE_CUDA;
        else
            dev = lmx_backend_cuda_available() ? LMX_DEVICE_CUDA : LMX_DEVICE_CPU;
    }
    if (dev == LMX_DEVICE_CPU && n_ranks == 1) {
        out[0] = lmx_backend_cpu_new(o, err);
        return out[0] ? LMX_OK : err ? err->code : LMX_ERR_NOMEM;
    }
    if (dev == LMX_DEVICE_CPU) { /* ranks share the cores */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        lmx_load_options rank = *o;
        rank.n_threads = (o->n_threads ? o->n_threads : cores > 0 ? (int)cores : 1) / n_ranks;
        rank.n_threads = rank.n_threads > 0 ? rank.n_threads : 1;
        return lmx_backend_cpu_new_group(n_ranks, &rank, out, err);
    }
    if (dev != LMX_DEVICE_CUDA)
        return lmx_fail(err, LMX_ERR_ARG, "lmx_load: device = %d; want LMX_DEVICE_AUTO, _CPU or _CUDA", dev);
    if (n_ranks == 1)
        return (out[0] = lmx_backend_cuda_new(0, o->quant, err)) ? LMX_OK : err ? err->code : LMX_ERR_UNSUPPORTED;
    return lmx_backend_cuda_new_group(n_ranks, o->quant, out, err);
}

/* The ranks: their plans, backends and weights; a thread each when several. */
static lmx_status load_ranks(lmx_model *m, int n_ranks, lmx_error *err)
{
    lmx_backend *bes[LMX_MAX_RANKS] = {0};
    if (!(m->ranks = calloc((size_t)n_ranks, sizeof *m->ranks)))
        return lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
    for (int r = 0; r < n_ranks; r++) {
        lmx_status st = lmx_shard_plan_make(&m->cfg, r, n_ranks, &m->ranks[r].plan, err);
        if (st)
            return st;
    }
    lmx_status st = new_backends(&m->opts, n_ranks, bes, err);
    if (st)
        return st;
    m->n_ranks = n_ranks; /* from here lmx_close destroys the backends */
    for (int r = 0; r < n_ranks; r++)
        m->ranks[r].be = bes[r];
    m->be = bes[0];
    if ((st = check_room(m, err)))
        return st;
    for (int r = 0; r < n_ranks; r++)
        if ((st = bind_weights(m, &m->ranks[r], NULL, err)))
            return st;
    if (n_ranks > 1 && !(m->crew = lmx_pool_new(n_ranks)))
        return lmx_fail(err, LMX_ERR_NOMEM, "cannot start %d rank threads", n_ranks);
    return LMX_OK;
}

lmx_model *lmx_load(const char *dir, const lmx_load_options *opts, lmx_error *err)
{
    if (!dir) {
        lmx_fail(err, LMX_ERR_ARG, "lmx_load: dir is NULL");
        return NULL;
    }
    lmx_load_options o = opts ? *opts : lmx_load_defaults();
    if (o.n_threads < 0 || o.n_threads > 1024 || o.n_ctx < 0) {
        lmx_fail(err, LMX_ERR_ARG, "lmx_load: n_threads must be in [0, 1024] and n_ctx >= 0");
        return NULL;
    }
    if (o.n_gpus < 0 || o.n_gpus > LMX_MAX_RANKS) {
        lmx_fail(err, LMX_ERR_ARG, "lmx_load: n_gpus = %d; want 0 to %d", o.n_gpus, LMX_MAX_RANKS);
        return NULL;
    }
    lmx_model *m = calloc(1, sizeof *m);
    if (!m) {
        lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (lmx_config_load(dir, &m->cfg, err)) {
        free(m);
        return NULL;
    }
    if (o.n_ctx == 0)
        o.n_ctx = m->cfg.max_position < 4096 ? m->cfg.max_position : 4096;
    m->opts = o;
    /* the tokenizer before the weights: a broken one fails in milliseconds, not after seconds of loading */
    if (lmx_st_open_dir(dir, &m->st, err) || load_tokenizer(m, dir, err) ||
        load_ranks(m, o.n_gpus > 1 ? o.n_gpus : 1, err)) {
        lmx_close(m);
        return NULL;
    }
    return m;
}

void lmx_close(lmx_model *m)
{
    if (!m)
        return;
    lmx_pool_free(m->crew);
    for (int r = 0; r < m->n_ranks; r++) {
        free_weights(m, &m->ranks[r]);
        m->ranks[r].be->ops->destroy(m->ranks[r].be);
    }
    free(m->ranks);
    lmx_tokenizer_free(m->tok);
    lmx_st_close(m->st);
    lmx_config_free(&m->cfg);
    free(m);
}

const char *lmx_model_type(const lmx_model *m) { return m ? m->cfg.family_name : NULL; }
int lmx_model_vocab_size(const lmx_model *m) { return m ? m->cfg.vocab_size : 0; }
int lmx_model_max_context(const lmx_model *m) { return m ? m->cfg.max_position : 0; }

/* A growing text buffer for lmx_model_describe. */
typedef struct text {
    char *buf;
    size_t len, cap;
    int failed;
} text;

__attribute__((format(printf, 2, 3))) static void put(text *t, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !t->failed; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = 1;
        } else if (t->buf && (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        } else {
            size_t cap = (t->cap + (size_t)n + 1) * 2;
            char *nb = realloc(t->buf, cap);
            if (!nb)
                t->failed = 1;
            t->buf = nb ? nb : t->buf;
            t->cap = nb ? cap : t->cap;
        }
    }
}

char *lmx_model_describe(const lmx_model *m)
{
    if (!m)
        return NULL;
    const lmx_config *c = &m->cfg;
    text t = {0};
    put(&t, "family:            %s (model_type %s%s)\n", c->family_name, c->model_type,
        c->text_in_multimodal ? ", text model of a multimodal checkpoint" : "");
    put(&t, "vocab_size:        %d\nhidden_size:       %d\nintermediate_size: %d\n", c->vocab_size,
        c->hidden_size, c->intermediate_size);
    put(&t, "layers:            %d\nheads:             %d query, %d key/value, head_dim %d\n",
        c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim);
    put(&t, "max_position:      %d\nrms_norm_eps:      %g (%s)\n", c->max_position, (double)c->rms_eps,
        c->norm_plus_one ? "(1 + w) * x" : "w * x");
    put(&t, "activation:        %s\nembedding scale:   %g\nattention scale:   %g\n",
        c->act == LMX_ACT_SILU ? "silu (SwiGLU)" : "gelu_pytorch_tanh (GeGLU)", (double)c->embed_scale,
        (double)c->attn_scale);
    put(&t, "softcapping:       attention %g, final %g (0 = none)\n", (double)c->attn_softcap,
        (double)c->final_softcap);
    put(&t, "output head:       %s\n", c->tied_embeddings ? "tied to the embeddings" : "lm_head");
    if (m->n_ranks > 1)
        put(&t, "tensor parallel:   %d ranks on %s, %d query and %d key/value heads each\n", m->n_ranks,
            m->be->ops->name, m->ranks[0].plan.q_heads, m->ranks[0].plan.kv_heads);
    put(&t, "eos ids:          ");
    for (int i = 0; i < c->n_eos; i++)
        put(&t, " %d", (int)c->eos_ids[i]);
    put(&t, "%s\nbos id:            %d\n", c->n_eos ? "" : " (none)", (int)c->bos_id);
    put(&t, "weights:          ");
    for (int d = 0; d < LMX_DT_COUNT; d++)
        if (m->dtypes_used & (1u << d))
            put(&t, " %s", lmx_dtype_name((lmx_dtype)d));
    put(&t, "\nparameters:        %zu (%.3f B)\nweight bytes:      %zu (%.2f GB)\n", m->n_params,
        (double)m->n_params / 1e9, m->weight_bytes, (double)m->weight_bytes / 1e9);
    for (int i = 0; i < c->n_layers; i++) {
        const lmx_layer_config *l = &c->layers[i];
        if (l->window)
            put(&t, "layer %3d:         sliding window %d", i, l->window);
        else
            put(&t, "layer %3d:         global", i);
        put(&t, ", rope theta %g", (double)l->rope.theta);
        if (l->rope.factor != 1.0f)
            put(&t, " linear x%g", (double)l->rope.factor);
        put(&t, "\n");
    }
    if (t.failed) {
        free(t.buf);
        return NULL;
    }
    return t.buf;
}

/* Forward pass ----------------------------------------------------------- */

int lmx_model_cache_slots(const lmx_model *m, int layer, int n_ctx, int max_rows)
{
    int w = m->cfg.layers[layer].window;
    if (w > 0 && w + max_rows - 1 < n_ctx)
        return w + max_rows - 1;
    return n_ctx;
}

double lmx_model_decode_weight_bytes(const lmx_model *m, size_t (*bytes)(const lmx_tensor *))
{
    double b = 0;
    const lmx_config *c = &m->cfg;
    const lmx_rank *rk = &m->ranks[0];
    for (int i = 0; i < c->n_layers; i++) {
        const lmx_tensor *const *t = (const lmx_tensor *const *)&rk->layers[i];
        for (size_t k = 0; k < sizeof rk->layers[i] / sizeof *t; k++)
            if (t[k])
                b += (double)bytes(t[k]);
    }
    b += (double)bytes(rk->lm_head) + (double)bytes(rk->final_norm);
    b += (double)bytes(rk->embed) / c->vocab_size;
    return b;
}

double lmx_model_decode_kv_bytes(const lmx_model *m, int pos, double elem)
{
    const lmx_config *c = &m->cfg;
    double b = 0;
    for (int i = 0; i < c->n_layers; i++) {
        int w = c->layers[i].window, n = w > 0 && w < pos + 1 ? w : pos + 1;
        b += 2.0 * n * c->n_kv_heads * c->head_dim * elem;
    }
    return b;
}

enum { LOGITS_ROWS = 16 };

/* Keys and values a rank's KV cache holds over every layer. */
static size_t cache_elems(const lmx_model *m, const lmx_rank *rk, int n_ctx, int max_rows)
{
    size_t n = 0;
    for (int i = 0; i < m->cfg.n_layers; i++)
        n += 2 * (size_t)lmx_model_cache_slots(m, i, n_ctx, max_rows) * rk->plan.kv_heads * m->cfg.head_dim;
    return n;
}

/* Whether every rank's KV cache fits (check_cache_room) before any is
 * allocated: on the CPU the cache's pages are only taken as the context
 * fills, so one too large would fail then, in the kernel's out-of-memory
 * killer. */
static lmx_status check_cache_room(const lmx_model *m, int n_ctx, int max_rows, lmx_error *err)
{
    const lmx_backend_ops *ops = m->be->ops;
    if (!ops->check_cache_room)
        return LMX_OK;
    size_t share[LMX_MAX_RANKS] = {0}, total = 0;
    for (int r = 0; r < m->n_ranks; r++)
        total += share[r] = cache_elems(m, &m->ranks[r], n_ctx, max_rows);
    for (int r = 0; r < m->n_ranks; r++) {
        lmx_status st = ops->check_cache_room(m->ranks[r].be, share[r], total, n_ctx, err);
        if (st)
            return st;
    }
    return LMX_OK;
}

static lmx_status rank_state_init(const lmx_model *m, const lmx_rank *rk, lmx_rank_state *rs, int n_ctx,
                                  int max_rows, lmx_error *err)
{
    const lmx_config *c = &m->cfg;
    lmx_backend *be = rk->be;
    const lmx_shard_plan *P = &rk->plan;
    int q = P->q_heads * c->head_dim, kv = P->kv_heads * c->head_dim;
    rs->k_cache = calloc((size_t)c->n_layers, sizeof *rs->k_cache);
    rs->v_cache = calloc((size_t)c->n_layers, sizeof *rs->v_cache);
    if (!rs->k_cache || !rs->v_cache)
        return lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
    lmx_tensor *(*alloc_cache)(lmx_backend *, int, int, lmx_error *) =
        be->ops->alloc_cache ? be->ops->alloc_cache : be->ops->alloc;
    for (int i = 0; i < c->n_layers; i++) {
        int slots = lmx_model_cache_slots(m, i, n_ctx, max_rows);
        if (!(rs->k_cache[i] = alloc_cache(be, slots, kv, err)) || !(rs->v_cache[i] = alloc_cache(be, slots, kv, err)))
            return err ? err->code : LMX_ERR_NOMEM;
    }
    lmx_tensor **t[] = {&rs->x, &rs->h, &rs->o, &rs->q, &rs->att, &rs->k, &rs->v, &rs->gate, &rs->up};
    int cols[] = {c->hidden_size, c->hidden_size, c->hidden_size, q, q, kv, kv, P->inter, P->inter};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (!(*t[i] = be->ops->alloc(be, max_rows, cols[i], err)))
            return err ? err->code : LMX_ERR_NOMEM;
    if (!(rs->rows_out = be->ops->alloc(be, LOGITS_ROWS, c->hidden_size, err)) ||
        !(rs->logits = be->ops->alloc(be, LOGITS_ROWS, P->vocab, err)))
        return err ? err->code : LMX_ERR_NOMEM;
    return LMX_OK;
}

lmx_status lmx_forward_state_init(lmx_model *m, lmx_forward_state *fs, int n_ctx, int max_rows,
                                  lmx_error *err)
{
    memset(fs, 0, sizeof *fs);
    fs->max_rows = max_rows;
    fs->logits_rows = LOGITS_ROWS;
    if (!(fs->ranks = calloc((size_t)m->n_ranks, sizeof *fs->ranks)))
        return lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
    lmx_status room = check_cache_room(m, n_ctx, max_rows, err);
    if (room)
        return room;
    for (int r = 0; r < m->n_ranks; r++) {
        lmx_status st = rank_state_init(m, &m->ranks[r], &fs->ranks[r], n_ctx, max_rows, err);
        if (st)
            return st;
    }
    return LMX_OK;
}

void lmx_forward_state_free(lmx_model *m, lmx_forward_state *fs)
{
    for (int r = 0; fs->ranks && r < m->n_ranks; r++) {
        lmx_backend *be = m->ranks[r].be;
        lmx_rank_state *rs = &fs->ranks[r];
        for (int i = 0; i < m->cfg.n_layers; i++) {
            if (rs->k_cache)
                be->ops->free(be, rs->k_cache[i]);
            if (rs->v_cache)
                be->ops->free(be, rs->v_cache[i]);
        }
        free(rs->k_cache);
        free(rs->v_cache);
        lmx_tensor *t[] = {rs->x, rs->h, rs->q, rs->k, rs->v, rs->att, rs->o, rs->gate, rs->up,
                           rs->rows_out, rs->logits};
        for (size_t i = 0; i < sizeof t / sizeof *t; i++)
            be->ops->free(be, t[i]);
    }
    free(fs->ranks);
    memset(fs, 0, sizeof *fs);
}

/* Final norm is done; rows [row0, row0 + k) of h (k <= logits_rows) through
 * the output head: this rank's share of their logits, in rs->logits. */
static void head_rows(const lmx_model *m, const lmx_rank *rk, lmx_rank_state *rs, int row0, int k)
{
    lmx_backend *be = rk->be;
    const lmx_backend_ops *ops = be->ops;
    const lmx_tensor *x = rs->h;
    if (row0) { /* the rows first, as the product reads from row 0 */
        ops->copy_rows(be, rs->rows_out, 0, rs->h, row0, k);
        x = rs->rows_out;
    }
    ops->matmul(be, rs->logits, x, rk->lm_head, k);
    if (m->cfg.final_softcap > 0)
        ops->softcap(be, rs->logits, k, m->cfg.final_softcap);
}

/* Rows [row0, row0 + n) of h as logits, into this rank's columns of dst. */
static void emit_logits(const lmx_model *m, const lmx_rank *rk, lmx_rank_state *rs, int logits_rows, int row0,
                        int n, float *dst)
{
    size_t V = (size_t)m->cfg.vocab_size;
    for (int r = 0; r < n; r += logits_rows) {
        int k = n - r < logits_rows ? n - r : logits_rows;
        head_rows(m, rk, rs, row0 + r, k);
        rk->be->ops->read(rk->be, dst + (size_t)r * V + rk->plan.vocab0, V, rs->logits, 0, k);
    }
}

/* What a step gives back, as backend.h's step flags: steps that differ in
 * it run different ops. */
static int step_flags(const lmx_forward_out *out)
{
    if (out->top)
        return 5 + out->top_k;
    if (out->drawn)
        return 4;
    if (out->top1)
        return 3;
    return out->logits ? 1 + (out->all_positions != 0) : 0;
}

/* One forward step on one rank: every rank calls the same ops in the same
 * order, all-reducing the partial sums of attention and MLP. */
static lmx_status forward_rank(const lmx_model *m, const lmx_rank *rk, lmx_rank_state *rs, int logits_rows,
                               const int32_t *ids, int n, int pos0, const lmx_forward_out *out, lmx_error *err)
{
    const lmx_config *c = &m->cfg;
    lmx_backend *be = rk->be;
    const lmx_backend_ops *ops = be->ops;
    float eps = c->rms_eps;
    int p1 = c->norm_plus_one, split = m->n_ranks > 1;
    if (ops->step_begin)
        ops->step_begin(be, rs, step_flags(out), ids, n, pos0, out->drawn ? out->draw : NULL);
    ops->embed(be, rs->x, rk->embed, ids, n, c->embed_scale, rk->plan.vocab0);
    if (split)
        ops->all_reduce(be, rs->x, n);
    ops->rmsnorm(be, rs->h, rs->x, rk->layers[0].attn_norm, n, eps, p1);
    for (int i = 0; i < c->n_layers; i++) {
        const lmx_layer_weights *L = &rk->layers[i];
        const lmx_layer_config *lc = &c->layers[i];
        /* h = attn_norm(x) here */
        lmx_tensor *qkv[] = {rs->q, rs->k, rs->v};
        const lmx_tensor *w_qkv[] = {L->wq, L->wk, L->wv};
        ops->matmul_multi(be, 3, qkv, rs->h, w_qkv, n);
        ops->qk_prepare(be, rs->q, rs->k, rs->v, L->q_norm, L->k_norm, rs->k_cache[i], rs->v_cache[i], n,
                        c->head_dim, pos0, lc->rope, eps, p1);
        lmx_attn_params ap = {n, pos0, rk->plan.q_heads, rk->plan.kv_heads, c->head_dim, lc->window,
                              c->attn_scale, c->attn_softcap};
        ops->attention(be, rs->att, rs->q, rs->k_cache[i], rs->v_cache[i], &ap);
        ops->matmul(be, rs->o, rs->att, L->wo, n);
        if (split)
            ops->all_reduce(be, rs->o, n);
        ops->residual_norm(be, rs->x, rs->h, rs->o, L->post_attn_norm, L->ffn_norm, n, eps, p1, 1);

        ops->gated_mlp(be, rs->gate, rs->up, rs->h, L->w_gate, L->w_up, n, c->act);
        ops->matmul(be, rs->o, rs->gate, L->w_down, n);
        if (split)
            ops->all_reduce(be, rs->o, n);
        int last = i + 1 == c->n_layers; /* then h goes to the output head, row by row */
        const lmx_tensor *next = last ? rk->final_norm : rk->layers[i + 1].attn_norm;
        ops->residual_norm(be, rs->x, rs->h, rs->o, L->post_ffn_norm, next, n, eps, p1, !last);
    }
    /* h = final_norm(x) */
    if (out->top1) {
        head_rows(m, rk, rs, n - 1, 1);
        ops->read_argmax(be, &rs->top_score, &rs->top_col, rs->logits, 0);
    } else if (out->top) {
        head_rows(m, rk, rs, n - 1, 1);
        size_t share = (size_t)(rk - m->ranks) * LMX_TOPK_GROUPS * out->top_k; /* the rank's own room */
        rs->top_groups = ops->read_topk(be, out->top + share, out->top_k, rs->logits, 0);
    } else if (out->drawn) {
        head_rows(m, rk, rs, n - 1, 1);
        ops->read_draw(be, out->drawn, rs->logits, 0);
    } else if (out->logits && out->all_positions) {
        emit_logits(m, rk, rs, logits_rows, 0, n, out->logits);
    } else if (out->logits) {
        emit_logits(m, rk, rs, logits_rows, n - 1, 1, out->logits);
    }
    return ops->step_end ? ops->step_end(be, err) : LMX_OK;
}

typedef struct rank_job {
    const lmx_model *m;
    lmx_forward_state *fs;
    const int32_t *ids;
    int n, pos0;
    const lmx_forward_out *out;
    lmx_status status[LMX_MAX_RANKS];
    lmx_error errs[LMX_MAX_RANKS];
} rank_job;

static void rank_task(void *ctx, int r, int worker)
{
    rank_job *j = ctx;
    j->status[r] = forward_rank(j->m, &j->m->ranks[r], &j->fs->ranks[r], j->fs->logits_rows, j->ids, j->n,
                                j->pos0, j->out, &j->errs[r]);
}

/* The ranks' argmaxes of their shares of the vocabulary, as one id. */
static int32_t merge_top1(const lmx_model *m, const lmx_forward_state *fs)
{
    float best = fs->ranks[0].top_score;
    int32_t id = m->ranks[0].plan.vocab0 + fs->ranks[0].top_col;
    for (int r = 1; r < m->n_ranks; r++) {
        int32_t c = m->ranks[r].plan.vocab0 + fs->ranks[r].top_col;
        if (lmx_argmax_beats(fs->ranks[r].top_score, c, best, id)) {
            best = fs->ranks[r].top_score;
            id = c;
        }
    }
    return id;
}

/* The ranks' groups, each in its own room, moved together and given
 * vocabulary ids. */
static int merge_top(const lmx_model *m, const lmx_forward_state *fs, lmx_scored *top, int k)
{
    int groups = 0;
    for (int r = 0; r < m->n_ranks; r++)
        for (int g = 0; g < fs->ranks[r].top_groups; g++, groups++)
            for (int j = 0; j < k; j++) {
                lmx_scored e = top[((size_t)r * LMX_TOPK_GROUPS + g) * k + j];
                if (e.col >= 0)
                    e.col += m->ranks[r].plan.vocab0;
                top[(size_t)groups * k + j] = e;
            }
    return groups;
}

int lmx_model_can_draw(const lmx_model *m) { return m->n_ranks == 1 && m->ranks[0].be->ops->read_draw; }

size_t lmx_model_top_capacity(const lmx_model *m, int k) { return (size_t)m->n_ranks * LMX_TOPK_GROUPS * k; }

lmx_status lmx_model_last_logits(lmx_model *m, lmx_forward_state *fs, float *logits, lmx_error *err)
{
    for (int r = 0; r < m->n_ranks; r++) {
        lmx_backend *be = m->ranks[r].be;
        lmx_rank_state *rs = &fs->ranks[r];
        int32_t none = 0;
        /* a step of no rows: the backend's lock, and no recording */
        if (be->ops->step_begin)
            be->ops->step_begin(be, rs, 0, &none, 0, 0, NULL);
        be->ops->read(be, logits + m->ranks[r].plan.vocab0, 0, rs->logits, 0, 1);
        lmx_status st = be->ops->step_end ? be->ops->step_end(be, err) : LMX_OK;
        if (st)
            return st;
    }
    return LMX_OK;
}

lmx_status lmx_model_forward(lmx_model *m, lmx_forward_state *fs, const int32_t *ids, int n, int pos0,
                             const lmx_forward_out *out, lmx_error *err)
{
    if (n <= 0 || n > fs->max_rows)
        return lmx_fail(err, LMX_ERR_INTERNAL, "forward: %d rows do not fit a chunk of %d", n, fs->max_rows);
    if (out->drawn && !lmx_model_can_draw(m))
        return lmx_fail(err, LMX_ERR_INTERNAL, "forward: a draw asked of a model whose backend cannot draw");
    lmx_status st = LMX_OK;
    if (m->n_ranks == 1) {
        st = forward_rank(m, m->ranks, fs->ranks, fs->logits_rows, ids, n, pos0, out, err);
    } else {
        /* the crew has exactly one thread per rank: every rank runs at
         * once, as its all-reduces need */
        rank_job j = {.m = m, .fs = fs, .ids = ids, .n = n, .pos0 = pos0, .out = out};
        lmx_pool_run(m->crew, m->n_ranks, rank_task, &j);
        for (int r = 0; r < m->n_ranks && !st; r++)
            if ((st = j.status[r]))
                lmx_fail(err, st, "rank %d: %s", r, j.errs[r].message);
    }
    if (!st && out->top1)
        *out->top1 = merge_top1(m, fs);
    if (!st && out->top)
        *out->top_groups = merge_top(m, fs, out->top, out->top_k);
    return st;
}
