/* The CPU backend: float32 math on weights read in place from the mmap. */
#ifndef LMX_BACKEND_CPU_H
#define LMX_BACKEND_CPU_H

#include "backend.h"

/* n_threads: 0 = all online cores. */
lmx_backend *lmx_backend_cpu_new(int n_threads, lmx_error *err);

#endif
