/* Pre-tokenizers (see tok_pretok.h). */
#include "tok_pretok.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "error.h"
#include "tok_regex.h"

typedef enum kind { K_SPLIT, K_BYTELEVEL, K_METASPACE, K_WHITESPACE, K_WSSPLIT, K_DIGITS,
                    K_PUNCT, K_SEQ } kind;

/* tokenizers' SplitDelimiterBehavior */
typedef enum behavior { B_REMOVED, B_ISOLATED, B_PREVIOUS, B_NEXT, B_CONTIGUOUS } behavior;

enum { PREPEND_ALWAYS, PREPEND_NEVER, PREPEND_FIRST };

struct lmx_tokpre {
    kind k;
    lmx_tokre *re;    /* K_SPLIT; K_BYTELEVEL with use_regex */
    behavior beh;
    int invert;       /* K_SPLIT */
    int prefix_space; /* K_BYTELEVEL add_prefix_space */
    uint32_t repl;    /* K_METASPACE replacement */
    int prepend, split;
    int individual;   /* K_DIGITS */
    lmx_tokpre **sub; /* K_SEQ */
    int nsub;
};

/* A match list: spans with a flag, covering the whole piece in order. */
typedef struct mark {
    size_t a, b;
    int match;
} mark;

typedef struct marks {
    mark *p;
    size_t n, cap;
} marks;

/* GPT-2's map: printable Latin-1 bytes stand for themselves, the others
 * take 256, 257, ... in byte order. */
static const uint16_t BYTE_CHAR[256] = {
    256, 257, 258, 259, 260, 261, 262, 263, 264, 265, 266, 267,
    268, 269, 270, 271, 272, 273, 274, 275, 276, 277, 278, 279,
    280, 281, 282, 283, 284, 285, 286, 287, 288, 33, 34, 35,
    36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
    48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59,
    60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71,
    72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83,
    84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95,
    96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107,
    108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119,
    120, 121, 122, 123, 124, 125, 126, 289, 290, 291, 292, 293,
    294, 295, 296, 297, 298, 299, 300, 301, 302, 303, 304, 305,
    306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317,
    318, 319, 320, 321, 322, 161, 162, 163, 164, 165, 166, 167,
    168, 169, 170, 171, 172, 323, 174, 175, 176, 177, 178, 179,
    180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191,
    192, 193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203,
    204, 205, 206, 207, 208, 209, 210, 211, 212, 213, 214, 215,
    216, 217, 218, 219, 220, 221, 222, 223, 224, 225, 226, 227,
    228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239,
    240, 241, 242, 243, 244, 245, 246, 247, 248, 249, 250, 251,
    252, 253, 254, 255,
};

uint32_t lmx_tokbyte_char(unsigned char b)
{
    return BYTE_CHAR[b];
}

int lmx_tokbyte_of_char(uint32_t cp)
{
    if (cp < 256)
        return BYTE_CHAR[cp] == cp ? (int)cp : -1;
    /* the 68 remapped bytes, in order: 0-32, 127-160, 173 */
    uint32_t k = cp - 256;
    return k < 33 ? (int)k : k < 67 ? (int)(127 + k - 33) : k == 67 ? 173 : -1;
}

void lmx_tokpre_free(lmx_tokpre *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->nsub; i++)
        lmx_tokpre_free(p->sub[i]);
    free(p->sub);
    lmx_tokre_free(p->re);
    free(p);
}

void lmx_tokpieces_free(lmx_tokpieces *ps)
{
    free(ps->p);
    free(ps->tmp);
    lmx_tokbuf_free(&ps->arena);
    memset(ps, 0, sizeof *ps);
}

/* ---- building --------------------------------------------------------------------- */

static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_behavior(const cJSON *j, behavior dflt, behavior *out)
{
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                  "Contiguous"};
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "behavior");
    *out = dflt;
    if (!v)
        return 0;
    for (int i = 0; cJSON_IsString(v) && i < 5; i++)
        if (!strcmp(v->valuestring, names[i])) {
            *out = (behavior)i;
            return 0;
        }
    return -1;
}

static int flag(const cJSON *j, const char *key, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static lmx_status build_metaspace(lmx_tokpre *p, const cJSON *j, const char *what, lmx_error *err)
{
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "replacement");
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
    p->k = K_METASPACE;
    p->repl = 0x2581;
    if (cJSON_IsString(r) &&
        !lmx_tokutf8_next((const unsigned char *)r->valuestring, strlen(r->valuestring), &p->repl))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: Metaspace replacement is empty", what);
    p->split = flag(j, "split", 1);
    /* older files say add_prefix_space instead of prepend_scheme */
    p->prepend = flag(j, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
    if (cJSON_IsString(ps)) {
        if (!strcmp(ps->valuestring, "always"))
            p->prepend = PREPEND_ALWAYS;
        else if (!strcmp(ps->valuestring, "never"))
            p->prepend = PREPEND_NEVER;
        else if (!strcmp(ps->valuestring, "first"))
            p->prepend = PREPEND_FIRST;
        else
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: Metaspace prepend_scheme \"%s\"", what,
                            ps->valuestring);
    }
    return LMX_OK;
}

static lmx_status build_seq(lmx_tokpre *p, const cJSON *j, const char *what, lmx_error *err)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers");
    p->k = K_SEQ;
    if (!cJSON_IsArray(arr))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: Sequence lacks \"pretokenizers\"", what);
    p->sub = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *p->sub);
    if (!p->sub)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        lmx_status st = lmx_tokpre_build(it, what, &p->sub[p->nsub], err);
        if (st != LMX_OK)
            return st;
        if (p->sub[p->nsub])
            p->nsub++;
    }
    return LMX_OK;
}

static lmx_status build_kind(lmx_tokpre *p, const char *type, const cJSON *j, const char *what,
                             lmx_error *err)
{
    if (!strcmp(type, "Split")) {
        p->k = K_SPLIT;
        p->invert = flag(j, "invert", 0);
        if (parse_behavior(j, B_ISOLATED, &p->beh))
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: Split has a bad \"behavior\"", what);
        return lmx_tokpattern_build(cJSON_GetObjectItemCaseSensitive(j, "pattern"), what, &p->re,
                                    err);
    }
    if (!strcmp(type, "ByteLevel")) {
        p->k = K_BYTELEVEL;
        p->prefix_space = flag(j, "add_prefix_space", 1);
        if (flag(j, "use_regex", 1))
            return lmx_tokre_compile(GPT2_RE, sizeof GPT2_RE - 1, 0, &p->re, err);
        return LMX_OK;
    }
    if (!strcmp(type, "Metaspace"))
        return build_metaspace(p, j, what, err);
    if (!strcmp(type, "Sequence"))
        return build_seq(p, j, what, err);
    if (!strcmp(type, "Whitespace")) {
        p->k = K_WHITESPACE;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p->k = K_WSSPLIT;
    } else if (!strcmp(type, "Digits")) {
        p->k = K_DIGITS;
        p->individual = flag(j, "individual_digits", 0);
    } else if (!strcmp(type, "Punctuation")) {
        p->k = K_PUNCT;
        if (parse_behavior(j, B_ISOLATED, &p->beh))
            return lmx_fail(err, LMX_ERR_FORMAT, "%s: Punctuation has a bad \"behavior\"", what);
    } else {
        return lmx_fail(err, LMX_ERR_UNSUPPORTED, "%s: pre_tokenizer \"%s\" is not supported",
                        what, type);
    }
    return LMX_OK;
}

lmx_status lmx_tokpre_build(const cJSON *j, const char *what, lmx_tokpre **out, lmx_error *err)
{
    *out = NULL;
    if (!j || cJSON_IsNull(j))
        return LMX_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(type))
        return lmx_fail(err, LMX_ERR_FORMAT, "%s: pre_tokenizer without \"type\"", what);
    lmx_tokpre *p = calloc(1, sizeof *p);
    if (!p)
        return lmx_fail(err, LMX_ERR_NOMEM, "%s: out of memory", what);
    lmx_status st = build_kind(p, type->valuestring, j, what, err);
    if (st != LMX_OK) {
        lmx_tokpre_free(p);
        return st;
    }
    *out = p;
    return LMX_OK;
}

/* ---- running ------------------------------------------------------------------------ */

static int mark_add(marks *m, size_t a, size_t b, int match)
{
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 32;
        mark *p = realloc(m->p, cap * sizeof *p);
        if (!p)
            return -1;
        m->p = p;
        m->cap = cap;
    }
    m->p[m->n++] = (mark){a, b, match};
    return 0;
}

static int piece_add(lmx_tokpieces *ps, size_t off, size_t len, int origin)
{
    if (!len)
        return 0; /* tokenizers drops empty splits */
    if (ps->n == ps->tmp_cap) {
        size_t cap = ps->tmp_cap ? ps->tmp_cap * 2 : 32;
        lmx_tokpiece *p = realloc(ps->tmp, cap * sizeof *p);
        if (!p)
            return -1;
        ps->tmp = p;
        ps->tmp_cap = cap;
    }
    ps->tmp[ps->n++] = (lmx_tokpiece){off, len, origin};
    return 0;
}

/* tokenizers' NormalizedString::split: folds the marks by behavior and
 * emits the pieces (relative to the parent piece at `base`). */
static int emit_marks(lmx_tokpieces *out, const marks *m, behavior beh, size_t base, int origin)
{
    marks r = {0};
    int bad = 0, prev = 0;
    if (beh == B_NEXT) {
        for (size_t i = m->n; i-- > 0;) {
            mark k = m->p[i];
            if (k.match && !prev && r.n)
                r.p[r.n - 1].a = k.a;
            else
                bad |= mark_add(&r, k.a, k.b, 0);
            prev = k.match;
        }
        for (size_t i = 0; i < r.n / 2; i++) {
            mark t = r.p[i];
            r.p[i] = r.p[r.n - 1 - i];
            r.p[r.n - 1 - i] = t;
        }
    } else {
        for (size_t i = 0; i < m->n; i++) {
            mark k = m->p[i];
            if (beh == B_REMOVED ? !k.match : beh == B_ISOLATED ? 1 : 0)
                bad |= mark_add(&r, k.a, k.b, 0);
            else if (beh == B_PREVIOUS && !(k.match && !prev && r.n))
                bad |= mark_add(&r, k.a, k.b, 0);
            else if (beh == B_CONTIGUOUS && !(k.match == prev && r.n))
                bad |= mark_add(&r, k.a, k.b, 0);
            else if (beh == B_PREVIOUS || beh == B_CONTIGUOUS)
                r.p[r.n - 1].b = k.b;
            prev = k.match;
        }
    }
    for (size_t i = 0; !bad && i < r.n; i++)
        bad |= piece_add(out, base + r.p[i].a, r.p[i].b - r.p[i].a, origin && r.p[i].a == 0);
    free(r.p);
    return bad;
}

/* Turns match spans into marks covering [0, len) (tokenizers' find_matches). */
static int spans_to_marks(const lmx_tokspans *sp, size_t len, int invert, marks *m)
{
    size_t prev = 0;
    int bad = 0;
    m->n = 0;
    if (!len)
        return mark_add(m, 0, 0, 0);
    for (size_t i = 0; i < sp->n; i++) {
        size_t a = sp->p[2 * i], b = sp->p[2 * i + 1];
        if (a != prev)
            bad |= mark_add(m, prev, a, invert);
        bad |= mark_add(m, a, b, !invert);
        prev = b;
    }
    if (prev != len)
        bad |= mark_add(m, prev, len, invert);
    return bad;
}

/* Marks for a character predicate: each matching character on its own. */
static int char_marks(const char *s, size_t len, int (*pred)(uint32_t), marks *m)
{
    size_t run = 0;
    int bad = 0;
    m->n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp = 0xFFFD;
        size_t k = lmx_tokutf8_next((const unsigned char *)s + i, len - i, &cp);
        k = k ? k : 1;
        if (pred(cp)) {
            if (run < i)
                bad |= mark_add(m, run, i, 0);
            bad |= mark_add(m, i, i + k, 1);
            run = i + k;
        }
        i += k;
    }
    if (run < len || !len)
        bad |= mark_add(m, run, len, 0);
    return bad;
}

static int is_punct(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '!' && cp <= '/') || (cp >= ':' && cp <= '@') || (cp >= '[' && cp <= '`') ||
               (cp >= '{' && cp <= '~');
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

/* Whitespace: the words of \w+|[^\w\s]+ (Rust regex classes), spaces dropped. */
static int whitespace_words(lmx_tokpieces *out, const char *s, size_t len, size_t base, int origin,
                            int split_only)
{
    size_t start = 0;
    int cls = 0; /* of the current run: 0 space, 1 word, 2 other */
    for (size_t i = 0; i <= len;) {
        uint32_t cp = ' ';
        size_t k = i < len ? lmx_tokutf8_next((const unsigned char *)s + i, len - i, &cp) : 1;
        k = k ? k : 1;
        int c = lmx_tokuni_is_whitespace(cp) ? 0 : split_only || lmx_tokuni_is_word(cp) ? 1 : 2;
        if (i == len || c != cls) {
            if (cls && piece_add(out, base + start, i - start, origin && start == 0))
                return -1;
            start = i;
            cls = c;
        }
        i += k;
    }
    return 0;
}

static int put_bytes_mapped(lmx_tokbuf *b, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (lmx_tokbuf_putcp(b, lmx_tokbyte_char((unsigned char)s[i])))
            return -1;
    return 0;
}

/* Appends a rewritten copy of the piece to the arena: a prefix, then the text
 * with character `from` replaced by `to` (from == 0: unchanged). */
static int rewrite(lmx_tokpieces *ps, lmx_tokpiece *pc, const char *prefix, size_t plen,
                   char from, uint32_t to)
{
    size_t off = ps->arena.n;
    if (lmx_tokbuf_reserve(&ps->arena, plen + pc->len * 3 + 4) ||
        lmx_tokbuf_put(&ps->arena, prefix, plen))
        return -1;
    for (size_t i = 0; i < pc->len; i++) {
        char c = ps->arena.p[pc->off + i];
        if (from && c == from ? lmx_tokbuf_putcp(&ps->arena, to) : lmx_tokbuf_putc(&ps->arena, c))
            return -1;
    }
    pc->off = off;
    pc->len = ps->arena.n - off;
    return 0;
}

static lmx_status run_bytelevel(const lmx_tokpre *p, lmx_tokpieces *ps, lmx_tokpiece pc,
                                lmx_tokspans *sp, lmx_error *err)
{
    if (p->prefix_space && (!pc.len || ps->arena.p[pc.off] != ' ') && rewrite(ps, &pc, " ", 1, 0, 0))
        return lmx_fail(err, LMX_ERR_NOMEM, "pre-tokenize: out of memory");
    if (p->re) {
        lmx_status st = lmx_tokre_find_all(p->re, ps->arena.p + pc.off, pc.len, sp, err);
        if (st != LMX_OK)
            return st;
    } else {
        sp->n = 0;
    }
    /* with the regex: each match is a word (the gaps too, as Isolated keeps them) */
    size_t prev = 0, nsp = p->re ? sp->n : 0;
    for (size_t i = 0; i <= nsp; i++) {
        size_t a = i < nsp ? sp->p[2 * i] : pc.len, b = i < nsp ? sp->p[2 * i + 1] : pc.len;
        size_t cuts[4] = {prev, a, a, b};
        for (int c = 0; c < 4; c += 2) {
            if (cuts[c + 1] <= cuts[c])
                continue;
            size_t off = ps->arena.n;
            if (lmx_tokbuf_reserve(&ps->arena, (cuts[c + 1] - cuts[c]) * 2 + 4) ||
                put_bytes_mapped(&ps->arena, ps->arena.p + pc.off + cuts[c], cuts[c + 1] - cuts[c]) ||
                piece_add(ps, off, ps->arena.n - off, pc.origin && cuts[c] == 0))
                return lmx_fail(err, LMX_ERR_NOMEM, "pre-tokenize: out of memory");
        }
        prev = b;
    }
    return LMX_OK;
}

static lmx_status run_metaspace(const lmx_tokpre *p, lmx_tokpieces *ps, lmx_tokpiece pc, marks *m,
                                lmx_error *err)
{
    char rep[4];
    size_t rlen = lmx_tokutf8_encode(p->repl, rep);
    int starts = pc.len >= rlen && !memcmp(ps->arena.p + pc.off, rep, rlen);
    /* the replaced text starts with the replacement also when it starts with ' ' */
    starts |= pc.len && ps->arena.p[pc.off] == ' ';
    int pre = !starts && (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && pc.origin));
    if (rewrite(ps, &pc, rep, pre ? rlen : 0, ' ', p->repl))
        return lmx_fail(err, LMX_ERR_NOMEM, "pre-tokenize: out of memory");
    if (!p->split)
        return piece_add(ps, pc.off, pc.len, pc.origin) ? lmx_fail(err, LMX_ERR_NOMEM, "pre-tokenize: out of memory") : LMX_OK;
    m->n = 0;
    size_t run = 0;
    int bad = 0;
    const char *s = ps->arena.p + pc.off;
    for (size_t i = 0; i + rlen <= pc.len;) {
        if (!memcmp(s + i, rep, rlen)) {
            if (run < i)
                bad |= mark_add(m, run, i, 0);
            bad |= mark_add(m, i, i + rlen, 1);
            i += rlen;
            run = i;
        } else {
            i++;
        }
    }
    if (run < pc.len)
        bad |= mark_add(m, run, pc.len, 0);
    if (bad || emit_marks(ps, m, B_NEXT, pc.off, pc.origin))
        return lmx_fail(err, LMX_ERR_NOMEM, "pre-tokenize: out of memory");
    return LMX_OK;
}

static lmx_status run_one(const lmx_tokpre *p, lmx_tokpieces *ps, lmx_tokpiece pc, marks *m,
                          lmx_tokspans *sp, lmx_error *err)
{
    const char *s = ps->arena.p + pc.off;
    int bad = 0;
    switch (p->k) {
    case K_SPLIT: {
        lmx_status st = lmx_tokre_find_all(p->re, s, pc.len, sp, err);
        if (st != LMX_OK)
            return st;
        bad = spans_to_marks(sp, pc.len, p->invert, m) || emit_marks(ps, m, p->beh, pc.off, pc.origin);
        break;
    }
    case K_BYTELEVEL: return run_bytelevel(p, ps, pc, sp, err);
    case K_METASPACE: return run_metaspace(p, ps, pc, m, err);
    case K_WHITESPACE: bad = whitespace_words(ps, s, pc.len, pc.off, pc.origin, 0); break;
    case K_WSSPLIT: bad = whitespace_words(ps, s, pc.len, pc.off, pc.origin, 1); break;
    case K_DIGITS:
        bad = char_marks(s, pc.len, lmx_tokuni_is_numeric, m) ||
              emit_marks(ps, m, p->individual ? B_ISOLATED : B_CONTIGUOUS, pc.off, pc.origin);
        break;
    case K_PUNCT:
        bad = char_marks(s, pc.len, is_punct, m) || emit_marks(ps, m, p->beh, pc.off, pc.origin);
        break;
    case K_SEQ: break; /* handled by apply */
    }
    return bad ? lmx_fail(err, LMX_ERR_NOMEM, "pre-tokenize: out of memory") : LMX_OK;
}

static lmx_status apply(const lmx_tokpre *p, lmx_tokpieces *ps, marks *m, lmx_tokspans *sp,
                        lmx_error *err)
{
    if (p->k == K_SEQ) {
        for (int i = 0; i < p->nsub; i++) {
            lmx_status st = apply(p->sub[i], ps, m, sp, err);
            if (st != LMX_OK)
                return st;
        }
        return LMX_OK;
    }
    /* pieces are read from p and written to tmp (through ps->n), then swapped */
    lmx_tokpiece *in = ps->p;
    size_t nin = ps->n;
    ps->p = NULL;
    size_t in_cap = ps->cap;
    ps->n = 0;
    lmx_status st = LMX_OK;
    for (size_t i = 0; st == LMX_OK && i < nin; i++)
        st = run_one(p, ps, in[i], m, sp, err);
    ps->p = ps->tmp;
    ps->cap = ps->tmp_cap;
    ps->tmp = in;
    ps->tmp_cap = in_cap;
    return st;
}

lmx_status lmx_tokpre_run(const lmx_tokpre *p, const char *s, size_t len, int origin,
                          lmx_tokpieces *ps, lmx_error *err)
{
    ps->arena.n = 0;
    ps->n = 0;
    if (lmx_tokbuf_put(&ps->arena, s, len))
        return lmx_fail(err, LMX_ERR_NOMEM, "pre-tokenize: out of memory");
    /* the single input piece goes through tmp like every other result */
    if (piece_add(ps, 0, len, origin))
        return lmx_fail(err, LMX_ERR_NOMEM, "pre-tokenize: out of memory");
    lmx_tokpiece *sw = ps->p;
    size_t swc = ps->cap;
    ps->p = ps->tmp;
    ps->cap = ps->tmp_cap;
    ps->tmp = sw;
    ps->tmp_cap = swc;
    if (!p || !ps->n)
        return LMX_OK;
    marks m = {0};
    lmx_tokspans sp = {0};
    lmx_status st = apply(p, ps, &m, &sp, err);
    free(m.p);
    lmx_tokspans_free(&sp);
    return st;
}
