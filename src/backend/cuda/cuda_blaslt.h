/* cuBLASLt, loaded at first use.
 *
 * libnabla does not link libcublasLt: a CUDA-enabled library must load (and
 * its CPU backend run) where cuBLAS is not installed, and the own GEMM
 * kernels and every other CUDA kernel need nothing from it. The first product
 * that goes to cuBLASLt (f32/f64, NABLA_GEMM=cublaslt, shapes the own kernels
 * do not take) opens the library with dlopen, by its soname
 * (libcublasLt.so.<major> of the toolkit nabla was built with) and then by
 * its path in that toolkit, and resolves the few functions nabla calls into
 * one table. A failure is remembered: every later call reports the same
 * error (NB_ERR_BACKEND naming the files tried and the loader's message)
 * without trying again. The header types come from cublasLt.h as before. */
#ifndef NB_CUDA_BLASLT_H
#define NB_CUDA_BLASLT_H

#include <cublasLt.h>

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The cuBLASLt functions nabla calls, each named as in cublasLt.h without
 * the cublasLt prefix (cuda_blaslt.cu checks every type against it). */
typedef struct {
  cublasStatus_t (*Create)(cublasLtHandle_t *handle);
  const char *(*GetStatusString)(cublasStatus_t status);
  cublasStatus_t (*MatrixLayoutCreate)(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                       uint64_t rows, uint64_t cols, int64_t ld);
  cublasStatus_t (*MatrixLayoutSetAttribute)(cublasLtMatrixLayout_t layout,
                                             cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                             size_t bytes);
  cublasStatus_t (*MatrixLayoutDestroy)(cublasLtMatrixLayout_t layout);
  cublasStatus_t (*MatmulDescCreate)(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                     cudaDataType_t scale);
  cublasStatus_t (*MatmulDescSetAttribute)(cublasLtMatmulDesc_t desc,
                                           cublasLtMatmulDescAttributes_t attr, const void *buf,
                                           size_t bytes);
  cublasStatus_t (*MatmulDescDestroy)(cublasLtMatmulDesc_t desc);
  cublasStatus_t (*MatmulPreferenceCreate)(cublasLtMatmulPreference_t *pref);
  cublasStatus_t (*MatmulPreferenceSetAttribute)(cublasLtMatmulPreference_t pref,
                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                 const void *buf, size_t bytes);
  cublasStatus_t (*MatmulPreferenceDestroy)(cublasLtMatmulPreference_t pref);
  cublasStatus_t (*MatmulAlgoGetHeuristic)(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                           cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                           cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                           cublasLtMatmulPreference_t pref, int requested,
                                           cublasLtMatmulHeuristicResult_t results[],
                                           int *returned);
  cublasStatus_t (*Matmul)(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void *alpha,
                           const void *A, cublasLtMatrixLayout_t a, const void *B,
                           cublasLtMatrixLayout_t b, const void *beta, const void *C,
                           cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,
                           const cublasLtMatmulAlgo_t *algo, void *workspace, size_t ws_bytes,
                           cudaStream_t stream);
} nb_blaslt_api;

/* The table, loaded on the first call (thread-safe, once per process). NULL
 * with NB_ERR_BACKEND when libcublasLt cannot be opened or lacks a function;
 * the message names what was tried and why it failed. */
const nb_blaslt_api *nb_blaslt(void);

/* 1 once nb_blaslt() has loaded the library in this process, else 0. */
int nb_blaslt_loaded(void);

/* cuBLASLt's text for a status; "(cuBLASLt not loaded)" before a load. */
const char *nb_blaslt_status_string(cublasStatus_t s);

/* The files nb_blaslt() tries, in order, NULL-terminated. */
const char *const *nb_blaslt_candidates(void);

/* Opens the first of names (NULL-terminated) that dlopen accepts and fills
 * *api from it; *handle receives the dlopen handle (close it with dlclose).
 * NB_ERR_BACKEND naming every file tried and the loader's reason when none
 * loads or one lacks a function. nb_blaslt() uses it with
 * nb_blaslt_candidates(); tests call it with other names. */
nb_status nb_blaslt_open(const char *const *names, nb_blaslt_api *api, void **handle);

#ifdef __cplusplus
}
#endif

#endif
