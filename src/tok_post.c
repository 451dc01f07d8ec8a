/* Post-processors (see tok_post.h). A single-sequence template reduces to
 * ids before the sequence and ids after it. */
#include "tok_post.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

struct lmx_tokpost {
    lmx_tokids pre, post;
};

void lmx_tokpost_free(lmx_tokpost *p)
{
    if (!p)
        return;
    free(p->pre.p);
    free(p->post.p);
    free(p);
}

/* Adds the ids of special token `name` from the template's special_tokens map. */
static lmx_status add_special(lmx_tokids *dst, const cJSON *specials, const char *name,
                              const char *what, lmx_error *err)
{
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(specials, name);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(st, "ids");
    const cJSON *id;
    if (!cJSON_IsArray(ids))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: post_processor: special token \"%.40s\" has no ids",
                        what, name);
    cJSON_ArrayForEach(id, ids) {
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > INT32_MAX)
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: post_processor: bad id for \"%.40s\"", what,
                            name);
        if (lmx_tokids_push(dst, id->valueint))
            return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    }
    return LMX_OK;
}

/* One template piece: {"SpecialToken": {"id": ...}}, {"Sequence": {"id": "A"}},
 * or the string forms "$A" and "[CLS]" (with an optional ":type_id"). */
static lmx_status template_piece(lmx_tokpost *p, const cJSON *piece, const cJSON *specials,
                                 int *seen_seq, const char *what, lmx_error *err)
{
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(piece, "SpecialToken");
    const cJSON *sq = cJSON_GetObjectItemCaseSensitive(piece, "Sequence");
    char name[256];
    if (cJSON_IsString(piece) && piece->valuestring[0] == '$') {
        sq = piece;
    } else if (cJSON_IsString(piece)) {
        snprintf(name, sizeof name, "%s", piece->valuestring);
        char *colon = strrchr(name, ':');
        if (colon)
            *colon = 0;
        return add_special(*seen_seq ? &p->post : &p->pre, specials, name, what, err);
    } else if (sp) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(sp, "id");
        if (!cJSON_IsString(id))
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: post_processor: SpecialToken without id", what);
        return add_special(*seen_seq ? &p->post : &p->pre, specials, id->valuestring, what, err);
    }
    if (!sq || *seen_seq)
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: post_processor: bad single template", what);
    *seen_seq = 1;
    return LMX_OK;
}

static lmx_status build_template(lmx_tokpost *p, const cJSON *j, const char *what, lmx_error *err)
{
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
    const cJSON *piece;
    int seen = 0;
    if (!cJSON_IsArray(single))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: TemplateProcessing lacks \"single\"", what);
    cJSON_ArrayForEach(piece, single) {
        lmx_status st = template_piece(p, piece, specials, &seen, what, err);
        if (st != LMX_OK)
            return st;
    }
    return seen ? LMX_OK : lmx_fail(err, LMX_ERR_FORMAT, "%s: template lacks the sequence", what);
}

/* Bert/Roberta: "cls": [token, id] before, "sep": [token, id] after. */
static lmx_status build_cls_sep(lmx_tokpost *p, const cJSON *j, const char *what, lmx_error *err)
{
    const cJSON *cls = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "cls"), 1);
    const cJSON *sep = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "sep"), 1);
    if (!cJSON_IsNumber(cls) || !cJSON_IsNumber(sep) || cls->valueint < 0 || sep->valueint < 0)
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: post_processor lacks cls/sep", what);
    if (lmx_tokids_push(&p->pre, cls->valueint) || lmx_tokids_push(&p->post, sep->valueint))
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    return LMX_OK;
}

static lmx_status build_into(lmx_tokpost *p, const cJSON *j, const char *what, lmx_error *err)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(type))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: post_processor without \"type\"", what);
    const char *t = type->valuestring;
    if (!strcmp(t, "TemplateProcessing"))
        return build_template(p, j, what, err);
    if (!strcmp(t, "BertProcessing") || !strcmp(t, "RobertaProcessing"))
        return build_cls_sep(p, j, what, err);
    if (!strcmp(t, "ByteLevel"))
        return LMX_OK;
    if (strcmp(t, "Sequence"))
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: post_processor \"%s\" is not supported",
                        what, t);
    /* each processor wraps what the ones before produced */
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "processors"), *it;
    if (!cJSON_IsArray(arr))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: Sequence lacks \"processors\"", what);
    cJSON_ArrayForEach(it, arr) {
        lmx_tokpost inner = {0};
        lmx_status st = build_into(&inner, it, what, err);
        for (size_t i = 0; st == LMX_OK && i < p->pre.n; i++)
            if (lmx_tokids_push(&inner.pre, p->pre.p[i]))
                st = lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
        for (size_t i = 0; st == LMX_OK && i < inner.post.n; i++)
            if (lmx_tokids_push(&p->post, inner.post.p[i]))
                st = lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
        free(p->pre.p);
        p->pre = inner.pre;
        free(inner.post.p);
        if (st != LMX_OK)
            return st;
    }
    return LMX_OK;
}

lmx_status lmx_tokpost_build(const cJSON *j, const char *what, lmx_tokpost **out, lmx_error *err)
{
    *out = NULL;
    if (!j || cJSON_IsNull(j))
        return LMX_OK;
    lmx_tokpost *p = calloc(1, sizeof *p);
    if (!p)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    lmx_status st = build_into(p, j, what, err);
    if (st != LMX_OK) {
        lmx_tokpost_free(p);
        return st;
    }
    *out = p;
    return LMX_OK;
}

lmx_status lmx_tokpost_apply(const lmx_tokpost *p, lmx_tokids *ids, lmx_error *err)
{
    if (!p || (!p->pre.n && !p->post.n))
        return LMX_OK;
    lmx_tokids r = {0};
    int bad = 0;
    for (size_t i = 0; i < p->pre.n; i++)
        bad |= lmx_tokids_push(&r, p->pre.p[i]);
    for (size_t i = 0; i < ids->n; i++)
        bad |= lmx_tokids_push(&r, ids->p[i]);
    for (size_t i = 0; i < p->post.n; i++)
        bad |= lmx_tokids_push(&r, p->post.p[i]);
    if (bad) {
        free(r.p);
        return lmx_fail(err, LMX_ERR_NOMEM, "encode: out of memory");
    }
    free(ids->p);
    *ids = r;
    return LMX_OK;
}

int32_t lmx_tokpost_max_id(const lmx_tokpost *p)
{
    int32_t m = -1;
    for (size_t i = 0; p && i < p->pre.n; i++)
        m = p->pre.p[i] > m ? p->pre.p[i] : m;
    for (size_t i = 0; p && i < p->post.n; i++)
        m = p->post.p[i] > m ? p->post.p[i] : m;
    return m;
}
