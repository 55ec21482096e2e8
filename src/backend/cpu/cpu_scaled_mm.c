/* The CPU's scaled_mm, the reference: out (M, N) = s_a s_b (a @ b) for fp8
 * a (M, K) and b (K, N) of any strides. Every fp8 value is decoded exactly
 * (a 256-entry table per format), b is gathered once into rows of K
 * (b^T, contiguous), each dot product is summed in f64 (a product of two
 * fp8 values has at most 8 significant bits, so sums of moderate length
 * are exact) and multiplied by s_a s_b (exact in f64: two 24-bit
 * significands), then rounded once into out's dtype. Rows of out in
 * parallel: the same bits every run. */
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/core.h"

/* The exact value of every fp8 code of dtype dt. */
static void smm_table(nb_dtype dt, double *tab) {
  for (int i = 0; i < 256; i++)
    tab[i] = dt == NB_F8E4M3 ? nb_f8e4m3_to_f32((uint8_t)i) : nb_f8e5m2_to_f32((uint8_t)i);
}

nb_status nb_cpu_scaled_mm(const nb_kview *out, const nb_kview *a, const nb_kview *b,
                           const nb_kview *scale_a, const nb_kview *scale_b) {
  int64_t M = out->shape[0], N = out->shape[1], K = a->shape[1];
  double ta[256], tb[256];
  smm_table(a->dtype, ta);
  smm_table(b->dtype, tb);
  double *bt = malloc((size_t)(N * K > 0 ? N * K : 1) * sizeof *bt);
  if (!bt) return nb_error_set(NB_ERR_OOM, "scaled_mm: out of host memory for a %lld x %lld copy of b",
                               (long long)K, (long long)N);
  const uint8_t *pb = b->data, *pa = a->data;
  for (int64_t j = 0; j < N; j++)
    for (int64_t k = 0; k < K; k++) bt[j * K + k] = tb[pb[k * b->strides[0] + j * b->strides[1]]];
  double s = (double)*(const float *)scale_a->data * (double)*(const float *)scale_b->data;
  size_t es = nb_dtype_size(out->dtype);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; i++) {
    const uint8_t *ai = pa + i * a->strides[0];
    for (int64_t j = 0; j < N; j++) {
      double acc = 0.0;
      const double *bj = bt + j * K;
      for (int64_t k = 0; k < K; k++) acc += ta[ai[k * a->strides[1]]] * bj[k];
      char *dst = (char *)out->data + (i * out->strides[0] + j * out->strides[1]) * (int64_t)es;
      nb_store_f64(dst, out->dtype, s * acc);
    }
  }
  free(bt);
  return NB_OK;
}
