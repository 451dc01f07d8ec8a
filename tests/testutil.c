#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "context.h"
#include "sampler.h"

int test_checks, test_failures;

static char tmpdir_path[256];

int test_finish(void)
{
    if (tmpdir_path[0]) { /* scratch files go with the test */
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir_path);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tmpdir_path);
    }
    printf("%d passed, %d failed\n", test_checks - test_failures, test_failures);
    if (test_checks == 0) {
        fprintf(stderr, "no check ran\n");
        return 1;
    }
    return test_failures ? 1 : 0;
}

int test_run(const char *cmd, char **out)
{
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 2) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
        }
    }
    if (buf)
        buf[len] = 0;
    int st = pclose(p);
    if (out)
        *out = buf;
    else
        free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const char *test_tmpdir(void)
{
    if (!tmpdir_path[0]) {
        snprintf(tmpdir_path, sizeof tmpdir_path, "/tmp/lmx-test-%d", (int)getpid());
        mkdir(tmpdir_path, 0700);
    }
    return tmpdir_path;
}

int test_have_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

const lmx_st_tensor *test_ref(const lmx_st_set *refs, int k, const char *what)
{
    char name[64];
    snprintf(name, sizeof name, "p%d.%s", k, what);
    return lmx_st_find(refs, name);
}

int test_argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

int32_t test_eval_argmax(lmx_context *c, const int32_t *ids, int n)
{
    lmx_error err = {0};
    int32_t id = -1;
    lmx_status st = c ? lmx_context_eval_argmax(c, ids, n, &id, &err) : LMX_ERR_ARG;
    CHECK(st == LMX_OK, "eval_argmax: %s", c ? err.message : "no context");
    return st == LMX_OK ? id : -1;
}

lmx_context *test_eval_prompt(lmx_model *m, const int32_t *ids, int L, int chunk, int rows, float *logits)
{
    lmx_error err = {0};
    lmx_context *c = logits ? lmx_context_new_chunked(m, 128, rows, &err) : NULL;
    CHECK(c != NULL, "context: %s", logits ? err.message : "no memory for the logits");
    int V = lmx_model_vocab_size(m), step = chunk ? chunk : L;
    for (int i = 0; c && i < L; i += step) {
        int n = L - i < step ? L - i : step;
        lmx_status st = lmx_context_eval(c, ids + i, n, logits + (size_t)i * V, 1, &err);
        CHECK(st == LMX_OK, "eval: %s", err.message);
    }
    return c;
}

void test_greedy(lmx_model *m, lmx_context *c, int rows, const int32_t *ids, int L, float *last, int V,
                 const lmx_st_tensor *g, const float *margin, float (*min_margin)(const float *, int),
                 const char *tag)
{
    lmx_error err = {0};
    lmx_context *ca = lmx_context_new_chunked(m, 128, rows, &err);
    int32_t picked = test_eval_argmax(ca, ids, L);
    for (int t = 0; t < (int)g->shape[0]; t++) {
        int32_t next = test_argmax(last, V), want = ((const int32_t *)g->data)[t];
        CHECK(picked == next, "%s argmax step %d: %d, the logits' %d", tag, t, (int)picked, (int)next);
        if (margin[t] > min_margin(last, V))
            CHECK(next == want, "%s greedy step %d: %d, want %d", tag, t, (int)next, (int)want);
        if (next != want)
            break; /* a tie broke differently: later steps diverge legitimately */
        CHECK(lmx_context_eval(c, &next, 1, last, 0, &err) == LMX_OK, "greedy eval: %s", err.message);
        picked = test_eval_argmax(ca, &next, 1);
    }
    lmx_context_free(ca);
}

void test_sampled(lmx_model *m, int rows, const int32_t *ids, int L, int steps, const char *tag)
{
    const lmx_sampler_params cases[] = {{0.6f, 20, 0.95f, 0, 1, 17}, {1.0f, 64, 0.95f, 0.02f, 1, 18},
                                        {0.8f, 40, 1, 0, 1.3f, 19},  {0, 0, 1, 0, 1.5f, 20},
                                        {0.5f, 0, 1, 0.5f, 1, 21}};
    int V = lmx_model_vocab_size(m);
    float *whole = malloc((size_t)V * sizeof *whole), *left = malloc((size_t)V * sizeof *left);
    int32_t *hist = malloc((size_t)(L + steps) * sizeof *hist); /* the prompt and the tokens drawn */
    for (size_t k = 0; k < sizeof cases / sizeof *cases && whole && left && hist; k++) {
        lmx_error err = {0};
        lmx_context *ct = lmx_context_new_chunked(m, L + steps, rows, &err), *cw = lmx_context_new_chunked(m, L + steps, rows, &err);
        lmx_sampler *st = NULL, *sw = NULL;
        lmx_sampler_new(&cases[k], V, &st, &err);
        lmx_sampler_new(&cases[k], V, &sw, &err);
        int per = st ? lmx_sampler_top_request(st) : 0, decided = 0;
        lmx_scored *top = ct && per ? malloc(lmx_context_top_capacity(ct, per) * sizeof *top) : NULL;
        CHECK(ct && cw && sw && top, "%s: setup: %s", tag, err.message);
        memcpy(hist, ids, (size_t)L * sizeof *hist);
        const int32_t *in = ids;
        int32_t next = -1;
        for (int s = 0, n = L; s < steps && ct && cw && sw && top; s++, in = &next, n = 1) {
            int groups = 0;
            size_t nh = (size_t)(L + s);
            lmx_status st_t = lmx_context_eval_top(ct, in, n, per, top, &groups, &err);
            CHECK(st_t == LMX_OK, "%s: eval_top: %s", tag, err.message);
            CHECK(lmx_context_eval(cw, in, n, whole, 0, &err) == LMX_OK, "%s: eval: %s", tag, err.message);
            CHECK(lmx_context_last_logits(ct, left, &err) == LMX_OK && !memcmp(whole, left, (size_t)V * sizeof *left),
                  "%s step %d: the logits eval_top left differ from eval's (%s)", tag, s, err.message);
            int32_t got = lmx_sampler_sample_top(st, top, groups, per, hist, nh);
            decided += got >= 0;
            if (got < 0) /* as a stream does */
                got = lmx_sampler_sample(st, left, hist, nh);
            next = lmx_sampler_sample(sw, whole, hist, nh);
            CHECK(got == next, "%s case %zu step %d: drew %d from the best scores, %d from the logits", tag, k, s,
                  (int)got, (int)next);
            hist[L + s] = next;
            if (st_t != LMX_OK)
                break;
        }
        CHECK(decided >= steps - 1, "%s case %zu: only %d of %d draws decided by the best scores", tag, k, decided,
              steps);
        free(top);
        lmx_sampler_free(st);
        lmx_sampler_free(sw);
        lmx_context_free(ct);
        lmx_context_free(cw);
    }
    free(whole);
    free(left);
    free(hist);
}

int test_drawn(lmx_model *m, int rows, const int32_t *ids, int L, int steps, const char *tag)
{
    const lmx_sampler_params cases[] = {{1.0f, 0, 1, 0, 1, 31}, {0.7f, 0, 1, 0.05f, 1, 32}, {1.5f, 0, 1, 0, 1, 33}};
    int V = lmx_model_vocab_size(m), drawn = 0;
    float *whole = malloc((size_t)V * sizeof *whole);
    int32_t *hist = malloc((size_t)(L + steps) * sizeof *hist);
    for (size_t k = 0; k < sizeof cases / sizeof *cases && whole && hist; k++) {
        lmx_error err = {0};
        lmx_context *cd = lmx_context_new_chunked(m, L + steps, rows, &err), *cw = lmx_context_new_chunked(m, L + steps, rows, &err);
        lmx_sampler *sd = NULL, *sw = NULL;
        lmx_sampler_new(&cases[k], V, &sd, &err);
        lmx_sampler_new(&cases[k], V, &sw, &err);
        CHECK(cd && cw && sd && sw && lmx_sampler_draws_dense(sd), "%s: draw setup: %s", tag, err.message);
        memcpy(hist, ids, (size_t)L * sizeof *hist);
        const int32_t *in = ids;
        int32_t next = -1;
        for (int s = 0, n = L; s < steps && cd && cw && sd && sw && lmx_context_can_draw(cd); s++, in = &next, n = 1) {
            lmx_draw d = lmx_sampler_next_draw(sd);
            int32_t got = -1;
            lmx_status st = lmx_context_eval_draw(cd, in, n, &d, &got, &err);
            CHECK(st == LMX_OK, "%s: eval_draw: %s", tag, err.message);
            CHECK(lmx_context_eval(cw, in, n, whole, 0, &err) == LMX_OK, "%s: eval: %s", tag, err.message);
            next = lmx_sampler_sample(sw, whole, hist, (size_t)(L + s));
            CHECK(got == next, "%s draw case %zu step %d: the backend drew %d, the host %d", tag, k, s, (int)got,
                  (int)next);
            drawn += st == LMX_OK;
            hist[L + s] = next;
            if (st != LMX_OK)
                break;
        }
        lmx_sampler_free(sd);
        lmx_sampler_free(sw);
        lmx_context_free(cd);
        lmx_context_free(cw);
    }
    free(whole);
    free(hist);
    return drawn;
}

void test_fixed_ids(int32_t *ids, int n, int V)
{
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 7919u + 17u) % (unsigned)V);
}

float test_max_abs(const float *v, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabsf(v[i]) > m ? fabsf(v[i]) : m;
    return m;
}

/* One tensor's header entry; *at advances past its bytes. */
static void sparse_tensor(FILE *h, const char *name, long long rows, long long cols, size_t *at)
{
    size_t bytes = (size_t)rows * (size_t)(cols ? cols : 1) * 2;
    fprintf(h, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld", *at ? "," : "", name, rows);
    if (cols)
        fprintf(h, ",%lld", cols);
    fprintf(h, "],\"data_offsets\":[%zu,%zu]}", *at, *at + bytes);
    *at += bytes;
}

size_t test_write_sparse_model(const char *dir, size_t at_least)
{
    const int D = 8192, I = 28672, V = 32768, hd = 128, heads = D / hd, kv = 8;
    size_t layer = 2 * ((size_t)D * heads * hd * 2 + (size_t)D * kv * hd * 2 + (size_t)D * I * 3);
    int layers = (int)(at_least / layer) + 1;
    char path[700], name[128];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return 0;
    fprintf(f,
            "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": %d, "
            "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
            "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
            "\"max_position_embeddings\": %d, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000, "
            "\"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}\n",
            V, D, I, layers, heads, kv, hd, TEST_SPARSE_POSITIONS);
    fclose(f);
    char *header = NULL;
    size_t header_len = 0, at = 0;
    FILE *h = open_memstream(&header, &header_len);
    if (!h)
        return 0;
    fputc('{', h);
    sparse_tensor(h, "model.embed_tokens.weight", V, D, &at);
    sparse_tensor(h, "lm_head.weight", V, D, &at);
    sparse_tensor(h, "model.norm.weight", D, 0, &at);
    const struct {
        const char *suffix;
        long long rows, cols;
    } parts[] = {{"input_layernorm", D, 0},
                 {"post_attention_layernorm", D, 0},
                 {"self_attn.q_proj", (long long)heads * hd, D},
                 {"self_attn.k_proj", (long long)kv * hd, D},
                 {"self_attn.v_proj", (long long)kv * hd, D},
                 {"self_attn.o_proj", D, (long long)heads * hd},
                 {"self_attn.q_norm", hd, 0},
                 {"self_attn.k_norm", hd, 0},
                 {"mlp.gate_proj", I, D},
                 {"mlp.up_proj", I, D},
                 {"mlp.down_proj", D, I}};
    for (int l = 0; l < layers; l++)
        for (size_t p = 0; p < sizeof parts / sizeof *parts; p++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, parts[p].suffix);
            sparse_tensor(h, name, parts[p].rows, parts[p].cols, &at);
        }
    fputc('}', h);
    while (ftell(h) % 8) /* the data starts 8-byte aligned */
        fputc(' ', h);
    fclose(h);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    uint64_t n = header_len;
    int ok = f && fwrite(&n, 8, 1, f) == 1 && fwrite(header, 1, header_len, f) == header_len &&
             ftruncate(fileno(f), (off_t)(8 + header_len + at)) == 0;
    if (f)
        ok = fclose(f) == 0 && ok;
    free(header);
    return ok ? at : 0;
}
