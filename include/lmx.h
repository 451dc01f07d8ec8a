/* lmx: run Hugging Face checkpoints (Qwen3, Gemma3) from C.
 *
 * The only public header. Every function that can fail reports through an
 * lmx_error the caller owns (may be NULL when the caller does not care);
 * nothing is printed from inside the library. Ownership: every object
 * returned by an lmx_*_new/lmx_load call is freed by its matching
 * lmx_*_free/lmx_close call and by nothing else. */
#ifndef LMX_H
#define LMX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lmx_status {
    LMX_OK = 0,
    LMX_ERR_IO,          /* a file is missing or unreadable */
    LMX_ERR_FORMAT,      /* a file is malformed (JSON, safetensors, tokenizer) */
    LMX_ERR_UNSUPPORTED, /* well-formed but not something lmx runs */
    LMX_ERR_ARG,         /* an argument is NULL, out of range or absurd */
    LMX_ERR_NOMEM,       /* an allocation failed */
    LMX_ERR_RANGE,       /* a token id or position outside the model's limits */
    LMX_ERR_CANCELLED,   /* stopped by the caller */
    LMX_ERR_INTERNAL
} lmx_status;

typedef struct lmx_error {
    lmx_status code;
    char message[512]; /* names the file, tensor, field or argument at fault */
} lmx_error;

/* A short constant name for a status ("ok", "io", "format", ...). */
const char *lmx_status_name(lmx_status code);

/* ---- loading ------------------------------------------------------------ */

typedef struct lmx_model lmx_model;

typedef struct lmx_load_options {
    int n_threads;   /* worker threads for the CPU backend; 0 = all cores */
    int n_ctx;       /* default context length of new contexts; 0 = model max, capped at 8192 */
} lmx_load_options;

lmx_load_options lmx_load_defaults(void);

/* Loads a Hugging Face checkpoint directory (config.json + *.safetensors).
 * Returns NULL and fills *err on failure. */
lmx_model *lmx_load(const char *dir, const lmx_load_options *opts, lmx_error *err);
void lmx_close(lmx_model *m);

const char *lmx_model_type(const lmx_model *m); /* "qwen3", "gemma3" */
int lmx_model_vocab_size(const lmx_model *m);
int lmx_model_max_context(const lmx_model *m);
/* A human-readable description of the resolved model: family, shapes,
 * per-layer attention type, window and RoPE, dtypes, parameters, bytes.
 * Malloc'd; the caller frees it. NULL on allocation failure. */
char *lmx_model_describe(const lmx_model *m);

/* ---- low-level evaluation ----------------------------------------------- */

/* A context owns one KV cache: the tokens evaluated so far. */
typedef struct lmx_context lmx_context;

/* n_ctx: positions the context can hold; 0 = the load option's default. */
lmx_context *lmx_context_new(lmx_model *m, int n_ctx, lmx_error *err);
void lmx_context_free(lmx_context *c);
int lmx_context_length(const lmx_context *c); /* tokens evaluated so far */
int lmx_context_capacity(const lmx_context *c);
/* Forgets every token after the first n (n <= length); cheap. */
lmx_status lmx_context_truncate(lmx_context *c, int n, lmx_error *err);

/* Appends n tokens and runs them through the model.
 * logits: NULL, or room for the logits the call asks for (float32):
 *   all_positions != 0: n * vocab_size floats, row i predicts token i+1;
 *   all_positions == 0: vocab_size floats, the last position's logits. */
lmx_status lmx_context_eval(lmx_context *c, const int32_t *ids, int n, float *logits,
                            int all_positions, lmx_error *err);

/* ---- chat ----------------------------------------------------------------- */

/* One chat message. role: "system", "user" or "assistant" (others are an
 * error); content: UTF-8 text. Both borrowed from the caller. */
typedef struct lmx_message {
    const char *role;
    const char *content;
} lmx_message;

#ifdef __cplusplus
}
#endif
#endif
