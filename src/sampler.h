/* sampler: logits -> next token, with the semantics of Hugging Face
 * transformers' logits processors (see docs/sampling.md for the order and
 * the exact rules) and a seeded, portable random generator: the same seed
 * and logits give the same tokens on every machine.
 *
 * A sampler is used by one stream (one thread) at a time; it owns scratch
 * space for vocab_size tokens so that sampling never allocates. */
#ifndef LMX_SAMPLER_H
#define LMX_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "lmx.h"
#include "sample_math.h"
#include "topk.h"

typedef struct {
    float temperature;        /* 0 = greedy (argmax, lowest id on ties) */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off; else in (0, 1) */
    float min_p;              /* 0 = off; else in (0, 1] */
    float repetition_penalty; /* 1 = off; else > 0 */
    uint64_t seed;
} lmx_sampler_params;

typedef struct lmx_sampler lmx_sampler;

/* Validates p (LMX_ERR_ARG naming the parameter: NaN or negative
 * temperature, negative top_k, top_p outside (0,1], min_p outside [0,1],
 * repetition_penalty <= 0 or NaN, non-finite values, vocab_size <= 0).
 * *out is owned by the caller; free with lmx_sampler_free. */
lmx_status lmx_sampler_new(const lmx_sampler_params *p, int vocab_size, lmx_sampler **out,
                           lmx_error *err);
void lmx_sampler_free(lmx_sampler *s);

/* Picks the next token. logits: vocab_size floats (borrowed), processed in
 * place: on return they hold the scores transformers' processors would
 * leave (penalized, divided by the temperature, -inf for removed tokens;
 * greedy: penalized only). history: the tokens so far, prompt included
 * (borrowed; ids outside the vocabulary are ignored), for the repetition
 * penalty. Advances the random state by one draw unless greedy. */
int32_t lmx_sampler_sample(lmx_sampler *s, float *logits, const int32_t *history,
                           size_t n_history);

/* Entries a group a min-p draw without top-k or top-p asks for: it is
 * decided while fewer of each group's tokens are kept. */
enum { LMX_SAMPLER_MIN_P_PER = 32 };

/* Whether s can choose from the best scores alone (greedy, top_k in
 * [1, LMX_TOPK_MAX), or min_p alone; a repetition penalty of 1 or more,
 * which never raises a score): the entries a group to ask a backend's
 * read_topk for (k + 1, k = 1 when greedy, and some room more with a
 * penalty, at most LMX_TOPK_MAX; LMX_SAMPLER_MIN_P_PER for min_p), else 0. */
int lmx_sampler_top_request(const lmx_sampler *s);

/* lmx_sampler_sample's choice from `groups` groups of `per` entries, each
 * the best of a disjoint part of the vocabulary in rank order (topk.h; col
 * -1 pads a short part), their scores unpenalized: the same token from the
 * same logits, history and random state. Returns -1 without drawing when
 * they cannot decide it (a tie at the top-k boundary with a token a group
 * left out, too many of a group's entries pushed down by the penalty, a
 * group whose every entry min_p keeps, or too few finite scores): then
 * sample the whole logits instead. */
int32_t lmx_sampler_sample_top(lmx_sampler *s, const lmx_scored *top, int groups, int per,
                               const int32_t *history, size_t n_history);

/* Whether lmx_sampler_sample needs no more than a temperature and min_p
 * (no top-k, top-p or repetition penalty; not greedy): it then weighs the
 * whole row in a fixed order (sample_math.h), which a backend's read_draw
 * repeats where the logits are, drawing the same token. */
int lmx_sampler_draws_dense(const lmx_sampler *s);

/* The next such draw: s's parameters and a uniform number, which advances
 * the random state as lmx_sampler_sample would. */
lmx_draw lmx_sampler_next_draw(lmx_sampler *s);

/* The distribution lmx_sampler_sample draws from: the same processing,
 * then probs[vocab_size] gets the final probabilities (0 for removed
 * tokens; greedy: 1 at the argmax). Does not touch the random state. */
void lmx_sampler_probs(lmx_sampler *s, float *logits, const int32_t *history, size_t n_history,
                       float *probs);

#endif
