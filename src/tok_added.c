/* Added tokens (see tok_added.h). */
#include "tok_added.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tok_bpe.h"

typedef struct added {
    char *content; /* as in the file */
    char *text;    /* what is matched and decoded: content, normalized when normalized */
    size_t len, text_len;
    int32_t id;
    unsigned char special, lstrip, rstrip, single_word, normalized;
} added;

/* A byte trie: edge (node, byte) -> child in an open-addressing table. */
typedef struct trie {
    uint64_t *ekey; /* node << 8 | byte, UINT64_MAX = empty */
    int32_t *echild;
    size_t emask, nedges;
    int32_t *term; /* per node: index into tokens, -1 */
    size_t nnodes, cap;
    unsigned char first[256]; /* bytes that start some pattern */
} trie;

struct lmx_tokadded {
    added *tok;
    size_t n;
    int32_t *by_id; /* id -> index in tok, -1 */
    int32_t id_limit;
    trie tries[2]; /* [0] raw text, [1] normalized text */
};

static void trie_free(trie *t)
{
    free(t->ekey);
    free(t->echild);
    free(t->term);
}

void lmx_tokadded_free(lmx_tokadded *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n; i++) {
        free(a->tok[i].content);
        free(a->tok[i].text);
    }
    free(a->tok);
    free(a->by_id);
    trie_free(&a->tries[0]);
    trie_free(&a->tries[1]);
    free(a);
}

static size_t edge_slot(const trie *t, uint64_t key)
{
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    size_t i = (size_t)(h >> 20) & t->emask;
    while (t->ekey[i] != UINT64_MAX && t->ekey[i] != key)
        i = (i + 1) & t->emask;
    return i;
}

static int32_t trie_child(const trie *t, int32_t node, unsigned char c)
{
    size_t i = edge_slot(t, (uint64_t)node << 8 | c);
    return t->ekey[i] == UINT64_MAX ? -1 : t->echild[i];
}

/* Sized up front for the total pattern bytes, so nothing rehashes. */
static int trie_init(trie *t, size_t bytes)
{
    size_t cap = 16;
    while (cap < bytes * 2 + 2)
        cap *= 2;
    t->ekey = malloc(cap * sizeof *t->ekey);
    t->echild = malloc(cap * sizeof *t->echild);
    t->term = malloc((bytes + 1) * sizeof *t->term);
    if (!t->ekey || !t->echild || !t->term)
        return -1;
    memset(t->ekey, 0xff, cap * sizeof *t->ekey);
    t->emask = cap - 1;
    t->term[0] = -1;
    t->nnodes = 1;
    return 0;
}

static void trie_add(trie *t, const char *s, size_t n, int32_t idx)
{
    int32_t node = 0;
    if (!n)
        return;
    t->first[(unsigned char)s[0]] = 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = (uint64_t)node << 8 | (unsigned char)s[i];
        size_t e = edge_slot(t, key);
        if (t->ekey[e] == UINT64_MAX) {
            t->ekey[e] = key;
            t->echild[e] = (int32_t)t->nnodes;
            t->term[t->nnodes++] = -1;
        }
        node = t->echild[e];
    }
    t->term[node] = idx; /* a later duplicate wins */
}

/* The longest pattern starting at s[0]: its token index and length. */
static int32_t trie_longest(const trie *t, const char *s, size_t n, size_t *mlen)
{
    int32_t node = 0, best = -1;
    for (size_t i = 0; i < n; i++) {
        node = trie_child(t, node, (unsigned char)s[i]);
        if (node < 0)
            break;
        if (t->term[node] >= 0) {
            best = t->term[node];
            *mlen = i + 1;
        }
    }
    return best;
}

/* ---- loading ------------------------------------------------------------------- */

static int flag(const cJSON *o, const char *key, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static lmx_status parse_token(added *t, const cJSON *o, const lmx_toknorm *norm, size_t i,
                              const char *what, lmx_error *err)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "content");
    if (!cJSON_IsNumber(id) || !cJSON_IsString(c))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: added_tokens[%zu] lacks id or content", what, i);
    if (id->valuedouble < 0 || id->valuedouble >= LMX_TOK_MAX_ID ||
        id->valuedouble != (double)id->valueint)
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: added_tokens[%zu]: id out of range", what, i);
    t->id = id->valueint;
    t->special = (unsigned char)flag(o, "special", 0);
    t->lstrip = (unsigned char)flag(o, "lstrip", 0);
    t->rstrip = (unsigned char)flag(o, "rstrip", 0);
    t->single_word = (unsigned char)flag(o, "single_word", 0);
    t->normalized = (unsigned char)flag(o, "normalized", !t->special);
    t->content = strdup(c->valuestring);
    if (!t->content)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    t->len = strlen(t->content);
    lmx_tokbuf nb = {0};
    lmx_status st = lmx_toknorm_run(t->normalized ? norm : NULL, t->content, t->len, &nb, err);
    if (st != LMX_OK) {
        lmx_tokbuf_free(&nb);
        return st;
    }
    t->text = nb.p ? nb.p : strdup("");
    t->text_len = nb.n;
    return t->text ? LMX_OK : lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
}

/* Added ids follow the model's (id_base = its largest id + 1), about densely. */
static lmx_status index_ids(lmx_tokadded *a, int32_t id_base, const char *what, lmx_error *err)
{
    for (size_t i = 0; i < a->n; i++)
        if (a->tok[i].id >= a->id_limit)
            a->id_limit = a->tok[i].id + 1;
    if ((size_t)a->id_limit > (size_t)id_base + 2 * a->n + 1024)
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: added_tokens: id %d out of range", what,
                        a->id_limit - 1);
    a->by_id = malloc(((size_t)a->id_limit + 1) * sizeof *a->by_id);
    if (!a->by_id)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    memset(a->by_id, 0xff, ((size_t)a->id_limit + 1) * sizeof *a->by_id);
    for (size_t i = 0; i < a->n; i++) {
        if (a->by_id[a->tok[i].id] >= 0 &&
            strcmp(a->tok[a->by_id[a->tok[i].id]].content, a->tok[i].content))
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: added_tokens: duplicate id %d", what,
                            a->tok[i].id);
        a->by_id[a->tok[i].id] = (int32_t)i;
    }
    return LMX_OK;
}

static lmx_status build_tries(lmx_tokadded *a, const char *what, lmx_error *err)
{
    size_t bytes[2] = {0, 0};
    for (size_t i = 0; i < a->n; i++)
        bytes[a->tok[i].normalized] += a->tok[i].text_len;
    if (trie_init(&a->tries[0], bytes[0]) || trie_init(&a->tries[1], bytes[1]))
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    for (size_t i = 0; i < a->n; i++)
        trie_add(&a->tries[a->tok[i].normalized], a->tok[i].text, a->tok[i].text_len, (int32_t)i);
    return LMX_OK;
}

lmx_status lmx_tokadded_build(const cJSON *arr, const lmx_toknorm *norm, int32_t id_base,
                              const char *what, lmx_tokadded **out, lmx_error *err)
{
    *out = NULL;
    if (arr && !cJSON_IsArray(arr) && !cJSON_IsNull(arr))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: added_tokens is not an array", what);
    lmx_tokadded *a = calloc(1, sizeof *a);
    size_t n = cJSON_IsArray(arr) ? (size_t)cJSON_GetArraySize(arr) : 0;
    if (a)
        a->tok = calloc(n + 1, sizeof *a->tok);
    lmx_status st = a && a->tok ? LMX_OK : lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    const cJSON *o;
    if (n)
        cJSON_ArrayForEach(o, arr) {
            if (st != LMX_OK)
                break;
            st = parse_token(&a->tok[a->n], o, norm, a->n, what, err);
            a->n++;
        }
    if (st == LMX_OK)
        st = index_ids(a, id_base, what, err);
    if (st == LMX_OK)
        st = build_tries(a, what, err);
    if (st != LMX_OK) {
        lmx_tokadded_free(a);
        return st;
    }
    *out = a;
    return LMX_OK;
}

/* ---- queries ---------------------------------------------------------------------- */

int32_t lmx_tokadded_find(const lmx_tokadded *a, const char *content, size_t len)
{
    for (size_t i = a->n; i-- > 0;)
        if (a->tok[i].len == len && !memcmp(a->tok[i].content, content, len))
            return a->tok[i].id;
    return -1;
}

const char *lmx_tokadded_token(const lmx_tokadded *a, int32_t id, size_t *len)
{
    if (id < 0 || id >= a->id_limit || a->by_id[id] < 0)
        return NULL;
    const added *t = &a->tok[a->by_id[id]];
    *len = t->text_len;
    return t->text;
}

int32_t lmx_tokadded_id_limit(const lmx_tokadded *a)
{
    return a->id_limit;
}

void lmx_tokadded_each_special(const lmx_tokadded *a, void (*fn)(void *, const char *, size_t),
                               void *ctx)
{
    for (size_t i = 0; i < a->n; i++)
        if (a->tok[i].special)
            fn(ctx, a->tok[i].content, a->tok[i].len);
}

/* ---- splitting ---------------------------------------------------------------------- */

void lmx_toksegs_free(lmx_toksegs *s)
{
    free(s->p);
    memset(s, 0, sizeof *s);
}

static int seg_add(lmx_toksegs *s, size_t a, size_t b, int32_t id)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        lmx_tokseg *p = realloc(s->p, cap * sizeof *p);
        if (!p)
            return -1;
        s->p = p;
        s->cap = cap;
    }
    s->p[s->n++] = (lmx_tokseg){a, b, id};
    return 0;
}

static uint32_t cp_before(const char *s, size_t at)
{
    size_t b = at - 1;
    uint32_t cp = 0xFFFD;
    while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80)
        b--;
    lmx_tokutf8_next((const unsigned char *)s + b, at - b, &cp);
    return cp;
}

static uint32_t cp_at(const char *s, size_t len, size_t at)
{
    uint32_t cp = 0xFFFD;
    lmx_tokutf8_next((const unsigned char *)s + at, len - at, &cp);
    return cp;
}

/* Start of the whitespace run that ends at `at`. */
static size_t space_run_start(const char *s, size_t at)
{
    while (at > 0) {
        size_t b = at - 1;
        while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80)
            b--;
        uint32_t cp = 0;
        if (!lmx_tokutf8_next((const unsigned char *)s + b, at - b, &cp) ||
            !lmx_tokuni_is_whitespace(cp))
            break;
        at = b;
    }
    return at;
}

static size_t space_run_end(const char *s, size_t len, size_t at)
{
    uint32_t cp;
    size_t k;
    while (at < len && (k = lmx_tokutf8_next((const unsigned char *)s + at, len - at, &cp)) &&
           lmx_tokuni_is_whitespace(cp))
        at += k;
    return at;
}

/* tokenizers' find_matches: filters and stretches one trie match. Returns 0
 * to drop the match, else sets the token's span. */
static int accept_match(const added *t, const char *s, size_t len, size_t *start, size_t *stop,
                        size_t seg_start, int plain_special)
{
    if (plain_special && t->special)
        return 0;
    if (t->single_word) {
        int before = *start > 0 && lmx_tokuni_is_word(cp_before(s, *start));
        int after = *stop < len && lmx_tokuni_is_word(cp_at(s, len, *stop));
        if (before || after)
            return 0;
    }
    if (t->lstrip) {
        size_t ns = space_run_start(s, *start);
        *start = ns > seg_start ? ns : seg_start;
    }
    if (t->rstrip)
        *stop = space_run_end(s, len, *stop);
    return 1;
}

lmx_status lmx_tokadded_split(const lmx_tokadded *a, int normalized, int plain_special,
                              const char *s, size_t len, lmx_toksegs *out, lmx_error *err)
{
    const trie *t = &a->tries[normalized ? 1 : 0];
    size_t seg = 0, i = 0;
    int bad = 0;
    out->n = 0;
    while (i < len && t->nnodes > 1) {
        size_t mlen = 0;
        int32_t idx = t->first[(unsigned char)s[i]] ? trie_longest(t, s + i, len - i, &mlen) : -1;
        if (idx < 0) {
            i++;
            continue;
        }
        size_t start = i, stop = i + mlen;
        i = stop; /* matches never overlap, even when one is dropped */
        if (!accept_match(&a->tok[idx], s, len, &start, &stop, seg, plain_special))
            continue;
        if (start > seg)
            bad |= seg_add(out, seg, start, -1);
        bad |= seg_add(out, start, stop, a->tok[idx].id);
        seg = stop;
    }
    if (seg < len)
        bad |= seg_add(out, seg, len, -1);
    return bad ? lmx_fail(err, LMX_ERR_NOMEM, "encode: out of memory") : LMX_OK;
}
