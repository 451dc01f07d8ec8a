/* Which SIMD code path the CPU backend runs: picked at run time from the
 * CPU's features, or forced with LMX_CPU_PATH=amx|avx512|avx2|scalar. */
#ifndef LMX_CPU_PATH_H
#define LMX_CPU_PATH_H

#include "error.h"

typedef enum lmx_cpu_path {
    LMX_CPU_SCALAR, /* portable C, any architecture */
    LMX_CPU_AVX2,   /* x86-64 AVX2 + FMA + F16C */
    LMX_CPU_AVX512, /* x86-64 AVX-512 F/BW/VL/VNNI + FMA + F16C */
    LMX_CPU_AMX,    /* the AVX-512 path, bf16 prefill on AMX tiles (+ AVX-512 BF16) */
    LMX_CPU_PATH_COUNT
} lmx_cpu_path;

const char *lmx_cpu_path_name(lmx_cpu_path p);
/* 1 if this build and this CPU can run path p; else 0 and, when why is not
 * NULL, a reason such as "CPU lacks avx512bw". */
int lmx_cpu_path_supported(lmx_cpu_path p, const char **why);
/* 1 if this build and this CPU have AVX-512 BF16 dot products (the AVX-512
 * path's bf16 tile, lmx_cpu_kernels.bf16_tile); else 0 and why, as above. */
int lmx_cpu_avx512_bf16(const char **why);
/* The path to run: LMX_CPU_PATH when set (an error when unknown or not
 * supported here), else the best supported one. */
lmx_status lmx_cpu_path_select(lmx_cpu_path *out, lmx_error *err);

#endif
