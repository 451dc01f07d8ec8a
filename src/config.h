/* config.json / generation_config.json -> one plain struct of
 * hyper-parameters and per-layer traits. Knows nothing of tensors. */
#ifndef LMX_CONFIG_H
#define LMX_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "lmx.h"

typedef enum { LMX_FAMILY_QWEN3, LMX_FAMILY_GEMMA3 } lmx_family;
typedef enum { LMX_ACT_SILU, LMX_ACT_GELU_TANH } lmx_activation;

/* RoPE of one layer type: angle = position * inv_freq[i] / factor with
 * inv_freq[i] = theta^(-2i/rotary_dim) (rope_type "default" or "linear"). */
typedef struct lmx_rope {
    float theta;
    float factor; /* linear scaling factor; 1 for "default" */
} lmx_rope;

typedef struct lmx_layer_config {
    int window;      /* sliding-window size in tokens; 0 = global attention */
    lmx_rope rope;
} lmx_layer_config;

typedef struct lmx_generation_defaults {
    float temperature; /* 1 when unset; generation_config's do_sample=false means greedy (0) */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    float repetition_penalty; /* 1 = off */
} lmx_generation_defaults;

#define LMX_MAX_EOS 8
#define LMX_MAX_HEAD_DIM 1024

typedef struct lmx_config {
    char model_type[32];     /* as in config.json: "qwen3", "gemma3_text", "gemma3" */
    const char *family_name; /* "qwen3" or "gemma3" */
    lmx_family family;

    int vocab_size, hidden_size, intermediate_size;
    int n_layers, n_heads, n_kv_heads, head_dim;
    int max_position;
    float rms_eps;

    /* family traits */
    int norm_plus_one;       /* RMSNorm scales by (1 + w) rather than w */
    int sandwich_norms;      /* extra norms after attention and after the MLP */
    lmx_activation act;
    float embed_scale;       /* embeddings multiplied by this (1 = none) */
    float attn_scale;        /* scores multiplied by this */
    float attn_softcap;      /* 0 = none */
    float final_softcap;     /* 0 = none */
    int tied_embeddings;
    int text_in_multimodal;  /* weights of a Gemma3ForConditionalGeneration */

    lmx_layer_config *layers; /* n_layers entries, owned */

    int32_t bos_id;          /* -1 if unknown */
    int32_t eos_ids[LMX_MAX_EOS];
    int n_eos;
    lmx_generation_defaults gen;
} lmx_config;

/* Parses config.json text (and generation_config.json text, or NULL).
 * `what` names the file in messages. On failure *cfg holds nothing to free. */
lmx_status lmx_config_parse(const char *config_json, size_t len, const char *gen_json,
                            size_t gen_len, const char *what, lmx_config *cfg, lmx_error *err);
/* Reads dir/config.json and dir/generation_config.json (if present). */
lmx_status lmx_config_load(const char *dir, lmx_config *cfg, lmx_error *err);
void lmx_config_free(lmx_config *cfg);

/* The model types lmx runs, comma-separated, for messages. */
const char *lmx_config_supported_types(void);

#endif
