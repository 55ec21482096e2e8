/* The one internal header `nabla bench` (tools/bench*.c) includes besides
 * nabla.h, the tools' only exception in scripts/check-layers.sh: the
 * autotuner it runs and reports, and on CUDA the GEMM paths it calls one by
 * one, the device clocks, and the kernel views of tensors. */
#ifndef NB_BENCH_API_H
#define NB_BENCH_API_H

#include "backend/autotune.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_timing.h"
#include "core/core.h"
#endif

#endif
