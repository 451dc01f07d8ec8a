/* The CPU backend's attention: causal, GQA-aware, over a head-major KV
 * cache ([kv head][slot][head_dim], float32 or float16), with an online
 * softmax, memory constant in the context length. */
#ifndef LMX_CPU_ATTENTION_H
#define LMX_CPU_ATTENTION_H

#include <stddef.h>

#include "backend.h"
#include "cpu_kernels.h"
#include "threadpool.h"

/* out = attention of q over the caches kc, vc (cap slots each; f16: their
 * elements are float16) on the pool's threads. */
/* Elements a cache of cols columns must have allocated past its last row:
 * prefill's tiles read up to a tile past a block of keys or values. */
size_t lmx_cpu_attention_slack(const lmx_cpu_kernels *k, int cols);
void lmx_cpu_attention(const lmx_cpu_kernels *k, lmx_pool *pool, float *out, const float *q, const void *kc,
                       const void *vc, int f16, int cap, const lmx_attn_params *p);

#endif
