/* The one internal header `nabla bench` (tools/bench*.c) includes besides
 * nabla.h, the tools' only exception in scripts/check-layers.sh: the
 * autotuner it runs and reports, the backend table (the fused GEMM entry
 * gemm_ex, the kernel views of tensors), and on CUDA the GEMM paths it
 * calls one by one and the device clocks. */
#ifndef NB_BENCH_API_H
#define NB_BENCH_API_H

#include "backend/autotune.h"
#include "backend/backend.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_timing.h"
#include "core/core.h"
#endif

#endif
