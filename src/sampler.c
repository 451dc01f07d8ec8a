/* Sampling with transformers' logits-processor semantics; docs/sampling.md
 * states the rules this file implements. */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "argmax.h"
#include "error.h"
#include "sample_math.h"

/* Portable bits: gcc in ISO C mode never fuses a*b+c into one rounding,
 * and sample_math.h turns clang's fusing off for the rest of this file. */

/* The pass over the whole row (process) is built for AVX-512, AVX2 and
 * baseline x86-64, the best the machine has picked when the program loads;
 * its helpers are inlined into each build (INLINE_PASS), so that their
 * loops vectorize at that width. The same IEEE steps in each, never fused
 * (above), so the same bits and draws; 2.6 times as fast at T 1 on the
 * development machine's AVX-512 (bench/RESULTS.md, session 40). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PASS_BUILDS __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PASS_BUILDS
#endif
#define INLINE_PASS inline __attribute__((always_inline))

typedef struct {
    float s;    /* processed score */
    int32_t id; /* token */
    float e;    /* exp(s - max score): probability relative to the top token's */
} cand;

enum { MAXB = 64 };   /* tokens per block maximum (kth_largest) */
/* Entries a group beyond k + 1 when a repetition penalty may push some of
 * its best below the rest (lmx_sampler_top_request): a group then decides
 * while at most this many of its entries are in the history. */
enum { TOP_PENALTY_ROOM = 16 };

struct lmx_sampler {
    lmx_sampler_params p;
    int vocab;
    uint64_t rng[4]; /* xoshiro256** state */
    uint8_t *seen;   /* [vocab] marks for the repetition penalty, all 0 between calls */
    cand *c;         /* [vocab] candidates; the kept ones end up in c[0..n_kept) */
    float *e;        /* [vocab] exp(score - max score), see kept_set */
    double *block;   /* [vocab / LMX_SAMPLE_BLOCK rounded up] sums of e, see kept_set */
    float *bmax;     /* [vocab / MAXB rounded up] block maxima of the scores */
};

/* ---- random numbers: splitmix64 seeds xoshiro256** -------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t *st) {
    uint64_t out = rotl(st[1] * 5, 7) * 9, t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl(st[3], 45);
    return out;
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(uint64_t *st) { return (double)(next_u64(st) >> 11) * 0x1.0p-53; }

/* ---- construction ------------------------------------------------------- */

lmx_status lmx_sampler_new(const lmx_sampler_params *p, int vocab_size, lmx_sampler **out,
                           lmx_error *err) {
    if (!out)
        return lmx_fail(err, LMX_ERR_ARG, "sampler: out is NULL");
    *out = NULL;
    if (!p)
        return lmx_fail(err, LMX_ERR_ARG, "sampler: params is NULL");
    if (vocab_size <= 0)
        return lmx_fail(err, LMX_ERR_ARG, "sampler: vocab_size %d must be positive", vocab_size);
    /* Written so that NaN fails every test. */
    if (!(p->temperature >= 0 && isfinite(p->temperature)))
        return lmx_fail(err, LMX_ERR_ARG, "sampler: temperature %g must be finite and >= 0",
                        (double)p->temperature);
    if (p->top_k < 0)
        return lmx_fail(err, LMX_ERR_ARG, "sampler: top_k %d must be >= 0 (0 = off)", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return lmx_fail(err, LMX_ERR_ARG, "sampler: top_p %g must be in (0, 1] (1 = off)",
                        (double)p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return lmx_fail(err, LMX_ERR_ARG, "sampler: min_p %g must be in [0, 1] (0 = off)",
                        (double)p->min_p);
    if (!(p->repetition_penalty > 0 && isfinite(p->repetition_penalty)))
        return lmx_fail(err, LMX_ERR_ARG,
                        "sampler: repetition_penalty %g must be finite and > 0 (1 = off)",
                        (double)p->repetition_penalty);

    lmx_sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->seen = calloc((size_t)vocab_size, 1);
        s->c = malloc((size_t)vocab_size * sizeof *s->c);
        s->e = malloc((size_t)vocab_size * sizeof *s->e);
        s->block = malloc(((size_t)vocab_size / LMX_SAMPLE_BLOCK + 1) * sizeof *s->block);
        s->bmax = malloc(((size_t)vocab_size / MAXB + 1) * sizeof *s->bmax);
    }
    if (!s || !s->seen || !s->c || !s->e || !s->block || !s->bmax) {
        lmx_sampler_free(s);
        return lmx_fail(err, LMX_ERR_NOMEM, "sampler: no memory for a vocabulary of %d",
                        vocab_size);
    }
    s->p = *p;
    s->vocab = vocab_size;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
    *out = s;
    return LMX_OK;
}

void lmx_sampler_free(lmx_sampler *s) {
    if (!s)
        return;
    free(s->seen);
    free(s->c);
    free(s->e);
    free(s->block);
    free(s->bmax);
    free(s);
}

/* ---- processing ----------------------------------------------------------- */

/* RepetitionPenaltyLogitsProcessor's rule for one score of a token in the
 * history: positive scores divided by the penalty, negative ones multiplied. */
static inline float penalized(float x, float pen) { return x < 0 ? x * pen : x / pen; }

/* Sets the seen marks of the history's tokens in the vocabulary to v. */
static void mark_history(lmx_sampler *s, const int32_t *h, size_t n, uint8_t v) {
    for (size_t i = 0; i < n; i++)
        if (h[i] >= 0 && h[i] < s->vocab)
            s->seen[h[i]] = v;
}

/* The penalty on every distinct token of the history, once. */
static void penalize(lmx_sampler *s, float *x, const int32_t *h, size_t n) {
    float pen = s->p.repetition_penalty;
    if (pen == 1.0f || !h)
        return;
    for (size_t i = 0; i < n; i++) {
        int32_t t = h[i];
        if (t < 0 || t >= s->vocab || s->seen[t])
            continue;
        s->seen[t] = 1;
        x[t] = penalized(x[t], pen);
    }
    mark_history(s, h, n, 0);
}

/* The order transformers' top-p sees: higher score first; among equal
 * scores the higher id first, which is what its ascending stable sort,
 * trimmed from the bottom, keeps. A strict total order. */
static int ranks_before(const cand *a, const cand *b) {
    return (a->s > b->s) | ((a->s == b->s) & (a->id > b->id)); /* no branches */
}

static void swap(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Partitions c[lo..hi) (non-empty) around a median-of-three pivot; returns
 * the pivot's index m: c[lo..m) rank before it, c(m..hi) after it.
 * *left_mass gets the sum of e over c[lo..m). */
static size_t partition(cand *c, size_t lo, size_t hi, double *left_mass) {
    size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (ranks_before(&c[mid], &c[lo]))
        swap(&c[mid], &c[lo]);
    if (ranks_before(&c[last], &c[lo]))
        swap(&c[last], &c[lo]);
    if (ranks_before(&c[mid], &c[last]))
        swap(&c[mid], &c[last]); /* c[last] is now the median of the three */
    const cand pivot = c[last];
    size_t m = lo;
    double mass = 0;
    for (size_t i = lo; i < last; i++) {
        /* Branch-free (the outcome is a coin flip): always swap, advance m
         * only past an element that ranks before the pivot. */
        const cand t = c[i];
        const int before = ranks_before(&t, &pivot);
        c[i] = c[m];
        c[m] = t;
        m += (size_t)before;
        mass += before ? t.e : 0.0f;
    }
    swap(&c[m], &c[last]);
    *left_mass = mass;
    return m;
}

/* Reorders c[0..n) and returns r so that c[0..r) are the tokens whose
 * probability mass ranked above them is < want: the smallest prefix in rank
 * order whose mass reaches want. Partitions by rank, tracking mass, instead of
 * sorting: expected O(n). */
static size_t select_nucleus(cand *c, size_t n, double want) {
    size_t lo = 0, hi = n;
    double above = 0; /* mass of c[0..lo), all of which rank before c[lo..hi) */
    while (lo < hi) {
        double left;
        size_t m = partition(c, lo, hi, &left);
        if (above + left >= want) {
            hi = m; /* the pivot and all after it are cut */
        } else {
            above += left + c[m].e;
            lo = m + 1;
        }
    }
    return lo;
}

/* Offers v to a min-heap of the k largest so far, heap[0..*size). */
static inline __attribute__((always_inline)) void heap_offer(float *heap, size_t *size, size_t k, float v) {
    if (*size == k && !(v > heap[0]))
        return; /* one comparison for most tokens */
    size_t at;
    if (*size < k) { /* grow: sift up from the end */
        at = (*size)++;
        while (at > 0 && heap[(at - 1) / 2] > v) {
            heap[at] = heap[(at - 1) / 2];
            at = (at - 1) / 2;
        }
    } else { /* replace the minimum: sift down from the root */
        at = 0;
        for (;;) {
            size_t child = 2 * at + 1;
            if (child >= k)
                break;
            if (child + 1 < k && heap[child + 1] < heap[child])
                child++;
            if (!(heap[child] < v))
                break;
            heap[at] = heap[child];
            at = child;
        }
    }
    heap[at] = v;
}

/* bmax[b] = the largest of x's block b of MAXB (the last one shorter);
 * returns the largest of all. x holds no NaN. */
static INLINE_PASS float block_maxima(const float *x, int n, float *bmax) {
    float top = -INFINITY;
    for (int b = 0; b * MAXB < n; b++) {
        int len = n - b * MAXB < MAXB ? n - b * MAXB : MAXB;
        bmax[b] = lmx_largest(x + (size_t)b * MAXB, len);
        top = bmax[b] > top ? bmax[b] : top;
    }
    return top;
}

/* The k-th largest value of x[0..n) (duplicates counted), 0 < k <= n, from
 * a min-heap of k. With k blocks or more, the k-th largest block maximum is
 * a lower bound (k tokens reach it), so only blocks whose maximum reaches it
 * are read: for top-k's usual k, a few dozen blocks, not the vocabulary. */
static float kth_largest(const float *x, int n, const float *bmax, size_t k, float *heap) {
    size_t size = 0, nb = ((size_t)n + MAXB - 1) / MAXB;
    if (k > nb) {
        for (int i = 0; i < n; i++)
            heap_offer(heap, &size, k, x[i]);
        return heap[0];
    }
    for (size_t b = 0; b < nb; b++)
        heap_offer(heap, &size, k, bmax[b]);
    float bound = heap[0];
    size = 0;
    for (size_t b = 0; b < nb; b++)
        for (size_t i = b * MAXB; bmax[b] >= bound && i < (size_t)n && i < (b + 1) * MAXB; i++)
            heap_offer(heap, &size, k, x[i]);
    return heap[0];
}

/* Sum of e[0..n) in a fixed order, with independent partial sums so that the
 * additions overlap (the order, hence the result, is the same everywhere). */
static INLINE_PASS double sum_block(const float *e, size_t n) {
    double part[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            part[j] += e[i + j];
    for (; i < n; i++)
        part[0] += e[i];
    return lmx_sum8(part);
}

/* Tokens in block b of the dense layout (kept_set). */
static size_t block_len(const lmx_sampler *s, size_t b) {
    size_t lo = b * LMX_SAMPLE_BLOCK;
    return (size_t)s->vocab - lo < LMX_SAMPLE_BLOCK ? (size_t)s->vocab - lo : LMX_SAMPLE_BLOCK;
}

/* The kept tokens and their weights (probability relative to the top
 * token's), in one of two layouts. dense: token i has weight e[i] (0 when
 * removed), in blocks of LMX_SAMPLE_BLOCK whose sums are block[]; used when no top-k or
 * top-p applies, which saves gathering the vocabulary. Otherwise c[0..n). */
typedef struct {
    int dense;
    size_t n;
    double total; /* sum of the weights */
} kept_set;

/* The last filters, on the candidates c[0..n) that top-k kept (top_k set)
 * or that top-p alone may keep (z_all: the mass of every token).
 * TopPLogitsWarper: in rank order, a token stays while the probability
 * ranked above it is < top_p. MinPLogitsWarper: a token goes if its
 * probability is below min_p times the top one's (e is that ratio
 * already); the top token always stays. */
static kept_set narrow(lmx_sampler *s, size_t n, int top_k, double z_all) {
    const lmx_sampler_params *p = &s->p;
    cand *c = s->c;
    if (p->top_p < 1.0f) {
        if (top_k) {
            z_all = 0;
            for (size_t i = 0; i < n; i++)
                z_all += c[i].e;
        }
        n = select_nucleus(c, n, (double)p->top_p * z_all);
    }
    if (p->min_p > 0) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (c[i].e >= p->min_p)
                c[m++] = c[i];
        n = m;
    }
    double total = 0;
    for (size_t i = 0; i < n; i++)
        total += c[i].e;
    return (kept_set){0, n, total};
}

PASS_BUILDS static kept_set process(lmx_sampler *s, float *x) {
    const lmx_sampler_params *p = &s->p;
    const int V = s->vocab;
    cand *c = s->c;
    float *e = s->e;

    /* Each its own loop, so that each vectorizes. */
    const float t = p->temperature;
    for (int i = 0; i < V; i++)
        x[i] = lmx_warped(x[i], t);
    uint32_t n_finite = 0;
    for (int i = 0; i < V; i++)
        n_finite += x[i] > -INFINITY;
    float smax = block_maxima(x, V, s->bmax);
    if (n_finite == 0) { /* nothing can be drawn: fall back to the argmax, token 0 */
        c[0] = (cand){x[0], 0, 1};
        return (kept_set){0, 1, 1};
    }

    const int top_k = p->top_k > 0 && (size_t)p->top_k < n_finite;
    if (!top_k && p->top_p >= 1.0f) {
        /* Dense: the relative probabilities of all tokens (-inf gives 0), in
         * a loop that vectorizes; MinPLogitsWarper (see below) in place. */
        for (int i = 0; i < V; i++)
            e[i] = lmx_exp_nonpos(x[i] - smax);
        if (p->min_p > 0) {
            /* On the bits, as lmx_exp_nonpos does, so that gcc vectorizes it
             * rather than branching on every token (on flat rows such a
             * branch mispredicts often: 0.5 ms of 0.77 for a 151936-token
             * row, session 39). Weights are >= 0, whose bits order as the
             * floats do; -inf's bits are 0xFF800000. */
            uint32_t mb;
            memcpy(&mb, &p->min_p, sizeof mb);
            for (int i = 0; i < V; i++) {
                uint32_t eb, xb;
                memcpy(&eb, e + i, sizeof eb);
                memcpy(&xb, x + i, sizeof xb);
                uint32_t keep = 0u - (uint32_t)(eb >= mb);
                eb &= keep;
                xb = (xb & keep) | (0xFF800000u & ~keep);
                memcpy(e + i, &eb, sizeof eb);
                memcpy(x + i, &xb, sizeof xb);
            }
        }
        double total = 0;
        for (size_t b = 0; b * LMX_SAMPLE_BLOCK < (size_t)V; b++) {
            s->block[b] = sum_block(e + b * LMX_SAMPLE_BLOCK, block_len(s, b));
            total += s->block[b];
        }
        return (kept_set){1, (size_t)V, total};
    }

    /* TopKLogitsWarper: keep every score >= the k-th largest (ties at the
     * boundary all stay). */
    size_t n = 0;
    double z_all = 0; /* mass of every token top-k left */
    if (top_k) {
        float kth = kth_largest(x, V, s->bmax, (size_t)p->top_k, e);
        for (int b = 0; b * MAXB < V; b++) /* only blocks that reach kth hold kept tokens */
            for (int i = b * MAXB; s->bmax[b] >= kth && i < V && i < (b + 1) * MAXB; i++)
                if (x[i] >= kth)
                    c[n++] = (cand){x[i], i, lmx_exp_nonpos(x[i] - smax)};
    } else {
        /* Top-p alone. The nucleus is a prefix in rank order; tokens more
         * than 20 below the top weigh < e^-19 each, so when the others are
         * sure to hold top_p of the mass (margin for rounding), only they
         * are gathered: usually a few thousand tokens, not the vocabulary. */
        for (int i = 0; i < V; i++)
            e[i] = lmx_exp_nonpos(x[i] - smax);
        double total = sum_block(e, (size_t)V);
        float floor_s = total - V * 5.6027964e-9 >= (double)p->top_p * total * (1 + 1e-6)
                            ? smax - 20
                            : -INFINITY;
        for (int i = 0; i < V; i++) { /* branch-free gather */
            c[n] = (cand){x[i], i, e[i]};
            n += (size_t)((x[i] > -INFINITY) & (x[i] >= floor_s));
        }
        z_all = total;
    }

    kept_set k = narrow(s, n, top_k, z_all);

    /* Leave the scores as transformers' processors would: -inf where removed. */
    if (k.n < n_finite) {
        for (int i = 0; i < V; i++)
            x[i] = -INFINITY;
        for (size_t i = 0; i < k.n; i++)
            x[c[i].id] = c[i].s;
    }
    return k;
}

/* Inverse CDF: the first kept token whose cumulative weight exceeds target
 * (target < total), dense tokens in id order, gathered ones in the order
 * process() left them. */
static int32_t draw(const lmx_sampler *s, kept_set k, double target) {
    if (k.dense) {
        double acc = 0;
        for (size_t b = 0;; b++) {
            size_t lo = b * LMX_SAMPLE_BLOCK, hi = lo + block_len(s, b);
            /* acc + block[b] repeats process()'s sum for total exactly, so
             * the last block is never passed over */
            if (hi < (size_t)s->vocab && !(target < acc + s->block[b])) {
                acc += s->block[b];
                continue;
            }
            size_t last = lo;
            for (size_t i = lo; i < hi; i++) {
                if (s->e[i] > 0)
                    last = i; /* rounding fallback: the block's last drawable token */
                acc += s->e[i];
                if (target < acc)
                    return (int32_t)i;
            }
            return (int32_t)last;
        }
    }
    double acc = 0;
    int32_t last = s->c[0].id;
    for (size_t i = 0; i < k.n; i++) {
        if (s->c[i].e > 0)
            last = s->c[i].id;
        acc += s->c[i].e;
        if (target < acc)
            return s->c[i].id;
    }
    return last;
}

int32_t lmx_sampler_sample(lmx_sampler *s, float *logits, const int32_t *history,
                           size_t n_history) {
    penalize(s, logits, history, n_history);
    if (s->p.temperature == 0)
        return lmx_argmax(logits, s->vocab);
    kept_set k = process(s, logits);
    return draw(s, k, next_unit(s->rng) * k.total);
}

void lmx_sampler_probs(lmx_sampler *s, float *logits, const int32_t *history, size_t n_history,
                       float *probs) {
    penalize(s, logits, history, n_history);
    memset(probs, 0, (size_t)s->vocab * sizeof *probs);
    if (s->p.temperature == 0) {
        probs[lmx_argmax(logits, s->vocab)] = 1;
        return;
    }
    kept_set k = process(s, logits);
    if (k.dense) {
        for (int i = 0; i < s->vocab; i++)
            probs[i] = (float)(s->e[i] / k.total);
        return;
    }
    for (size_t i = 0; i < k.n; i++)
        probs[s->c[i].id] = (float)(s->c[i].e / k.total);
}

/* A temperature and neither top-k nor top-p: process() keeps tokens in
 * the dense layout then. */
static int no_rank_filter(const lmx_sampler *s) {
    const lmx_sampler_params *p = &s->p;
    return p->temperature > 0 && (p->top_k == 0 || p->top_k >= s->vocab) && p->top_p >= 1.0f;
}

/* Min-p is the only filter (with a temperature). */
static int min_p_alone(const lmx_sampler *s) { return no_rank_filter(s) && s->p.min_p > 0; }

int lmx_sampler_top_request(const lmx_sampler *s) {
    const lmx_sampler_params *p = &s->p;
    if (p->repetition_penalty < 1.0f) /* it may raise a token a group left out above the rest */
        return 0;
    if (min_p_alone(s)) /* it keeps by weight, not rank: a penalty needs no room */
        return LMX_SAMPLER_MIN_P_PER;
    int k = p->temperature == 0 ? 1 : p->top_k;
    if (k <= 0 || k >= LMX_TOPK_MAX)
        return 0;
    int per = k + 1 + (p->repetition_penalty > 1.0f ? TOP_PENALTY_ROOM : 0);
    return per < LMX_TOPK_MAX ? per : LMX_TOPK_MAX;
}

/* Whether every full group's last entry (unpenalized; warped at t unless
 * greedy) is below bar: then nothing a group left out reaches it. */
static int left_out_below(const lmx_scored *top, int groups, int per, float bar, int greedy, float t) {
    for (int g = 0; g < groups; g++) {
        lmx_scored last = top[(size_t)g * per + per - 1];
        if (last.col >= 0 && !((greedy ? last.score : lmx_warped(last.score, t)) < bar))
            return 0;
    }
    return 1;
}

/* Greedy from the candidates c[0..n) (penalized, not warped): the argmax
 * (lmx_argmax_beats), when it beats every full group's last entry. */
static int32_t top_argmax(const cand *c, size_t n, const lmx_scored *top, int groups, int per) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (lmx_argmax_beats(c[i].s, c[i].id, c[best].s, c[best].id))
            best = i;
    if (n == 0 || c[best].s != c[best].s || !left_out_below(top, groups, per, c[best].s, 1, 0))
        return -1;
    return c[best].id;
}

/* Min-p alone from the candidates c[0..n) (processed; largest smax). A
 * token a full group left out ranks after the group's last entry, so when
 * that entry (unpenalized, warped) weighs under min_p, with room for
 * lmx_exp_nonpos's rounding, nothing left out is kept, and the top token is a
 * candidate. The kept ones then go into the dense layout as process() lays
 * out every token: their blocks' weights (the others' stay 0, as removed
 * tokens' are), block sums by sum_block and their total in block order, so
 * that draw() follows the same sums. */
static int32_t min_p_draw(lmx_sampler *s, size_t n, float smax, const lmx_scored *top, int groups, int per) {
    const float t = s->p.temperature, min_p = s->p.min_p;
    if (!(smax > -INFINITY))
        return -1;
    for (int g = 0; g < groups; g++) {
        lmx_scored last = top[(size_t)g * per + per - 1];
        float v = lmx_warped(last.score, t);
        if (last.col >= 0 && !(v < smax && lmx_exp_nonpos(v - smax) < min_p * (1 - 1e-5f)))
            return -1;
    }
    const size_t V = (size_t)s->vocab, nb = (V + LMX_SAMPLE_BLOCK - 1) / LMX_SAMPLE_BLOCK;
    cand *c = s->c;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        float e = lmx_exp_nonpos(c[i].s - smax); /* 0 for -inf */
        if (e >= min_p)
            c[m++] = (cand){c[i].s, c[i].id, e};
    }
    for (size_t b = 0; b < nb; b++)
        s->block[b] = 0;
    /* clear the blocks that hold a kept token, and the last one, which
     * draw() walks whenever it reaches it */
    for (size_t i = 0; i <= m; i++) {
        size_t b = i < m ? (size_t)c[i].id / LMX_SAMPLE_BLOCK : nb - 1;
        if (s->block[b] == 0) {
            memset(s->e + b * LMX_SAMPLE_BLOCK, 0, block_len(s, b) * sizeof *s->e);
            s->block[b] = 1;
        }
    }
    for (size_t i = 0; i < m; i++)
        s->e[c[i].id] = c[i].e;
    double total = 0;
    for (size_t b = 0; b < nb; b++) {
        if (s->block[b] != 0)
            s->block[b] = sum_block(s->e + b * LMX_SAMPLE_BLOCK, block_len(s, b));
        total += s->block[b];
    }
    kept_set kept = {1, V, total};
    return draw(s, kept, next_unit(s->rng) * kept.total);
}

/* The union of the groups holds the k best tokens (each is among the best
 * of its own group), so its k-th largest processed score is the
 * vocabulary's: neither lmx_warped() nor a penalty of at least 1 raises a
 * score, and a token a group left out ranks after that group's last
 * entry, before or after the penalty. While that entry, unpenalized, warps
 * to less than the k-th, nothing left out would be kept. */
int32_t lmx_sampler_sample_top(lmx_sampler *s, const lmx_scored *top, int groups, int per,
                               const int32_t *history, size_t n_history) {
    const int greedy = s->p.temperature == 0;
    const float t = s->p.temperature, pen = s->p.repetition_penalty;
    const size_t k = greedy ? 1 : (size_t)s->p.top_k;
    const int penalty = pen != 1.0f && history;
    if (penalty)
        mark_history(s, history, n_history, 1);
    cand *c = s->c;
    size_t n = 0, n_finite = 0;
    float smax = -INFINITY;
    for (int g = 0; g < groups; g++)
        for (int j = 0; j < per; j++) {
            lmx_scored e = top[(size_t)g * per + j];
            if (e.col < 0 || e.col >= s->vocab)
                continue;
            float x = penalty && s->seen[e.col] ? penalized(e.score, pen) : e.score;
            float v = greedy ? x : lmx_warped(x, t);
            c[n++] = (cand){v, e.col, 0};
            n_finite += v > -INFINITY;
            smax = v > smax ? v : smax;
        }
    if (penalty)
        mark_history(s, history, n_history, 0);
    if (greedy)
        return top_argmax(c, n, top, groups, per);
    if (min_p_alone(s))
        return min_p_draw(s, n, smax, top, groups, per);
    if (n_finite <= k) /* top-k might not apply */
        return -1;
    size_t size = 0;
    for (size_t i = 0; i < n; i++)
        heap_offer(s->e, &size, k, c[i].s);
    const float kth = s->e[0];
    if (!left_out_below(top, groups, per, kth, 0, t))
        return -1;
    /* the kept ones in id order, as process() gathers them */
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (c[i].s >= kth) {
            cand v = {c[i].s, c[i].id, lmx_exp_nonpos(c[i].s - smax)};
            size_t at = m++;
            for (; at > 0 && c[at - 1].id > v.id; at--)
                c[at] = c[at - 1];
            c[at] = v;
        }
    kept_set kept = narrow(s, m, 1, 0);
    return draw(s, kept, next_unit(s->rng) * kept.total);
}

int lmx_sampler_draws_dense(const lmx_sampler *s) { return no_rank_filter(s) && s->p.repetition_penalty == 1.0f; }

lmx_draw lmx_sampler_next_draw(lmx_sampler *s) {
    return (lmx_draw){s->p.temperature, s->p.min_p, next_unit(s->rng)};
}
