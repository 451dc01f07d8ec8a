/* The CPU backend: float32 activations; weights as stored (bf16/f16/f32:
 * copied into huge pages, or read in place from the mmap) or quantized on
 * load (q8/q4), by SIMD kernels picked at run time (cpu_path.h). */
#ifndef LMX_BACKEND_CPU_H
#define LMX_BACKEND_CPU_H

#include <stddef.h>

#include "backend.h"
#include "lmx.h"

/* A CPU backend with the CPU fields of o (lmx_load_options, lmx.h):
 * n_threads (0 = all online cores), quant, kv_f16, mmap_weights and
 * prefill_bf16; an error naming the field for a value out of range. */
lmx_backend *lmx_backend_cpu_new(const lmx_load_options *o, lmx_error *err);
/* n_ranks backends that all-reduce with each other (tensor parallelism on
 * one CPU, to check the split: shard.h), each as lmx_backend_cpu_new(o). */
lmx_status lmx_backend_cpu_new_group(int n_ranks, const lmx_load_options *o, lmx_backend **out, lmx_error *err);
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
