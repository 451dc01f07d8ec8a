#include "stream.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "context.h"
#include "error.h"
#include "model.h"
#include "prompt.h"
#include "sampler.h"
#include "stopstr.h"

struct lmx_stream {
    lmx_model *m;
    lmx_gen_config cfg;
    lmx_stream_ctx how;
    lmx_context *ctx;
    int owns_ctx;

    int32_t *tokens;     /* prompt, then generated tokens */
    int n_tokens, cap_tokens;
    int n_prompt, n_cached, generated;
    int32_t eos[LMX_MAX_EOS + 1];
    int n_eos;

    float *logits;
    lmx_sampler *sampler;
    int greedy;          /* argmax without a penalty: only the next id is asked for */
    int draws;           /* with only a temperature and min-p on a backend that draws: it picks the token */
    int32_t next;        /* that id, when greedy or drawn by the backend */
    int top_per;         /* else, with top-k, min-p alone or greedy with a penalty: groups of this many best scores */
    lmx_scored *top;     /* those groups (lmx_sampler_sample_top), top_groups of them */
    int top_groups;
    int top_wait;        /* steps that take the logits instead, after best scores that could not decide */
    int top_backoff;     /* the next such wait: 0, 1, 3, 7 ... TOP_BACKOFF_MAX while they keep failing */
    lmx_detok *detok;
    lmx_stopstr stop;
    char *tail;          /* text released at the end */
    size_t tail_len, tail_cap;

    atomic_int cancel;
    int started, last_pending, tail_sent;
    lmx_stop_reason reason;
    lmx_error err;
    double t_start, t_prefill0, t_prefill1, t_first, t_last;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *lmx_stop_reason_name(lmx_stop_reason r)
{
    static const char *const names[] = {"none", "eos", "stop_token", "stop_string", "max_tokens",
                                        "context_full", "cancelled", "error"};
    return (unsigned)r < sizeof names / sizeof *names ? names[r] : "unknown";
}

lmx_gen_config lmx_gen_defaults(const lmx_model *m)
{
    lmx_gen_config c = {0};
    c.temperature = 0.0f;
    c.top_p = 1.0f;
    c.repetition_penalty = 1.0f;
    c.enable_thinking = 1;
    c.add_special = 1;
    if (m) {
        const lmx_generation_defaults *g = &m->cfg.gen;
        c.temperature = g->temperature;
        c.top_k = g->top_k;
        c.top_p = g->top_p;
        c.min_p = g->min_p;
        c.repetition_penalty = g->repetition_penalty;
    }
    return c;
}

static void fail(lmx_stream *s, lmx_status code, const char *msg)
{
    s->reason = LMX_STOP_ERROR;
    lmx_fail(&s->err, code, "%s", msg);
}

static lmx_status check_config(const lmx_gen_config *c, lmx_error *err)
{
    if (c->max_tokens < 0)
        return lmx_fail(err, LMX_ERR_ARG, "max_tokens = %d is negative", c->max_tokens);
    if (c->n_stop_tokens < 0 || (c->n_stop_tokens > 0 && !c->stop_tokens))
        return lmx_fail(err, LMX_ERR_ARG, "stop_tokens: NULL or a negative count");
    if (c->n_stop_strings < 0 || (c->n_stop_strings > 0 && !c->stop_strings))
        return lmx_fail(err, LMX_ERR_ARG, "stop_strings: NULL or a negative count");
    for (int i = 0; i < c->n_stop_strings; i++)
        if (!c->stop_strings[i] || !c->stop_strings[i][0])
            return lmx_fail(err, LMX_ERR_ARG, "stop_strings[%d] is NULL or empty", i);
    if (c->n_ctx < 0)
        return lmx_fail(err, LMX_ERR_ARG, "n_ctx = %d is negative", c->n_ctx);
    if (!(c->timeout_s >= 0) || isinf(c->timeout_s))
        return lmx_fail(err, LMX_ERR_ARG, "timeout_s must be a finite number >= 0");
    return LMX_OK;
}

static int is_in(const int32_t *set, int n, int32_t id)
{
    for (int i = 0; i < n; i++)
        if (set[i] == id)
            return 1;
    return 0;
}

static lmx_status push_token(lmx_stream *s, int32_t id)
{
    if (s->n_tokens == s->cap_tokens) {
        int cap = s->cap_tokens ? s->cap_tokens * 2 : 64;
        int32_t *t = realloc(s->tokens, (size_t)cap * sizeof *t);
        if (!t)
            return lmx_fail(&s->err, LMX_ERR_NOMEM, "out of memory");
        s->tokens = t;
        s->cap_tokens = cap;
    }
    s->tokens[s->n_tokens++] = id;
    return LMX_OK;
}

/* Sets up everything the stream needs before its first token. */
static lmx_status prepare(lmx_stream *s)
{
    lmx_model *m = s->m;
    lmx_error *err = &s->err;
    lmx_status st;
    if ((st = check_config(&s->cfg, err)))
        return st;
    if (!m->tok)
        return lmx_fail(err, LMX_ERR_ARG, "the model directory has no tokenizer.json: text needs one");
    if (s->n_prompt <= 0)
        return lmx_fail(err, LMX_ERR_ARG, "the prompt is empty (0 tokens)");
    for (int i = 0; i < s->n_prompt; i++)
        if (s->tokens[i] < 0 || s->tokens[i] >= m->cfg.vocab_size)
            return lmx_fail(err, LMX_ERR_RANGE, "prompt token %d at index %d is outside [0, %d)",
                            (int)s->tokens[i], i, m->cfg.vocab_size);
    lmx_sampler_params sp = {s->cfg.temperature, s->cfg.top_k, s->cfg.top_p, s->cfg.min_p,
                             s->cfg.repetition_penalty, s->cfg.seed};
    if ((st = lmx_sampler_new(&sp, m->cfg.vocab_size, &s->sampler, err)))
        return st;
    s->greedy = s->cfg.temperature == 0 && s->cfg.repetition_penalty == 1;
    s->top_per = s->greedy ? 0 : lmx_sampler_top_request(s->sampler);
    if (s->how.ctx) {
        s->ctx = s->how.ctx;
    } else {
        int n_ctx = s->cfg.n_ctx ? s->cfg.n_ctx : m->opts.n_ctx;
        if (s->cfg.max_tokens > 0 && (long)s->n_prompt + s->cfg.max_tokens < n_ctx)
            n_ctx = s->n_prompt + s->cfg.max_tokens; /* no cache beyond what the stream can use */
        if (s->n_prompt > n_ctx)
            return lmx_fail(err, LMX_ERR_RANGE, "the prompt of %d tokens does not fit the context of %d",
                            s->n_prompt, n_ctx);
        if (!(s->ctx = lmx_context_new(m, n_ctx, err)))
            return err->code;
        s->owns_ctx = 1;
    }
    if (lmx_sampler_draws_dense(s->sampler) && lmx_context_can_draw(s->ctx)) { /* never greedy: T > 0 */
        s->draws = 1;
        s->top_per = 0; /* min-p alone: no best scores needed either */
    }
    if (s->n_prompt > lmx_context_capacity(s->ctx))
        return lmx_fail(err, LMX_ERR_RANGE, "the prompt of %d tokens does not fit the context of %d",
                        s->n_prompt, lmx_context_capacity(s->ctx));
    if (!(s->logits = malloc((size_t)m->cfg.vocab_size * sizeof(float))) ||
        (s->top_per && !(s->top = malloc(lmx_context_top_capacity(s->ctx, s->top_per) * sizeof *s->top))) ||
        !(s->detok = lmx_detok_new(m->tok, 0)))
        return lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
    memcpy(s->eos, m->cfg.eos_ids, sizeof m->cfg.eos_ids);
    s->n_eos = m->cfg.n_eos;
    int32_t tok_eos = lmx_tokenizer_eos_id(m->tok);
    if (tok_eos >= 0 && !is_in(s->eos, s->n_eos, tok_eos))
        s->eos[s->n_eos++] = tok_eos;
    lmx_stopstr_init(&s->stop, s->cfg.stop_strings, s->cfg.n_stop_strings);
    return LMX_OK;
}

lmx_stream *lmx_stream_start(lmx_model *m, int32_t *ids, int n, const lmx_gen_config *cfg,
                             const lmx_stream_ctx *how, const lmx_error *err)
{
    lmx_stream *s = calloc(1, sizeof *s);
    if (!s) {
        free(ids);
        return NULL;
    }
    s->t_start = now_s();
    s->m = m;
    s->tokens = ids;
    s->n_tokens = s->cap_tokens = s->n_prompt = ids ? n : 0;
    if (how)
        s->how = *how;
    if (err && err->code != LMX_OK) {
        s->reason = LMX_STOP_ERROR;
        s->err = *err;
    } else if (!m) {
        fail(s, LMX_ERR_ARG, "model is NULL");
    } else {
        s->cfg = cfg ? *cfg : lmx_gen_defaults(m);
        if (prepare(s))
            s->reason = LMX_STOP_ERROR;
    }
    return s;
}

static int cancelled(lmx_stream *s)
{
    if (atomic_load(&s->cancel))
        return 1;
    return s->cfg.timeout_s > 0 && now_s() - s->t_start > s->cfg.timeout_s;
}

/* Evaluates n tokens: the next token's scores into s->logits, or what
 * choosing it needs: when greedy, or drawn where the logits are, only its
 * id into s->next; with top-k (or min-p alone, or greedy with a penalty)
 * its best scores into s->top (little comes back from a GPU), unless
 * those are waiting out a failure. */
static lmx_status eval_tokens(lmx_stream *s, const int32_t *ids, int n)
{
    if (s->greedy)
        return lmx_context_eval_argmax(s->ctx, ids, n, &s->next, &s->err);
    if (s->draws) { /* the draw's random number is taken now, as choose() would */
        lmx_draw d = lmx_sampler_next_draw(s->sampler);
        return lmx_context_eval_draw(s->ctx, ids, n, &d, &s->next, &s->err);
    }
    if (s->top_per && !s->top_wait)
        return lmx_context_eval_top(s->ctx, ids, n, s->top_per, s->top, &s->top_groups, &s->err);
    return lmx_context_eval(s->ctx, ids, n, s->logits, 0, &s->err);
}

/* The next token from what eval_tokens left; -1 on an error. Best scores
 * that cannot decide (min-p on a flat row, a tie at the top-k boundary)
 * cost the logits' read besides; where that keeps happening, as with a
 * model of random weights, the steps after take the logits directly, for
 * waits that double up to TOP_BACKOFF_MAX steps (session 39, bench/RESULTS.md). */
enum { TOP_BACKOFF_MAX = 63 };
static int32_t choose(lmx_stream *s)
{
    if (s->greedy || s->draws)
        return s->next;
    if (s->top_per && !s->top_wait) {
        int32_t id = lmx_sampler_sample_top(s->sampler, s->top, s->top_groups, s->top_per, s->tokens,
                                            (size_t)s->n_tokens);
        if (id >= 0) {
            s->top_backoff = 0;
            return id;
        }
        s->top_wait = s->top_backoff;
        s->top_backoff = 2 * s->top_backoff + 1 < TOP_BACKOFF_MAX ? 2 * s->top_backoff + 1 : TOP_BACKOFF_MAX;
        if (lmx_context_last_logits(s->ctx, s->logits, &s->err)) /* undecided: the whole logits */
            return -1;
    } else if (s->top_per) {
        s->top_wait--;
    }
    return lmx_sampler_sample(s->sampler, s->logits, s->tokens, (size_t)s->n_tokens);
}

/* Evaluates the prompt after what the context already holds. */
static int prefill(lmx_stream *s)
{
    int keep = 0;
    while (keep < s->how.n_cached && keep < s->n_prompt - 1 && s->how.cached[keep] == s->tokens[keep])
        keep++;
    if (lmx_context_truncate(s->ctx, keep, NULL) != LMX_OK) {
        keep = 0; /* a sliding-window cache cannot rewind that far */
        lmx_context_truncate(s->ctx, 0, NULL);
    }
    s->n_cached = keep;
    s->t_prefill0 = now_s();
    /* one forward step a call, so cancellation is seen between them: whole
     * steps of the context's chunk (the backend's: 256 rows on the CPU, 4096
     * on a GPU), not shorter ones that read the weights more often */
    int step = lmx_context_chunk_rows(s->ctx);
    for (int i = keep; i < s->n_prompt; i += step) {
        if (cancelled(s)) {
            s->reason = LMX_STOP_CANCELLED;
            return 0;
        }
        int k = s->n_prompt - i < step ? s->n_prompt - i : step;
        /* only the last step's next token is wanted: the others skip the output head */
        lmx_status st = i + k < s->n_prompt ? lmx_context_eval(s->ctx, s->tokens + i, k, NULL, 0, &s->err)
                                            : eval_tokens(s, s->tokens + i, k);
        if (st) {
            s->reason = LMX_STOP_ERROR;
            return 0;
        }
    }
    s->t_prefill1 = now_s();
    return 1;
}

/* Samples and checks one token; returns 1 with a token to emit, 0 at the end. */
static int step(lmx_stream *s, lmx_token *t)
{
    if (s->last_pending) { /* feed back the token emitted last time */
        s->last_pending = 0;
        if (s->cfg.max_tokens > 0 && s->generated >= s->cfg.max_tokens) {
            s->reason = LMX_STOP_MAX_TOKENS;
            return 0;
        }
        if (lmx_context_length(s->ctx) >= lmx_context_capacity(s->ctx)) {
            s->reason = LMX_STOP_CONTEXT_FULL;
            return 0;
        }
        if (cancelled(s)) {
            s->reason = LMX_STOP_CANCELLED;
            return 0;
        }
        if (eval_tokens(s, &s->tokens[s->n_tokens - 1], 1)) {
            s->reason = LMX_STOP_ERROR;
            return 0;
        }
    }
    int32_t id = choose(s);
    if (id < 0) {
        s->reason = LMX_STOP_ERROR;
        return 0;
    }
    if (!s->cfg.ignore_eos && is_in(s->eos, s->n_eos, id)) {
        s->reason = LMX_STOP_EOS;
        return 0;
    }
    if (is_in(s->cfg.stop_tokens, s->cfg.n_stop_tokens, id)) {
        s->reason = LMX_STOP_TOKEN;
        return 0;
    }
    if (push_token(s, id)) {
        s->reason = LMX_STOP_ERROR;
        return 0;
    }
    s->generated++;
    s->last_pending = 1;
    const char *piece = "";
    size_t len = 0;
    /* Embedding rows past the tokenizer's vocabulary (padding) have no text;
     * like the tokenizers library's decode, they add none. */
    if (id < lmx_tokenizer_vocab_size(s->m->tok) && lmx_detok_push(s->detok, id, &piece, &len, &s->err)) {
        s->reason = LMX_STOP_ERROR;
        return 0;
    }
    int hit = lmx_stopstr_push(&s->stop, piece, len, &t->text, &t->len);
    if (hit < 0) {
        fail(s, LMX_ERR_NOMEM, "out of memory");
        return 0;
    }
    t->id = id;
    if (hit) {
        s->reason = LMX_STOP_STRING;
        s->last_pending = 0;
    }
    return 1;
}

static int append_tail(lmx_stream *s, const char *text, size_t len)
{
    if (s->tail_len + len + 1 > s->tail_cap) {
        size_t cap = (s->tail_len + len + 1) * 2;
        char *b = realloc(s->tail, cap);
        if (!b)
            return -1;
        s->tail = b;
        s->tail_cap = cap;
    }
    memcpy(s->tail + s->tail_len, text, len);
    s->tail_len += len;
    s->tail[s->tail_len] = 0;
    return 0;
}

/* After the last token: text still held back (an incomplete character at the
 * very end, a partial stop string) goes out as a token with id -1. */
static int emit_tail(lmx_stream *s, lmx_token *t)
{
    if (s->tail_sent || s->reason == LMX_STOP_ERROR || s->reason == LMX_STOP_STRING || !s->detok)
        return 0;
    s->tail_sent = 1;
    const char *piece, *e;
    size_t len, el;
    if (lmx_detok_flush(s->detok, &piece, &len) == LMX_OK) {
        int hit = lmx_stopstr_push(&s->stop, piece, len, &e, &el);
        if (hit < 0 || append_tail(s, e, el))
            return 0;
        if (hit == 1)
            s->reason = LMX_STOP_STRING;
    }
    if (s->reason != LMX_STOP_STRING) {
        lmx_stopstr_flush(&s->stop, &e, &el);
        if (append_tail(s, e, el))
            return 0;
    }
    if (s->tail_len == 0)
        return 0;
    *t = (lmx_token){-1, s->tail, s->tail_len};
    return 1;
}

int lmx_stream_next(lmx_stream *s, lmx_token *t)
{
    if (!s || !t)
        return 0;
    if (s->reason != LMX_STOP_NONE)
        return emit_tail(s, t);
    if (!s->started) {
        s->started = 1;
        if (!prefill(s))
            return 0;
    }
    if (!step(s, t))
        return emit_tail(s, t);
    double now = now_s();
    if (s->generated == 1)
        s->t_first = now;
    s->t_last = now;
    return 1;
}

lmx_stop_reason lmx_stream_run(lmx_stream *s, int (*on_token)(void *user, const lmx_token *t), void *user)
{
    lmx_token t;
    while (lmx_stream_next(s, &t))
        if (on_token && on_token(user, &t)) {
            lmx_stream_cancel(s);
            if (s->reason == LMX_STOP_NONE)
                s->reason = LMX_STOP_CANCELLED;
            break;
        }
    return lmx_stream_stop_reason(s);
}

void lmx_stream_cancel(lmx_stream *s)
{
    if (s)
        atomic_store(&s->cancel, 1);
}

lmx_stop_reason lmx_stream_stop_reason(const lmx_stream *s) { return s ? s->reason : LMX_STOP_ERROR; }

const char *lmx_stream_error(const lmx_stream *s)
{
    if (!s)
        return "stream is NULL";
    return s->reason == LMX_STOP_ERROR ? s->err.message : NULL;
}

lmx_status lmx_stream_status(const lmx_stream *s)
{
    if (!s)
        return LMX_ERR_ARG;
    if (s->reason == LMX_STOP_ERROR)
        return s->err.code ? s->err.code : LMX_ERR_INTERNAL;
    return s->reason == LMX_STOP_CANCELLED ? LMX_ERR_CANCELLED : LMX_OK;
}

void lmx_stream_stats(const lmx_stream *s, lmx_stats *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    if (!s)
        return;
    o->prompt_tokens = s->n_prompt;
    o->cached_tokens = s->n_cached;
    o->generated_tokens = s->generated;
    if (s->generated > 0)
        o->ttft_s = s->t_first - s->t_start;
    double pf = s->t_prefill1 - s->t_prefill0;
    if (s->t_prefill1 > 0 && pf > 0)
        o->prefill_tok_s = (s->n_prompt - s->n_cached) / pf;
    if (s->generated > 1 && s->t_last > s->t_first)
        o->decode_tok_s = (s->generated - 1) / (s->t_last - s->t_first);
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        o->peak_rss_mb = ru.ru_maxrss / 1024.0;
}

void lmx_stream_close(lmx_stream *s)
{
    if (!s)
        return;
    if (s->how.on_close) {
        int held = s->ctx ? lmx_context_length(s->ctx) : 0;
        s->how.on_close(s->how.owner, s->tokens, held <= s->n_tokens ? held : 0);
    }
    if (s->owns_ctx)
        lmx_context_free(s->ctx);
    lmx_sampler_free(s->sampler);
    lmx_detok_free(s->detok);
    lmx_stopstr_free(&s->stop);
    free(s->tail);
    free(s->logits);
    free(s->top);
    free(s->tokens);
    free(s);
}

/* Entry points ------------------------------------------------------------ */

lmx_stream *lmx_generate_ids(lmx_model *m, const int32_t *ids, int n, const lmx_gen_config *cfg)
{
    lmx_error err = {0};
    int32_t *copy = NULL;
    if (!ids || n <= 0)
        lmx_fail(&err, LMX_ERR_ARG, "lmx_generate_ids: no prompt ids (n = %d)", n);
    else if (!(copy = malloc((size_t)n * sizeof *copy)))
        lmx_fail(&err, LMX_ERR_NOMEM, "out of memory");
    else
        memcpy(copy, ids, (size_t)n * sizeof *copy);
    return lmx_stream_start(m, copy, copy ? n : 0, cfg, NULL, &err);
}

lmx_stream *lmx_generate(lmx_model *m, const char *prompt, const lmx_gen_config *cfg)
{
    lmx_error err = {0};
    int32_t *ids = NULL;
    int n = 0;
    lmx_gen_config c = cfg ? *cfg : lmx_gen_defaults(m);
    lmx_prompt_text(m, prompt, c.add_special, &ids, &n, &err);
    return lmx_stream_start(m, ids, n, &c, NULL, &err);
}

lmx_stream *lmx_chat(lmx_model *m, const lmx_message *msgs, int n, const lmx_gen_config *cfg)
{
    lmx_error err = {0};
    int32_t *ids = NULL;
    int n_ids = 0;
    lmx_gen_config c = cfg ? *cfg : lmx_gen_defaults(m);
    lmx_prompt_chat(m, msgs, n, 1, c.enable_thinking, &ids, &n_ids, &err);
    return lmx_stream_start(m, ids, n_ids, &c, NULL, &err);
}
