#include "prompt.h"

#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "error.h"
#include "model.h"

static lmx_status need_tokenizer(const lmx_model *m, lmx_error *err)
{
    if (!m)
        return lmx_fail(err, LMX_ERR_ARG, "model is NULL");
    if (!m->tok)
        return lmx_fail(err, LMX_ERR_ARG, "the model directory has no tokenizer.json: text needs one");
    return LMX_OK;
}

lmx_status lmx_prompt_text(const lmx_model *m, const char *text, int add_special, int32_t **ids,
                           int *n, lmx_error *err)
{
    lmx_status st = need_tokenizer(m, err);
    if (st)
        return st;
    if (!text)
        return lmx_fail(err, LMX_ERR_ARG, "prompt is NULL");
    size_t count = 0;
    st = lmx_tokenizer_encode(m->tok, text, strlen(text), add_special ? LMX_TOK_ADD_SPECIAL : 0, ids,
                              &count, err);
    if (st == LMX_OK && count > INT32_MAX) {
        free(*ids);
        *ids = NULL;
        return lmx_fail(err, LMX_ERR_RANGE, "prompt of %zu tokens is too long", count);
    }
    *n = (int)count;
    return st;
}

static lmx_status render(const lmx_model *m, const lmx_message *msgs, int n, int add_generation_prompt,
                         int enable_thinking, lmx_chat_prompt *p, lmx_error *err)
{
    if (!m)
        return lmx_fail(err, LMX_ERR_ARG, "model is NULL");
    if (!msgs || n <= 0)
        return lmx_fail(err, LMX_ERR_ARG, "a chat needs at least one message (got %d)", n);
    int fmt = lmx_chat_format_for(m->cfg.model_type);
    if (fmt < 0)
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "no chat format for model_type '%s'", m->cfg.model_type);
    lmx_chat_options o = {add_generation_prompt, enable_thinking};
    return lmx_chat_render((lmx_chat_format)fmt, msgs, (size_t)n, &o, p, err);
}

/* Appends the encoding of text[0..len) to ids. */
static lmx_status append(const lmx_model *m, const char *text, size_t len, int flags, int32_t **ids,
                         size_t *n, size_t *cap, lmx_error *err)
{
    int32_t *part;
    size_t k;
    lmx_status st = lmx_tokenizer_encode(m->tok, text, len, flags, &part, &k, err);
    if (st)
        return st;
    if (*n + k > *cap) {
        size_t c = (*n + k) * 2;
        int32_t *g = realloc(*ids, c * sizeof *g);
        if (!g) {
            free(part);
            return lmx_fail(err, LMX_ERR_NOMEM, "out of memory");
        }
        *ids = g;
        *cap = c;
    }
    memcpy(*ids + *n, part, k * sizeof *part);
    *n += k;
    free(part);
    return LMX_OK;
}

/* Whether a content segment holds special-token text: its encoding with
 * special tokens matched differs from its plain encoding. */
static int content_has_special(const lmx_model *m, const char *text, size_t len, lmx_error *err)
{
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    int differs = 1; /* on failure take the safe path */
    if (lmx_tokenizer_encode(m->tok, text, len, 0, &a, &na, err) == LMX_OK &&
        lmx_tokenizer_encode(m->tok, text, len, LMX_TOK_PLAIN_SPECIAL, &b, &nb, err) == LMX_OK)
        differs = na != nb || memcmp(a, b, na * sizeof *a) != 0;
    free(a);
    free(b);
    return differs;
}

lmx_status lmx_prompt_chat(const lmx_model *m, const lmx_message *msgs, int n, int add_generation_prompt,
                           int enable_thinking, int32_t **ids, int *n_ids, lmx_error *err)
{
    lmx_status st = need_tokenizer(m, err);
    if (st)
        return st;
    lmx_chat_prompt p;
    if ((st = render(m, msgs, n, add_generation_prompt, enable_thinking, &p, err)))
        return st;
    /* The whole prompt encoded at once is exactly what transformers gives.
     * If some message content holds special-token text, encode segment by
     * segment instead, the content as plain text, so it cannot inject
     * control tokens. */
    int injected = 0;
    for (size_t i = 0; i < p.n_segments && !injected; i++)
        if (p.segments[i].is_content)
            injected = content_has_special(m, p.text + p.segments[i].offset, p.segments[i].length, err);
    size_t count = 0, cap = 0;
    *ids = NULL;
    if (!injected) {
        st = append(m, p.text, p.length, 0, ids, &count, &cap, err);
    } else {
        for (size_t i = 0; i < p.n_segments && st == LMX_OK; i++)
            st = append(m, p.text + p.segments[i].offset, p.segments[i].length,
                        p.segments[i].is_content ? LMX_TOK_PLAIN_SPECIAL : 0, ids, &count, &cap, err);
    }
    lmx_chat_prompt_free(&p);
    if (st == LMX_OK && count > INT32_MAX)
        st = lmx_fail(err, LMX_ERR_RANGE, "chat of %zu tokens is too long", count);
    if (st) {
        free(*ids);
        *ids = NULL;
        return st;
    }
    *n_ids = (int)count;
    return LMX_OK;
}

lmx_status lmx_tokenize(const lmx_model *m, const char *text, int add_special, int32_t **ids, int *n,
                        lmx_error *err)
{
    if (!ids || !n)
        return lmx_fail(err, LMX_ERR_ARG, "lmx_tokenize: ids or n is NULL");
    return lmx_prompt_text(m, text, add_special, ids, n, err);
}

lmx_status lmx_chat_template(const lmx_model *m, const lmx_message *msgs, int n,
                             int add_generation_prompt, int enable_thinking, char **text, lmx_error *err)
{
    if (!text)
        return lmx_fail(err, LMX_ERR_ARG, "lmx_chat_template: text is NULL");
    lmx_chat_prompt p;
    lmx_status st = render(m, msgs, n, add_generation_prompt, enable_thinking, &p, err);
    if (st)
        return st;
    *text = p.text; /* the caller takes the text; the segments go */
    p.text = NULL;
    lmx_chat_prompt_free(&p);
    return LMX_OK;
}
