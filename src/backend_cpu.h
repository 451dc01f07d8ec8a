/* The CPU backend: float32 activations; weights read in place from the
 * mmap (bf16/f16/f32) or quantized on load (q8/q4), by SIMD kernels picked
 * at run time (cpu_path.h). */
#ifndef LMX_BACKEND_CPU_H
#define LMX_BACKEND_CPU_H

#include <stddef.h>

#include "backend.h"

/* n_threads: 0 = all online cores. quant: 0 = weights as stored, 8 or 4 =
 * quantize every matrix on load (docs/quantization.md). kv_f16: 1 = the KV
 * cache in float16, 0 = float32. */
lmx_backend *lmx_backend_cpu_new(int n_threads, int quant, int kv_f16, lmx_error *err);
/* n_ranks backends that all-reduce with each other (tensor parallelism on
 * one CPU, to check the split: shard.h), n_threads each. */
lmx_status lmx_backend_cpu_new_group(int n_ranks, int n_threads, int quant, int kv_f16, lmx_backend **out,
                                     lmx_error *err);
/* Bytes the kernels read for a whole weight tensor (after quantization). */
size_t lmx_backend_cpu_bytes(const lmx_tensor *t);
/* The SIMD path the backend runs ("avx512", "avx2", "scalar"). */
const char *lmx_backend_cpu_path(const lmx_backend *be);
/* Threads of its pool. */
int lmx_backend_cpu_threads(const lmx_backend *be);

#endif
