/* The BPE model (see tok_bpe.h). */
#include "tok_bpe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#define NO_ID (-1)
#define EMPTY_KEY UINT64_MAX

/* A vocabulary slot: the id (NO_ID = empty) and upper hash bits that skip
 * most string compares. */
typedef struct vslot {
    int32_t id;
    uint32_t tag, off, len; /* off/len copied here: one cache miss less */
} vslot;

/* One cache line access per merge lookup: key, rank and result together. */
typedef struct mslot {
    uint64_t key;
    uint32_t rank;
    int32_t id;
} mslot;

struct lmx_tokbpe {
    char *pool;       /* every token string, back to back */
    size_t pool_n, pool_cap;
    uint32_t *off;    /* per id: offset in pool; len UINT32_MAX = no token */
    uint32_t *len;
    int32_t id_limit; /* largest id + 1 */
    vslot *slot;      /* string -> id, open addressing */
    size_t mask;
    mslot *merge;     /* (left id << 32 | right id) -> rank, merged id */
    size_t mmask, nmerges;
    int32_t byte_id[256]; /* "<0xXX>" tokens for byte fallback */
    int32_t *bmp_id;  /* one-character tokens below U+10000, when no prefix/suffix applies */
    int32_t unk_id;
    int byte_fallback, fuse_unk, ignore_merges;
    char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix, or NULL */
};

typedef struct sym {
    int32_t id, prev, next, len; /* len 0 = merged away */
} sym;

typedef struct merge {
    uint32_t rank, pos;
    int32_t id, left, right; /* the merged id, and the pair it was found for */
} merge;

/* ---- tables ---------------------------------------------------------------- */

static int32_t lookup_hashed(const lmx_tokbpe *b, const char *s, size_t len, uint64_t h)
{
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & b->mask;; i = (i + 1) & b->mask) {
        vslot v = b->slot[i];
        if (v.id == NO_ID)
            return NO_ID;
        if (v.tag == tag && v.len == len && !memcmp(b->pool + v.off, s, len))
            return v.id;
    }
}

int32_t lmx_tokbpe_lookup(const lmx_tokbpe *b, const char *s, size_t len)
{
    return lookup_hashed(b, s, len, lmx_tokhash(s, len));
}

const char *lmx_tokbpe_token(const lmx_tokbpe *b, int32_t id, size_t *len)
{
    if (id < 0 || id >= b->id_limit || b->len[id] == UINT32_MAX)
        return NULL;
    *len = b->len[id];
    return b->pool + b->off[id];
}

int32_t lmx_tokbpe_id_limit(const lmx_tokbpe *b)
{
    return b->id_limit;
}

static size_t merge_home(const lmx_tokbpe *b, uint64_t key);

static size_t merge_slot(const lmx_tokbpe *b, uint64_t key)
{
    size_t i = merge_home(b, key);
    while (b->merge[i].key != EMPTY_KEY && b->merge[i].key != key)
        i = (i + 1) & b->mmask;
    return i;
}

/* The merge of pair (l, r), or NULL when there is none. */
static const mslot *merge_find(const lmx_tokbpe *b, int32_t l, int32_t r)
{
    if (!b->mmask)
        return NULL;
    const mslot *m = &b->merge[merge_slot(b, (uint64_t)(uint32_t)l << 32 | (uint32_t)r)];
    return m->key == EMPTY_KEY ? NULL : m;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

/* ---- loading: vocabulary ------------------------------------------------------ */

/* The vocabulary as read, in file order; placed by id once all is known, so
 * memory follows the file's size even when its ids are absurd. */
typedef struct entries {
    int32_t *id;
    uint32_t *off, *len;
    size_t n, cap;
} entries;

static void entries_free(entries *e)
{
    free(e->id);
    free(e->off);
    free(e->len);
}

static int entries_grow(entries *e)
{
    size_t cap = e->cap ? e->cap * 2 : 1024;
    int32_t *id = realloc(e->id, cap * sizeof *id);
    if (id)
        e->id = id;
    uint32_t *off = id ? realloc(e->off, cap * sizeof *off) : NULL;
    if (off)
        e->off = off;
    uint32_t *len = off ? realloc(e->len, cap * sizeof *len) : NULL;
    if (!len)
        return -1;
    e->len = len;
    e->cap = cap;
    return 0;
}

static lmx_status add_token(lmx_tokbpe *b, entries *e, const lmx_tokbuf *key, long long id,
                            const char *what, lmx_error *err)
{
    if (id < 0 || id >= LMX_TOK_MAX_ID)
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: model.vocab: id %lld of \"%.40s\" out of range",
                        what, id, key->p);
    if (key->n >= UINT32_MAX / 2 || (e->n == e->cap && entries_grow(e)))
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: model.vocab too large", what);
    while (b->pool_cap - b->pool_n < key->n + 1) {
        size_t cap = b->pool_cap ? b->pool_cap * 2 : 1 << 16;
        char *p = cap > UINT32_MAX ? NULL : realloc(b->pool, cap);
        if (!p)
            return lmx_fail(err, LMX_ERR_NOMEM, "%s: model.vocab too large", what);
        b->pool = p;
        b->pool_cap = cap;
    }
    memcpy(b->pool + b->pool_n, key->p, key->n);
    e->id[e->n] = (int32_t)id;
    e->off[e->n] = (uint32_t)b->pool_n;
    e->len[e->n++] = (uint32_t)key->n;
    b->pool_n += key->n;
    if (id >= b->id_limit)
        b->id_limit = (int32_t)id + 1;
    return LMX_OK;
}

/* Ids must be about dense (real vocabularies are 0..n-1): the per-id tables
 * are sized by the largest id. */
static lmx_status place_ids(lmx_tokbpe *b, const entries *e, const char *what, lmx_error *err)
{
    if ((size_t)b->id_limit > 2 * e->n + 1024)
        return lmx_fail(err, LMX_ERR_FORMAT,
                        "%s: model.vocab: ids out of range (largest %d for %zu tokens)", what,
                        b->id_limit - 1, e->n);
    size_t n = (size_t)b->id_limit + 1;
    b->off = malloc(n * sizeof *b->off);
    b->len = malloc(n * sizeof *b->len);
    if (!b->off || !b->len)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: model.vocab too large", what);
    memset(b->len, 0xff, n * sizeof *b->len);
    for (size_t i = 0; i < e->n; i++) {
        int32_t id = e->id[i];
        if (b->len[id] != UINT32_MAX)
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: model.vocab: duplicate id %d", what, id);
        b->off[id] = e->off[i];
        b->len[id] = e->len[i];
    }
    return LMX_OK;
}

static lmx_status build_index(lmx_tokbpe *b, size_t count, const char *what, lmx_error *err)
{
    size_t cap = pow2_at_least(count * 2);
    b->slot = malloc(cap * sizeof *b->slot);
    if (!b->slot)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: model.vocab too large", what);
    memset(b->slot, 0xff, cap * sizeof *b->slot);
    b->mask = cap - 1;
    for (int32_t id = 0; id < b->id_limit; id++) {
        if (b->len[id] == UINT32_MAX)
            continue;
        const char *s = b->pool + b->off[id];
        if (lmx_tokbpe_lookup(b, s, b->len[id]) != NO_ID)
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: model.vocab: duplicate token \"%.*s\"", what,
                            (int)(b->len[id] < 40 ? b->len[id] : 40), s);
        uint64_t h = lmx_tokhash(s, b->len[id]);
        size_t i = h & b->mask;
        while (b->slot[i].id != NO_ID)
            i = (i + 1) & b->mask;
        b->slot[i] = (vslot){id, (uint32_t)(h >> 32), b->off[id], b->len[id]};
    }
    return LMX_OK;
}

static lmx_status load_vocab(lmx_tokbpe *b, lmx_tokjson *j, const char *what, lmx_error *err)
{
    lmx_tokbuf key = {0};
    entries e = {0};
    int first = 1, r;
    lmx_status st = LMX_OK;
    if (lmx_tokjson_expect(j, '{'))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: model.vocab is not an object", what);
    while (st == LMX_OK && (r = lmx_tokjson_next(j, &first, &key)) == 1) {
        long long id;
        if (lmx_tokjson_int(j, &id))
            st = lmx_fail(err, LMX_ERR_FORMAT, "%s: model.vocab: bad id for \"%.40s\"", what,
                          key.p ? key.p : "");
        else
            st = add_token(b, &e, &key, id, what, err);
    }
    lmx_tokbuf_free(&key);
    if (st == LMX_OK && r < 0)
        st = lmx_fail(err, LMX_ERR_FORMAT, "%s: model.vocab: malformed JSON", what);
    if (st == LMX_OK)
        st = place_ids(b, &e, what, err);
    if (st == LMX_OK)
        st = build_index(b, e.n, what, err);
    entries_free(&e);
    return st;
}

/* ---- loading: merges ---------------------------------------------------------- */

/* Merges are read in batches: parse, hash and prefetch the table slots of
 * a whole batch first, so the lookups that follow rarely wait on memory
 * (this halves the load time of a 500k-merge file). */
#define BATCH 64

typedef struct pending {
    size_t off[3], len[3]; /* left, right, merged strings in the batch arena */
    uint64_t hash[3];
    uint32_t rank;
    uint64_t key; /* set by resolve */
    int32_t id;
} pending;

typedef struct batch {
    pending m[BATCH];
    int n;
    lmx_tokbuf text;
    size_t plen; /* continuing_subword_prefix length */
} batch;

/* Resolves the three tokens of a queued merge into its table key and result. */
static lmx_status resolve(const lmx_tokbpe *b, const batch *bt, pending *m, const char *what,
                          lmx_error *err)
{
    const char *t = bt->text.p;
    int32_t id[3];
    for (int k = 0; k < 3; k++)
        id[k] = lookup_hashed(b, t + m->off[k], m->len[k], m->hash[k]);
    if (id[0] == NO_ID || id[1] == NO_ID)
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: model.merges[%u] names unknown token \"%.*s\"",
                        what, m->rank, (int)(id[0] == NO_ID ? m->len[0] : m->len[1]),
                        t + m->off[id[0] == NO_ID ? 0 : 1]);
    if (id[2] == NO_ID)
        return lmx_fail(err, LMX_ERR_FORMAT,
                        "%s: model.merges[%u]: merged token \"%.*s\" is not in the vocab", what,
                        m->rank, (int)(m->len[2] < 40 ? m->len[2] : 40), t + m->off[2]);
    m->key = (uint64_t)(uint32_t)id[0] << 32 | (uint32_t)id[1];
    m->id = id[2];
    return LMX_OK;
}

static size_t merge_home(const lmx_tokbpe *b, uint64_t key)
{
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 31)) & b->mmask;
}

/* Four passes, each prefetching what the next one reads: vocabulary slots,
 * token text, then (ids known) merge slots, then the inserts in file order
 * (a later duplicate replaces the earlier one, as a Rust HashMap collect does). */
static lmx_status flush_batch(lmx_tokbpe *b, batch *bt, const char *what, lmx_error *err)
{
    for (int i = 0; i < bt->n; i++)
        for (int k = 0; k < 3; k++)
            __builtin_prefetch(&b->slot[bt->m[i].hash[k] & b->mask]);
    for (int i = 0; i < bt->n; i++)
        for (int k = 0; k < 3; k++) {
            const vslot *v = &b->slot[bt->m[i].hash[k] & b->mask];
            if (v->id != NO_ID)
                __builtin_prefetch(b->pool + v->off);
        }
    lmx_status st = LMX_OK;
    for (int i = 0; st == LMX_OK && i < bt->n; i++) {
        st = resolve(b, bt, &bt->m[i], what, err);
        __builtin_prefetch(&b->merge[merge_home(b, bt->m[i].key)], 1);
    }
    for (int i = 0; st == LMX_OK && i < bt->n; i++) {
        mslot *slot = &b->merge[merge_slot(b, bt->m[i].key)];
        b->nmerges += slot->key == EMPTY_KEY;
        *slot = (mslot){bt->m[i].key, bt->m[i].rank, bt->m[i].id};
    }
    bt->n = 0;
    bt->text.n = 0;
    return st;
}

/* Queues merge (a, c): a + c without the prefix must be a token too. */
static lmx_status queue_merge(batch *bt, size_t a, size_t na, size_t c, size_t nc, uint32_t rank,
                              const char *what, lmx_error *err)
{
    if (nc < bt->plen)
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: model.merges[%u]: \"%.*s\" lacks the prefix",
                        what, rank, (int)nc, bt->text.p + c);
    size_t ab = bt->text.n;
    if (lmx_tokbuf_reserve(&bt->text, na + nc) ||
        lmx_tokbuf_put(&bt->text, bt->text.p + a, na) ||
        lmx_tokbuf_put(&bt->text, bt->text.p + c + bt->plen, nc - bt->plen))
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    pending *m = &bt->m[bt->n++];
    *m = (pending){{a, c, ab}, {na, nc, na + nc - bt->plen}, {0, 0, 0}, rank, 0, 0};
    for (int k = 0; k < 3; k++)
        m->hash[k] = lmx_tokhash(bt->text.p + m->off[k], m->len[k]);
    return LMX_OK;
}

static int append_string(lmx_tokjson *j, batch *bt, lmx_tokbuf *tmp, size_t *off, size_t *len)
{
    if (lmx_tokjson_string(j, tmp))
        return -1;
    *off = bt->text.n;
    *len = tmp->n;
    return lmx_tokbuf_put(&bt->text, tmp->p, tmp->n);
}

/* One merge: "a b" (exactly one space) or ["a", "b"]. */
static lmx_status load_merge(lmx_tokjson *j, batch *bt, uint32_t rank, lmx_tokbuf *tmp,
                             const char *what, lmx_error *err)
{
    size_t a, na, c, nc;
    if (lmx_tokjson_peek(j) == '"') {
        if (append_string(j, bt, tmp, &a, &na))
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: model.merges[%u]: bad string", what, rank);
        const char *s = bt->text.p + a, *sp = memchr(s, ' ', na);
        if (!sp || memchr(sp + 1, ' ', na - (size_t)(sp + 1 - s)))
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: model.merges[%u]: \"%.40s\" is not \"a b\"",
                            what, rank, tmp->p);
        c = a + (size_t)(sp + 1 - s);
        nc = na - (size_t)(sp + 1 - s);
        na = (size_t)(sp - s);
    } else if (lmx_tokjson_expect(j, '[') || append_string(j, bt, tmp, &a, &na) ||
               lmx_tokjson_expect(j, ',') || append_string(j, bt, tmp, &c, &nc) ||
               lmx_tokjson_expect(j, ']')) {
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: model.merges[%u] is not a pair of strings",
                        what, rank);
    }
    return queue_merge(bt, a, na, c, nc, rank, what, err);
}

static int alloc_merges(lmx_tokbpe *b, size_t cap)
{
    mslot *old = b->merge;
    size_t old_cap = old ? b->mmask + 1 : 0;
    b->merge = malloc(cap * sizeof *b->merge);
    if (!b->merge) {
        b->merge = old;
        return -1;
    }
    for (size_t i = 0; i < cap; i++)
        b->merge[i].key = EMPTY_KEY;
    b->mmask = cap - 1;
    b->nmerges = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].key != EMPTY_KEY) {
            b->merge[merge_slot(b, old[i].key)] = old[i];
            b->nmerges++;
        }
    free(old);
    return 0;
}

/* The table starts at four times the vocabulary and doubles at half full. */
static lmx_status load_merges(lmx_tokbpe *b, lmx_tokjson j, const char *what, lmx_error *err)
{
    int first = 1;
    if (lmx_tokjson_expect(&j, '['))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: model.merges is not an array", what);
    batch *bt = calloc(1, sizeof *bt);
    lmx_status st = !bt || alloc_merges(b, pow2_at_least((size_t)b->id_limit * 4))
                        ? lmx_fail(err, LMX_ERR_NOMEM, "%s: model.merges too large", what) : LMX_OK;
    lmx_tokbuf tmp = {0};
    if (bt)
        bt->plen = b->prefix ? strlen(b->prefix) : 0;
    for (uint32_t rank = 0; st == LMX_OK && lmx_tokjson_next(&j, &first, NULL) == 1; rank++) {
        /* a legacy "#version" header line is not a merge */
        if (rank == 0 && j.end - j.p > 9 && !memcmp(j.p, "\"#version", 9)) {
            lmx_tokjson_skip(&j, NULL, NULL);
            rank--;
            continue;
        }
        if ((b->nmerges + BATCH) * 2 >= b->mmask && alloc_merges(b, (b->mmask + 1) * 2))
            st = lmx_fail(err, LMX_ERR_NOMEM, "%s: model.merges too large", what);
        if (st == LMX_OK)
            st = load_merge(&j, bt, rank, &tmp, what, err);
        if (st == LMX_OK && bt->n == BATCH)
            st = flush_batch(b, bt, what, err);
    }
    if (st == LMX_OK)
        st = flush_batch(b, bt, what, err);
    if (bt)
        lmx_tokbuf_free(&bt->text);
    free(bt);
    lmx_tokbuf_free(&tmp);
    return st;
}

/* ---- loading: the model object -------------------------------------------------- */

/* Reads a string-or-null field; *out is malloc'd or NULL. */
static int opt_string(lmx_tokjson *j, char **out)
{
    lmx_tokbuf s = {0};
    free(*out);
    *out = NULL;
    if (lmx_tokjson_peek(j) == 'n')
        return lmx_tokjson_skip(j, NULL, NULL);
    if (lmx_tokjson_string(j, &s)) {
        lmx_tokbuf_free(&s);
        return -1;
    }
    *out = s.p ? s.p : calloc(1, 1);
    return *out ? 0 : -1;
}

static int opt_bool(lmx_tokjson *j, int *out)
{
    const char *s;
    size_t n;
    if (lmx_tokjson_skip(j, &s, &n))
        return -1;
    if (n == 4 && !memcmp(s, "true", 4))
        *out = 1;
    else if ((n == 5 && !memcmp(s, "false", 5)) || (n == 4 && !memcmp(s, "null", 4)))
        *out = 0;
    else
        return -1;
    return 0;
}

static lmx_status model_field(lmx_tokbpe *b, lmx_tokjson *j, const char *key, char **type,
                              char **unk, int *have_vocab, lmx_tokjson *merges, const char *what,
                              lmx_error *err)
{
    int bad = 0;
    if (!strcmp(key, "type")) {
        bad = opt_string(j, type);
    } else if (!strcmp(key, "vocab")) {
        if (*have_vocab)
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: model.vocab given twice", what);
        if (*type && strcmp(*type, "BPE"))
            return lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: model type \"%s\" is not supported",
                            what, *type);
        *have_vocab = 1;
        return load_vocab(b, j, what, err);
    } else if (!strcmp(key, "merges")) {
        *merges = *j; /* read once the vocabulary is known */
        bad = lmx_tokjson_skip(j, NULL, NULL);
    } else if (!strcmp(key, "unk_token")) {
        bad = opt_string(j, unk);
    } else if (!strcmp(key, "continuing_subword_prefix")) {
        bad = opt_string(j, &b->prefix);
    } else if (!strcmp(key, "end_of_word_suffix")) {
        bad = opt_string(j, &b->suffix);
    } else if (!strcmp(key, "fuse_unk")) {
        bad = opt_bool(j, &b->fuse_unk);
    } else if (!strcmp(key, "byte_fallback")) {
        bad = opt_bool(j, &b->byte_fallback);
    } else if (!strcmp(key, "ignore_merges")) {
        bad = opt_bool(j, &b->ignore_merges);
    } else {
        bad = lmx_tokjson_skip(j, NULL, NULL); /* dropout, cache_capacity: no effect here */
    }
    return bad ? lmx_fail(err, LMX_ERR_FORMAT, "%s: model.%s is malformed", what, key) : LMX_OK;
}

static int fill_fast_ids(lmx_tokbpe *b)
{
    char name[8];
    for (int i = 0; i < 256; i++) {
        snprintf(name, sizeof name, "<0x%02X>", i);
        b->byte_id[i] = lmx_tokbpe_lookup(b, name, 6);
    }
    b->bmp_id = malloc(0x10000 * sizeof *b->bmp_id);
    if (!b->bmp_id)
        return -1;
    memset(b->bmp_id, 0xff, 0x10000 * sizeof *b->bmp_id);
    /* one pass over the vocabulary: every token that is one such character */
    for (int32_t id = 0; id < b->id_limit; id++) {
        uint32_t cp, n = b->len[id];
        if (n != UINT32_MAX && n >= 1 && n <= 3 &&
            lmx_tokutf8_next((const unsigned char *)b->pool + b->off[id], n, &cp) == n)
            b->bmp_id[cp] = id;
    }
    return 0;
}

static lmx_status finish_model(lmx_tokbpe *b, const char *type, const char *unk, int have_vocab,
                               lmx_tokjson merges, const char *what, lmx_error *err)
{
    if (type && strcmp(type, "BPE"))
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: model type \"%s\" is not supported", what,
                        type);
    if (!have_vocab || !merges.p)
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: model lacks %s", what,
                        have_vocab ? "merges" : "vocab");
    lmx_status st = load_merges(b, merges, what, err);
    if (st != LMX_OK)
        return st;
    b->unk_id = NO_ID;
    if (unk) {
        b->unk_id = lmx_tokbpe_lookup(b, unk, strlen(unk));
        if (b->unk_id == NO_ID)
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: model.unk_token \"%.40s\" is not in the vocab",
                            what, unk);
    }
    return fill_fast_ids(b) ? lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what) : LMX_OK;
}

lmx_status lmx_tokbpe_load(lmx_tokjson *j, const char *what, lmx_tokbpe **out, lmx_error *err)
{
    lmx_tokbpe *b = calloc(1, sizeof *b);
    lmx_tokbuf key = {0};
    char *type = NULL, *unk = NULL;
    int have_vocab = 0, first = 1, r = -1;
    lmx_tokjson merges = {0};
    lmx_status st = b ? LMX_OK : lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    if (st == LMX_OK && lmx_tokjson_expect(j, '{'))
        st = lmx_fail(err, LMX_ERR_FORMAT, "%s: \"model\" is not an object", what);
    while (st == LMX_OK && (r = lmx_tokjson_next(j, &first, &key)) == 1)
        st = model_field(b, j, key.p, &type, &unk, &have_vocab, &merges, what, err);
    if (st == LMX_OK && r < 0)
        st = lmx_fail(err, LMX_ERR_FORMAT, "%s: \"model\": malformed JSON", what);
    if (st == LMX_OK)
        st = finish_model(b, type, unk, have_vocab, merges, what, err);
    lmx_tokbuf_free(&key);
    free(type);
    free(unk);
    if (st != LMX_OK) {
        lmx_tokbpe_free(b);
        b = NULL;
    }
    *out = b;
    return st;
}

void lmx_tokbpe_free(lmx_tokbpe *b)
{
    if (!b)
        return;
    free(b->pool);
    free(b->off);
    free(b->len);
    free(b->slot);
    free(b->merge);
    free(b->bmp_id);
    free(b->prefix);
    free(b->suffix);
    free(b);
}

/* ---- encoding --------------------------------------------------------------------- */

static int scratch_fit(lmx_tokbpe_scratch *s, size_t nsym)
{
    if (nsym > s->sym_cap) {
        size_t cap = nsym * 2;
        void *p = realloc(s->sym, cap * sizeof(sym));
        void *q = p ? realloc(s->heap, cap * 2 * sizeof(merge)) : NULL;
        if (p)
            s->sym = p;
        if (!q)
            return -1;
        s->heap = q;
        s->sym_cap = cap;
        s->heap_cap = cap * 2;
    }
    return 0;
}

void lmx_tokbpe_scratch_free(lmx_tokbpe_scratch *s)
{
    free(s->sym);
    free(s->heap);
    free(s->tmp);
    memset(s, 0, sizeof *s);
}

/* The string looked up for one character: the prefix (when not first) and
 * the suffix (when last) applied, as merge_word builds it. */
static const char *char_str(const lmx_tokbpe *b, lmx_tokbpe_scratch *s, const char *c, size_t n,
                            int first, int last, size_t *len)
{
    const char *pre = first ? NULL : b->prefix, *suf = last ? b->suffix : NULL;
    size_t np = pre ? strlen(pre) : 0, ns = suf ? strlen(suf) : 0, need = np + n + ns;
    *len = n;
    if (!np && !ns)
        return c;
    if (need > s->tmp_cap) {
        char *t = realloc(s->tmp, need);
        if (!t)
            return NULL;
        s->tmp = t;
        s->tmp_cap = need;
    }
    memcpy(s->tmp, pre, np);
    memcpy(s->tmp + np, c, n);
    memcpy(s->tmp + np + n, suf, ns);
    *len = need;
    return s->tmp;
}

/* c is one character (n <= 3: below U+10000) or an affixed string. */
static int32_t str_id(const lmx_tokbpe *b, const char *c, size_t n, uint32_t cp, int plain)
{
    return plain && n <= 3 ? b->bmp_id[cp] : lmx_tokbpe_lookup(b, c, n);
}

static int byte_fallback_ok(const lmx_tokbpe *b, const char *c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b->byte_id[(unsigned char)c[i]] == NO_ID)
            return 0;
    return 1;
}

static void sym_add(sym *v, size_t *n, int32_t id, int32_t len)
{
    v[*n] = (sym){id, (int32_t)*n - 1, (int32_t)*n + 1, len};
    (*n)++;
}

/* Splits the word into characters mapped to ids, with byte fallback and
 * (fused) unknown tokens as tokenizers' merge_word does. */
static size_t initial_symbols(const lmx_tokbpe *b, const char *w, size_t len, lmx_tokbpe_scratch *s)
{
    sym *v = s->sym;
    size_t n = 0;
    int32_t unk_len = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp = 0;
        size_t k = lmx_tokutf8_next((const unsigned char *)w + i, len - i, &cp);
        int whole = k != 0;
        k = k ? k : 1; /* input is valid UTF-8; be safe anyway */
        size_t sn;
        const char *str = char_str(b, s, w + i, k, i == 0, i + k == len, &sn);
        if (!str)
            return SIZE_MAX;
        int32_t id = str_id(b, str, sn, cp, whole && str == w + i);
        if (id != NO_ID) {
            if (unk_len)
                sym_add(v, &n, b->unk_id, unk_len);
            unk_len = 0;
            sym_add(v, &n, id, (int32_t)k);
        } else if (b->byte_fallback && byte_fallback_ok(b, str, sn)) {
            /* a pending unknown stays pending here, as in tokenizers */
            for (size_t t = 0; t < sn; t++)
                sym_add(v, &n, b->byte_id[(unsigned char)str[t]], 1);
        } else if (b->unk_id != NO_ID) {
            if (unk_len && !b->fuse_unk) {
                sym_add(v, &n, b->unk_id, unk_len);
                unk_len = 0;
            }
            unk_len += (int32_t)k;
        }
        i += k;
    }
    if (unk_len)
        sym_add(v, &n, b->unk_id, unk_len);
    if (n)
        v[n - 1].next = -1;
    return n;
}

/* A binary min-heap on (rank, pos), as tokenizers' BinaryHeap<Merge>. */
static int merge_less(const merge *a, const merge *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(merge *h, size_t *n, merge m)
{
    size_t i = (*n)++;
    while (i && merge_less(&m, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = m;
}

static merge heap_pop(merge *h, size_t *n)
{
    merge top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && merge_less(&h[c + 1], &h[c]))
            c++;
        if (!merge_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

static void push_pair(const lmx_tokbpe *b, merge *h, size_t *nh, const sym *v, int32_t pos)
{
    int32_t l = v[pos].id, r = v[v[pos].next].id;
    const mslot *m = merge_find(b, l, r);
    if (m)
        heap_push(h, nh, (merge){m->rank, (uint32_t)pos, m->id, l, r});
}

/* tokenizers' Word::merge_all, including its test for stale queue entries
 * (the pair must still merge into the same id), so results match exactly. */
static void merge_all(const lmx_tokbpe *b, sym *v, size_t n, merge *h)
{
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++)
        push_pair(b, h, &nh, v, (int32_t)i);
    while (nh) {
        merge top = heap_pop(h, &nh);
        sym *cur = &v[top.pos];
        if (!cur->len || cur->next < 0)
            continue;
        sym *right = &v[cur->next];
        if (cur->id != top.left || right->id != top.right) {
            const mslot *m = merge_find(b, cur->id, right->id);
            if (!m || m->id != top.id)
                continue;
        }
        cur->id = top.id;
        cur->len += right->len;
        right->len = 0;
        cur->next = right->next;
        if (cur->next >= 0)
            v[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0)
            push_pair(b, h, &nh, v, cur->prev);
        if (cur->next >= 0)
            push_pair(b, h, &nh, v, (int32_t)top.pos);
    }
}

lmx_status lmx_tokbpe_encode(const lmx_tokbpe *b, const char *word, size_t len,
                             lmx_tokbpe_scratch *s, lmx_tokids *ids, lmx_error *err)
{
    if (!len)
        return LMX_OK;
    if (b->ignore_merges) {
        int32_t id = lmx_tokbpe_lookup(b, word, len);
        if (id != NO_ID)
            return lmx_tokids_push(ids, id) ? lmx_fail(err, LMX_ERR_NOMEM, "encode: out of memory")
                                            : LMX_OK;
    }
    /* a character becomes at most one symbol per byte of itself and its affixes */
    size_t extra = (b->prefix ? strlen(b->prefix) : 0) + (b->suffix ? strlen(b->suffix) : 0);
    if (len > SIZE_MAX / 4 / (extra + 1) || scratch_fit(s, len * (extra + 1) + 1))
        return lmx_fail(err, LMX_ERR_NOMEM, "encode: out of memory");
    size_t n = initial_symbols(b, word, len, s);
    if (n == SIZE_MAX)
        return lmx_fail(err, LMX_ERR_NOMEM, "encode: out of memory");
    sym *v = s->sym;
    merge_all(b, v, n, s->heap);
    for (int32_t i = n ? 0 : -1; i >= 0; i = v[i].next)
        if (lmx_tokids_push(ids, v[i].id))
            return lmx_fail(err, LMX_ERR_NOMEM, "encode: out of memory");
    return LMX_OK;
}
