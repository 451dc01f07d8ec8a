/* The tokenizer (see tokenizer.h): loading tokenizer.json and its config,
 * and the encode pipeline of tokenizers: added tokens on the raw text ->
 * normalizer -> added tokens on the normalized text -> pre-tokenizer -> BPE
 * -> post-processor. */
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fileutil.h"
#include "tok_added.h"
#include "tok_bpe.h"
#include "tok_decode.h"
#include "tok_json.h"
#include "tok_normalize.h"
#include "tok_post.h"
#include "tok_pretok.h"

struct lmx_tokenizer {
    lmx_tokbpe *bpe;
    lmx_tokadded *added;
    lmx_toknorm *norm;
    lmx_tokpre *pre;
    lmx_tokpost *post;
    lmx_tokdec *dec;
    int32_t id_limit;
    unsigned char *special; /* per id: skipped by skip_special */
    int byte_fallback;      /* the decoder joins <0xXX> runs */
    int32_t bos, eos;
    char *chat_template;
};

static const char *id_text(const lmx_tokenizer *t, int32_t id, size_t *len);

/* The top-level members handed to cJSON (all small next to the model). */
enum { F_ADDED, F_NORM, F_PRE, F_POST, F_DEC, F_COUNT };
static const char *const FIELD_NAMES[F_COUNT] = {"added_tokens", "normalizer", "pre_tokenizer",
                                                 "post_processor", "decoder"};

void lmx_tokenizer_free(lmx_tokenizer *t)
{
    if (!t)
        return;
    lmx_tokbpe_free(t->bpe);
    lmx_tokadded_free(t->added);
    lmx_toknorm_free(t->norm);
    lmx_tokpre_free(t->pre);
    lmx_tokpost_free(t->post);
    lmx_tokdec_free(t->dec);
    free(t->special);
    free(t->chat_template);
    free(t);
}

/* ---- loading ---------------------------------------------------------------------- */

/* Walks the top-level object: the model is read in place, the other
 * components' text spans are kept for cJSON. */
static lmx_status scan_top(lmx_tokenizer *t, const char *json, size_t len, const char *what,
                           const char *span[F_COUNT], size_t span_len[F_COUNT], lmx_error *err)
{
    lmx_tokjson j = {json, json + len};
    lmx_tokbuf key = {0};
    int first = 1, r;
    lmx_status st = LMX_OK;
    if (lmx_tokjson_expect(&j, '{'))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: not a JSON object", what);
    while (st == LMX_OK && (r = lmx_tokjson_next(&j, &first, &key)) == 1) {
        int f = 0;
        while (f < F_COUNT && strcmp(key.p, FIELD_NAMES[f]))
            f++;
        if (!strcmp(key.p, "model") && !t->bpe)
            st = lmx_tokbpe_load(&j, what, &t->bpe, err);
        else if (lmx_tokjson_skip(&j, f < F_COUNT ? &span[f] : NULL, f < F_COUNT ? &span_len[f] : NULL))
            st = lmx_fail(err, LMX_ERR_FORMAT, "%s: malformed JSON in \"%.40s\"", what, key.p);
    }
    lmx_tokbuf_free(&key);
    if (st == LMX_OK && (r < 0 || lmx_tokjson_peek(&j)))
        st = lmx_fail(err, LMX_ERR_FORMAT, "%s: malformed JSON", what);
    if (st == LMX_OK && !t->bpe)
        st = lmx_fail(err, LMX_ERR_FORMAT, "%s: no \"model\"", what);
    return st;
}

static lmx_status parse_spans(const char *span[F_COUNT], const size_t span_len[F_COUNT],
                              cJSON *node[F_COUNT], const char *what, lmx_error *err)
{
    for (int f = 0; f < F_COUNT; f++) {
        if (!span[f])
            continue;
        node[f] = cJSON_ParseWithLength(span[f], span_len[f]);
        if (!node[f])
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: \"%s\" is not valid JSON", what,
                            FIELD_NAMES[f]);
    }
    return LMX_OK;
}

static lmx_status build_parts(lmx_tokenizer *t, cJSON *node[F_COUNT], const char *what,
                              lmx_error *err)
{
    lmx_status st = lmx_toknorm_build(node[F_NORM], what, &t->norm, err);
    if (st == LMX_OK)
        st = lmx_tokadded_build(node[F_ADDED], t->norm, lmx_tokbpe_id_limit(t->bpe), what,
                                &t->added, err);
    if (st == LMX_OK)
        st = lmx_tokpre_build(node[F_PRE], what, &t->pre, err);
    if (st == LMX_OK)
        st = lmx_tokpost_build(node[F_POST], what, &t->post, err);
    if (st == LMX_OK)
        st = lmx_tokdec_build(node[F_DEC], what, &t->dec, err);
    return st;
}

/* tokenizers skips a token when its text is a special token's text, so
 * every id spelled like a special token counts as special. */
static void mark_special(void *ctx, const char *s, size_t n)
{
    lmx_tokenizer *t = ctx;
    int32_t id = lmx_tokbpe_lookup(t->bpe, s, n);
    if (id >= 0)
        t->special[id] = 1;
    id = lmx_tokadded_find(t->added, s, n);
    if (id >= 0)
        t->special[id] = 1;
}

static lmx_status finish(lmx_tokenizer *t, const char *what, lmx_error *err)
{
    int32_t a = lmx_tokadded_id_limit(t->added), b = lmx_tokbpe_id_limit(t->bpe);
    t->id_limit = a > b ? a : b;
    t->special = calloc((size_t)t->id_limit + 1, 1);
    if (!t->special)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    lmx_tokadded_each_special(t->added, mark_special, t);
    t->byte_fallback = lmx_tokdec_has_byte_fallback(t->dec);
    t->bos = t->eos = -1;
    size_t n;
    int32_t post = lmx_tokpost_max_id(t->post);
    if (post >= 0 && !id_text(t, post, &n))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: post_processor adds id %d, which is no token",
                        what, post);
    return LMX_OK;
}

lmx_status lmx_tokenizer_load_json(const char *json, size_t len, const char *what,
                                   lmx_tokenizer **out, lmx_error *err)
{
    *out = NULL;
    if (!json || !what)
        return lmx_fail(err, LMX_ERR_ARG, "tokenizer: NULL argument");
    lmx_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    const char *span[F_COUNT] = {0};
    size_t span_len[F_COUNT] = {0};
    cJSON *node[F_COUNT] = {0};
    lmx_status st = scan_top(t, json, len, what, span, span_len, err);
    if (st == LMX_OK)
        st = parse_spans(span, span_len, node, what, err);
    if (st == LMX_OK)
        st = build_parts(t, node, what, err);
    if (st == LMX_OK)
        st = finish(t, what, err);
    for (int f = 0; f < F_COUNT; f++)
        cJSON_Delete(node[f]);
    if (st != LMX_OK) {
        lmx_tokenizer_free(t);
        return st;
    }
    *out = t;
    return LMX_OK;
}

/* bos_token / eos_token: a string, or an AddedToken object with "content". */
static int32_t config_token(const lmx_tokenizer *t, const cJSON *v)
{
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? lmx_tokenizer_token_id(t, v->valuestring) : -1;
}

/* chat_template: a string, or a list of {name, template} (the "default" one). */
static char *config_template(const cJSON *v)
{
    if (cJSON_IsString(v))
        return strdup(v->valuestring);
    const cJSON *it;
    if (!cJSON_IsArray(v))
        return NULL;
    cJSON_ArrayForEach(it, v) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
        const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(it, "template");
        if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") && cJSON_IsString(tpl))
            return strdup(tpl->valuestring);
    }
    return NULL;
}

/* Reads only the three members needed; the rest (a large added_tokens_decoder
 * in Gemma's) is skipped without building a tree. */
static lmx_status load_config(lmx_tokenizer *t, const char *text, size_t len, const char *path,
                              lmx_error *err)
{
    lmx_tokjson j = {text, text + len};
    lmx_tokbuf key = {0};
    int first = 1, r;
    lmx_status st = LMX_OK;
    if (lmx_tokjson_expect(&j, '{'))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: not a JSON object", path);
    while (st == LMX_OK && (r = lmx_tokjson_next(&j, &first, &key)) == 1) {
        const char *s;
        size_t n;
        if (lmx_tokjson_skip(&j, &s, &n)) {
            st = lmx_fail(err, LMX_ERR_FORMAT, "%s: malformed JSON", path);
            break;
        }
        int which = !strcmp(key.p, "bos_token") ? 1 : !strcmp(key.p, "eos_token") ? 2
                    : !strcmp(key.p, "chat_template") ? 3 : 0;
        if (!which)
            continue;
        cJSON *v = cJSON_ParseWithLength(s, n);
        if (!v)
            st = lmx_fail(err, LMX_ERR_FORMAT, "%s: bad \"%s\"", path, key.p);
        else if (which == 1)
            t->bos = config_token(t, v);
        else if (which == 2)
            t->eos = config_token(t, v);
        else
            t->chat_template = config_template(v);
        cJSON_Delete(v);
    }
    lmx_tokbuf_free(&key);
    if (st == LMX_OK && r < 0)
        st = lmx_fail(err, LMX_ERR_FORMAT, "%s: malformed JSON", path);
    return st;
}

lmx_status lmx_tokenizer_load(const char *dir, lmx_tokenizer **out, lmx_error *err)
{
    *out = NULL;
    if (!dir)
        return lmx_fail(err, LMX_ERR_ARG, "tokenizer: NULL directory");
    char *path = lmx_path_join(dir, "tokenizer.json");
    char *cpath = lmx_path_join(dir, "tokenizer_config.json");
    char *text = NULL;
    size_t len = 0;
    lmx_status st = path && cpath ? lmx_read_file(path, &text, &len, err)
                                  : lmx_fail(err, LMX_ERR_NOMEM, "tokenizer: out of memory");
    if (st == LMX_OK)
        st = lmx_tokenizer_load_json(text, len, path, out, err);
    free(text);
    text = NULL;
    if (st == LMX_OK && lmx_file_exists(cpath)) {
        st = lmx_read_file(cpath, &text, &len, err);
        if (st == LMX_OK)
            st = load_config(*out, text, len, cpath, err);
        free(text);
    }
    if (st != LMX_OK) {
        lmx_tokenizer_free(*out);
        *out = NULL;
    }
    free(path);
    free(cpath);
    return st;
}

/* ---- queries -------------------------------------------------------------------------- */

int32_t lmx_tokenizer_token_id(const lmx_tokenizer *t, const char *token)
{
    if (!t || !token)
        return -1;
    size_t n = strlen(token);
    int32_t id = lmx_tokadded_find(t->added, token, n);
    return id >= 0 ? id : lmx_tokbpe_lookup(t->bpe, token, n);
}

int lmx_tokenizer_is_special(const lmx_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->id_limit && t->special[id];
}

int lmx_tokenizer_vocab_size(const lmx_tokenizer *t)
{
    return t ? t->id_limit : 0;
}

int32_t lmx_tokenizer_bos_id(const lmx_tokenizer *t)
{
    return t ? t->bos : -1;
}

int32_t lmx_tokenizer_eos_id(const lmx_tokenizer *t)
{
    return t ? t->eos : -1;
}

const char *lmx_tokenizer_chat_template(const lmx_tokenizer *t)
{
    return t ? t->chat_template : NULL;
}

/* The text of id: an added token's first, then the model's. */
static const char *id_text(const lmx_tokenizer *t, int32_t id, size_t *len)
{
    const char *s = lmx_tokadded_token(t->added, id, len);
    return s ? s : lmx_tokbpe_token(t->bpe, id, len);
}

int lmx_tokenizer_is_byte_piece(const lmx_tokenizer *t, int32_t id)
{
    size_t n;
    unsigned char b;
    const char *s = t->byte_fallback ? id_text(t, id, &n) : NULL;
    return s && lmx_tokdec_is_byte_token(s, n, &b);
}

/* ---- encoding ---------------------------------------------------------------------------- */

/* The work space of one encode call. */
typedef struct encoder {
    const lmx_tokenizer *t;
    int plain;
    lmx_tokbuf norm;
    lmx_toksegs segs, segs2; /* raw-text and normalized-text splits */
    lmx_tokpieces pieces;
    lmx_tokbpe_scratch bpe;
    lmx_tokids ids;
} encoder;

static void encoder_free(encoder *e)
{
    lmx_tokbuf_free(&e->norm);
    lmx_toksegs_free(&e->segs);
    lmx_toksegs_free(&e->segs2);
    lmx_tokpieces_free(&e->pieces);
    lmx_tokbpe_scratch_free(&e->bpe);
    free(e->ids.p);
}

/* Plain text after all added tokens are out: pre-tokenize, then BPE each word. */
static lmx_status encode_words(encoder *e, const char *s, size_t len, int origin, lmx_error *err)
{
    lmx_status st = lmx_tokpre_run(e->t->pre, s, len, origin, &e->pieces, err);
    for (size_t i = 0; st == LMX_OK && i < e->pieces.n; i++)
        st = lmx_tokbpe_encode(e->t->bpe, e->pieces.arena.p + e->pieces.p[i].off,
                               e->pieces.p[i].len, &e->bpe, &e->ids, err);
    return st;
}

static lmx_status push_id(encoder *e, int32_t id, lmx_error *err)
{
    return lmx_tokids_push(&e->ids, id) ? lmx_fail(err, LMX_ERR_NOMEM, "encode: out of memory")
                                        : LMX_OK;
}

/* A piece of raw text between non-normalized added tokens. */
static lmx_status encode_raw_piece(encoder *e, const char *s, size_t len, int origin,
                                   lmx_error *err)
{
    lmx_status st = lmx_toknorm_run(e->t->norm, s, len, &e->norm, err);
    if (st == LMX_OK)
        st = lmx_tokadded_split(e->t->added, 1, e->plain, e->norm.p, e->norm.n, &e->segs2, err);
    for (size_t i = 0; st == LMX_OK && i < e->segs2.n; i++) {
        const lmx_tokseg *g = &e->segs2.p[i];
        st = g->id >= 0 ? push_id(e, g->id, err)
                        : encode_words(e, e->norm.p + g->start, g->end - g->start,
                                       origin && g->start == 0, err);
    }
    return st;
}

static lmx_status encode_valid(encoder *e, const char *s, size_t len, lmx_error *err)
{
    lmx_status st = lmx_tokadded_split(e->t->added, 0, e->plain, s, len, &e->segs, err);
    for (size_t i = 0; st == LMX_OK && i < e->segs.n; i++) {
        const lmx_tokseg *g = &e->segs.p[i];
        st = g->id >= 0 ? push_id(e, g->id, err)
                        : encode_raw_piece(e, s + g->start, g->end - g->start, g->start == 0, err);
    }
    return st;
}

lmx_status lmx_tokenizer_encode(const lmx_tokenizer *t, const char *text, size_t len, int flags,
                                int32_t **ids, size_t *n, lmx_error *err)
{
    if (!t || (!text && len) || !ids || !n)
        return lmx_fail(err, LMX_ERR_ARG, "encode: NULL argument");
    *ids = NULL;
    *n = 0;
    encoder e = {.t = t, .plain = (flags & LMX_TOK_PLAIN_SPECIAL) != 0};
    lmx_tokbuf fixed = {0};
    lmx_status st = LMX_OK;
    if (len && !lmx_tokutf8_valid(text, len)) {
        if (lmx_tokutf8_lossy(&fixed, text, len))
            st = lmx_fail(err, LMX_ERR_NOMEM, "encode: out of memory");
        text = fixed.p;
        len = fixed.n;
    }
    if (st == LMX_OK && len)
        st = encode_valid(&e, text, len, err);
    if (st == LMX_OK && (flags & LMX_TOK_ADD_SPECIAL))
        st = lmx_tokpost_apply(t->post, &e.ids, err);
    lmx_tokbuf_free(&fixed);
    if (st == LMX_OK) {
        *ids = e.ids.p ? e.ids.p : malloc(sizeof(int32_t));
        *n = e.ids.n;
        e.ids.p = NULL;
        if (!*ids)
            st = lmx_fail(err, LMX_ERR_NOMEM, "encode: out of memory");
    }
    encoder_free(&e);
    return st;
}

/* ---- decoding ------------------------------------------------------------------------------- */

static lmx_status decode_into(const lmx_tokenizer *t, const int32_t *ids, size_t n, int skip,
                              lmx_tokbuf *out, lmx_error *err)
{
    lmx_tokstrs toks = {0};
    lmx_status st = LMX_OK;
    for (size_t i = 0; st == LMX_OK && i < n; i++) {
        size_t len;
        const char *s = ids[i] >= 0 ? id_text(t, ids[i], &len) : NULL;
        if (!s)
            st = lmx_fail(err, LMX_ERR_RANGE, "decode: id %d is not in the vocabulary", ids[i]);
        else if ((!skip || !t->special[ids[i]]) && lmx_tokstrs_add(&toks, s, len))
            st = lmx_fail(err, LMX_ERR_NOMEM, "decode: out of memory");
    }
    if (st == LMX_OK)
        st = lmx_tokdec_run(t->dec, &toks, out, err);
    lmx_tokstrs_free(&toks);
    return st;
}

lmx_status lmx_tokenizer_decode_buf(const lmx_tokenizer *t, const int32_t *ids, size_t n,
                                    lmx_tokbuf *out, lmx_error *err)
{
    return decode_into(t, ids, n, 0, out, err);
}

lmx_status lmx_tokenizer_decode(const lmx_tokenizer *t, const int32_t *ids, size_t n,
                                int skip_special, char **text, size_t *len, lmx_error *err)
{
    if (!t || (!ids && n) || !text)
        return lmx_fail(err, LMX_ERR_ARG, "decode: NULL argument");
    lmx_tokbuf out = {0};
    *text = NULL;
    lmx_status st = decode_into(t, ids, n, skip_special, &out, err);
    if (st != LMX_OK) {
        lmx_tokbuf_free(&out);
        return st;
    }
    *text = out.p;
    if (len)
        *len = out.n;
    return LMX_OK;
}
