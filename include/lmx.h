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
    int n_ctx;       /* default context length of new contexts; 0 = model max, capped at 4096 */
    int quant;       /* CPU: quantize weight matrices on load: 0 = as stored, 8 = q8, 4 = q4
                        (group-wise affine, MLX layout; docs/quantization.md) */
    int device;      /* LMX_DEVICE_*: where the weights live and the forward pass runs */
    int n_gpus;      /* tensor parallelism over this many ranks, one thread each (0 or 1 =
                        none): CUDA, one GPU per rank (devices 0..n-1, NCCL all-reduce);
                        CPU, ranks sharing the CPU (to check the split; docs/multi-gpu.md) */
    int kv_f16;      /* CPU only: keep the KV cache in float16 (1) instead of float32 (0): half the
                        memory and half the bytes decode reads from it (docs/cpu.md); the CUDA
                        backend always keeps it in bf16 */
    int mmap_weights; /* CPU only: 1 = read float weights in place from the file mapping (quick
                        load, 4 KB pages); 0 = copy weight matrices into transparent huge pages
                        where the kernel grants them (slower load, faster decode; docs/cpu.md) */
    int prefill_bf16; /* CPU only: 1 = in prompts, round activations to bfloat16 before products with
                        bf16 weights, for AVX-512 BF16 dot products at twice the float32 rate; logits
                        move ~1e-2 relative (as llama.cpp's and the CUDA backend's); 0 = float32
                        activations (exact to the fixtures). No effect on CPUs without AVX512_BF16
                        or on other weight types (docs/cpu.md) */
} lmx_load_options;

/* lmx_load_options.device. AUTO: the environment variable LMX_DEVICE ("cpu"
 * or "cuda") if set, else CUDA when lmx was built with it and a GPU is
 * present, else the CPU. CUDA fails to load when unavailable (docs/cuda.md). */
enum { LMX_DEVICE_AUTO = 0, LMX_DEVICE_CPU = 1, LMX_DEVICE_CUDA = 2 };

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
/* As lmx_context_eval, giving only *next: the id of the last position's
 * largest logit (greedy decoding: the lowest id among equal ones, NaN never
 * chosen). On a GPU only that id comes back to the host. */
lmx_status lmx_context_eval_argmax(lmx_context *c, const int32_t *ids, int n, int32_t *next, lmx_error *err);

/* ---- text generation ------------------------------------------------------ */

/* One chat message. role: "system", "user" or "assistant" (and "tool" for
 * Qwen3; others are an error); content: UTF-8 text. Both borrowed. */
typedef struct lmx_message {
    const char *role;
    const char *content;
} lmx_message;

typedef struct lmx_gen_config {
    int max_tokens;           /* tokens to generate at most; 0 = until EOS or a full context */
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off; in (0, 1] */
    float min_p;              /* 0 = off; in [0, 1] */
    float repetition_penalty; /* 1 = off; > 0 */
    uint64_t seed;            /* same seed, same tokens */
    const int32_t *stop_tokens; /* borrowed; generation stops before emitting any of them */
    int n_stop_tokens;
    const char *const *stop_strings; /* borrowed; nothing from a stop string on is emitted */
    int n_stop_strings;
    int ignore_eos;           /* keep going past EOS tokens */
    int enable_thinking;      /* chat, Qwen3: 0 renders the empty think block */
    int add_special;          /* generate(): add the tokenizer's special tokens (Gemma's <bos>) */
    int n_ctx;                /* context for the stream; 0 = the model's load option */
    double timeout_s;         /* 0 = none; else the stream ends "cancelled" after this long */
} lmx_gen_config;

/* Defaults: sampling parameters from generation_config.json (greedy where
 * it does not sample), max_tokens 0, seed 0, enable_thinking 1,
 * add_special 1. */
lmx_gen_config lmx_gen_defaults(const lmx_model *m);

typedef enum lmx_stop_reason {
    LMX_STOP_NONE = 0,      /* still running */
    LMX_STOP_EOS,           /* an end-of-sequence token */
    LMX_STOP_TOKEN,         /* one of cfg.stop_tokens */
    LMX_STOP_STRING,        /* one of cfg.stop_strings */
    LMX_STOP_MAX_TOKENS,
    LMX_STOP_CONTEXT_FULL,
    LMX_STOP_CANCELLED,     /* lmx_stream_cancel or the timeout */
    LMX_STOP_ERROR          /* see lmx_stream_error */
} lmx_stop_reason;

const char *lmx_stop_reason_name(lmx_stop_reason r); /* "eos", "stop_token", ... */

typedef struct lmx_token {
    int32_t id;
    const char *text; /* text now complete, "" while held back; valid until the next call */
    size_t len;
} lmx_token;

typedef struct lmx_stats {
    int prompt_tokens;      /* tokens in the prompt */
    int cached_tokens;      /* of those, reused from a session's cache */
    int generated_tokens;
    double ttft_s;          /* stream start to the first token */
    double prefill_tok_s;   /* prompt tokens evaluated per second */
    double decode_tok_s;    /* generated tokens per second after the first */
    double peak_rss_mb;     /* process peak resident memory */
} lmx_stats;

typedef struct lmx_stream lmx_stream;

/* Start a stream. They never return NULL unless memory is exhausted: an
 * invalid argument gives a stream that ends at once with LMX_STOP_ERROR and
 * a message. The prompt is prefilled on the first lmx_stream_next. */
lmx_stream *lmx_generate(lmx_model *m, const char *prompt, const lmx_gen_config *cfg);
lmx_stream *lmx_generate_ids(lmx_model *m, const int32_t *ids, int n, const lmx_gen_config *cfg);
lmx_stream *lmx_chat(lmx_model *m, const lmx_message *msgs, int n, const lmx_gen_config *cfg);

/* Pull the next token; returns 1 with *t filled, or 0 when the stream has
 * ended (see lmx_stream_stop_reason). */
int lmx_stream_next(lmx_stream *s, lmx_token *t);
/* Callback form: calls on_token for every token until the stream ends or the
 * callback returns non-zero (which cancels it). Returns the stop reason. */
lmx_stop_reason lmx_stream_run(lmx_stream *s, int (*on_token)(void *user, const lmx_token *t),
                               void *user);
/* Ask the stream to stop; safe from another thread or a signal handler.
 * Checked between tokens and between prefill chunks. */
void lmx_stream_cancel(lmx_stream *s);
lmx_stop_reason lmx_stream_stop_reason(const lmx_stream *s);
/* NULL unless the stream ended with LMX_STOP_ERROR. */
const char *lmx_stream_error(const lmx_stream *s);
lmx_status lmx_stream_status(const lmx_stream *s);
void lmx_stream_stats(const lmx_stream *s, lmx_stats *out);
void lmx_stream_close(lmx_stream *s);

/* ---- sessions: multi-turn chat that keeps its KV cache ------------------- */

/* A session reuses its cache across calls: each call prefills only the
 * tokens after the longest prefix it shares with what the cache holds, and
 * gives exactly what the same call would give from scratch. One stream at
 * a time per session; the stream must be closed before the next call. */
typedef struct lmx_session lmx_session;

lmx_session *lmx_session_new(lmx_model *m, int n_ctx, lmx_error *err);
void lmx_session_free(lmx_session *s);
lmx_stream *lmx_session_chat(lmx_session *s, const lmx_message *msgs, int n, const lmx_gen_config *cfg);
lmx_stream *lmx_session_generate_ids(lmx_session *s, const int32_t *ids, int n,
                                     const lmx_gen_config *cfg);

/* ---- tokenizer access ----------------------------------------------------- */

/* Encodes text with the model's tokenizer (special-token strings matched,
 * special tokens added as the tokenizer does when add_special != 0).
 * *ids is malloc'd (caller frees). */
lmx_status lmx_tokenize(const lmx_model *m, const char *text, int add_special, int32_t **ids, int *n,
                        lmx_error *err);
/* Renders a chat as the checkpoint's template does (malloc'd, caller frees). */
lmx_status lmx_chat_template(const lmx_model *m, const lmx_message *msgs, int n,
                             int add_generation_prompt, int enable_thinking, char **text,
                             lmx_error *err);

#ifdef __cplusplus
}
#endif
#endif
