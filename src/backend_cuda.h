/* The CUDA backend (docs/cuda.md): weights uploaded once in their stored
 * dtype (or quantized to q8/q4 on the way), float32 activations on the device, decode steps
 * recorded once as CUDA graphs and replayed, prefill matmuls on tensor
 * cores (cuBLAS). Without LMX_HAVE_CUDA the functions below say so. */
#ifndef LMX_BACKEND_CUDA_H
#define LMX_BACKEND_CUDA_H

#include "backend.h"
#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef LMX_HAVE_CUDA
/* 1 when a CUDA device can be used. Touches the CUDA runtime only when the
 * NVIDIA driver's device node exists, so machines without one pay nothing. */
int lmx_backend_cuda_available(void);
/* A backend on CUDA device `device` that quantizes weight matrices to
 * `quant` bits while uploading them (0 = as stored, 8, 4; quant.h); NULL and
 * *err filled on failure. */
lmx_backend *lmx_backend_cuda_new(int device, int quant, lmx_error *err);
/* Backends on GPUs 0 .. n_ranks - 1 whose all_reduce sums over all of them
 * (NCCL, one communicator per GPU); fails in a build without NCCL. */
lmx_status lmx_backend_cuda_new_group(int n_ranks, int quant, lmx_backend **out, lmx_error *err);
/* Bytes of device memory weight t holds (q8/q4: with its scales and
 * biases): what a decode step reads of it. */
size_t lmx_backend_cuda_bytes(const lmx_tensor *t);
/* GPU `device`'s device-to-device copy bandwidth in bytes a second, read
 * and written counted (cudaMemcpy of 2 GiB, 20 times); 0 on failure. */
double lmx_backend_cuda_copy_bandwidth(int device);
#else
static inline int lmx_backend_cuda_available(void) { return 0; }
static inline lmx_backend *lmx_backend_cuda_new(int device, int quant, lmx_error *err)
{
    (void)device;
    (void)quant;
    lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: device cuda: this lmx was built without CUDA");
    return (lmx_backend *)0;
}
static inline lmx_status lmx_backend_cuda_new_group(int n_ranks, int quant, lmx_backend **out, lmx_error *err)
{
    (void)quant;
    (void)out;
    return lmx_fail(err, LMX_ERR_UNSUPPORTED, "lmx_load: %d GPUs: this lmx was built without CUDA", n_ranks);
}
static inline size_t lmx_backend_cuda_bytes(const lmx_tensor *t)
{
    (void)t;
    return 0;
}
static inline double lmx_backend_cuda_copy_bandwidth(int device)
{
    (void)device;
    return 0;
}
#endif

#ifdef __cplusplus
}
#endif

#endif
