/* The CPU backend: float32 activations; weights as stored (bf16/f16/f32:
 * copied into huge pages, or read in place from the mmap) or quantized on
 * load (q8/q4), by SIMD kernels picked at run time (cpu_path.h). */
#ifndef LMX_BACKEND_CPU_H
#define LMX_BACKEND_CPU_H

#include <stddef.h>

#include "backend.h"

/* n_threads: 0 = all online cores. quant: 0 = weights as stored, 8 or 4 =
 * quantize every matrix on load (docs/quantization.md). kv_f16: 1 = the KV
 * cache in float16, 0 = float32. mmap_weights: 1 = float weights read in
 * place from the mapping, 0 = weight matrices copied into huge pages where
 * the kernel grants them. prefill_bf16: 1 = prompts' products with bf16
 * weights take x rounded to bf16 where the CPU has AVX-512 BF16, 0 =
 * float32 x (lmx_load_options). */
lmx_backend *lmx_backend_cpu_new(int n_threads, int quant, int kv_f16, int mmap_weights, int prefill_bf16,
                                 lmx_error *err);
/* n_ranks backends that all-reduce with each other (tensor parallelism on
 * one CPU, to check the split: shard.h), n_threads each. */
lmx_status lmx_backend_cpu_new_group(int n_ranks, int n_threads, int quant, int kv_f16, int mmap_weights,
                                     int prefill_bf16, lmx_backend **out, lmx_error *err);
/* Bytes the kernels read for a whole weight tensor (after quantization). */
size_t lmx_backend_cpu_bytes(const lmx_tensor *t);
/* The SIMD path the backend runs ("avx512", "avx2", "scalar"). */
const char *lmx_backend_cpu_path(const lmx_backend *be);
/* What its weight matrices are: "quantized", "huge pages" (float, copied)
 * or "mapped" (float, read in place). */
const char *lmx_backend_cpu_weights(const lmx_backend *be);
/* What prompts' products with bf16 weights take as x: "bf16" (prefill_bf16
 * asked for and the CPU runs it) or "f32". */
const char *lmx_backend_cpu_prefill_x(const lmx_backend *be);
/* Threads of its pool. */
int lmx_backend_cpu_threads(const lmx_backend *be);

#endif
