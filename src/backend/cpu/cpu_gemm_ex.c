/* CPU GEMM with a fused epilogue (the gemm_ex entry): the reference the
 * CUDA entry is checked against.
 *
 * Without an epilogue the call is nb_cpu_matmul's. Otherwise the product
 * runs through nb_cpu_matmul in the accumulator type (f32, f64 for f64):
 * f16/bf16 operands are widened to f32 copies first (exactly, so
 * the product is the f32-accumulated product of the 16-bit values), and the
 * product goes straight into out when out has the accumulator type and the
 * epilogue does not read c. One pass then applies nb_gemm_epilogue
 * (backend.h) per element in the accumulator type and rounds once into out
 * and aux. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_iter.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_vmath.h"
#include "core/core.h"

static int gx_float(nb_dtype d) { return d == NB_F64 || d == NB_F32 || d == NB_F16 || d == NB_BF16; }

/* Shapes and dtypes of the call; an error naming them when they are wrong. */
static nb_status gx_check(const nb_kview *out, const nb_kview *a, const nb_kview *b,
                          const nb_gemm_epilogue *ep) {
  if (out->ndim != 2 || a->ndim != 2 || b->ndim != 2)
    return nb_error_set(NB_ERR_SHAPE, "gemm_ex (cpu): out, a, b must be 2-D (got %d, %d, %d axes)",
                        out->ndim, a->ndim, b->ndim);
  int64_t M = out->shape[0], N = out->shape[1], K = a->shape[1];
  if (a->shape[0] != M || b->shape[0] != K || b->shape[1] != N)
    return nb_error_set(NB_ERR_SHAPE, "gemm_ex (cpu): (%lld x %lld) @ (%lld x %lld) -> (%lld x %lld)",
                        (long long)a->shape[0], (long long)K, (long long)b->shape[0],
                        (long long)b->shape[1], (long long)M, (long long)N);
  nb_dtype in = a->dtype, od = out->dtype;
  int low = in == NB_F16 || in == NB_BF16;
  if (!gx_float(in) || b->dtype != in || (od != in && !(od == NB_F32 && low)))
    return nb_error_set(NB_ERR_DTYPE, "gemm_ex (cpu): a %s, b %s -> out %s (operands of one float "
                        "dtype; out theirs, or f32 for f16/bf16)", nb_dtype_name(in),
                        nb_dtype_name(b->dtype), nb_dtype_name(od));
  if (!ep) return NB_OK;
  if (ep->bias && (ep->bias->ndim != 1 || ep->bias->shape[0] != N || ep->bias->dtype != od))
    return nb_error_set(NB_ERR_SHAPE, "gemm_ex (cpu): bias must be (%lld,) %s (got %d axes, %s)",
                        (long long)N, nb_dtype_name(od), ep->bias->ndim,
                        nb_dtype_name(ep->bias->dtype));
  const nb_kview *mn[2] = {ep->beta != 0.0f ? ep->c : NULL, ep->aux};
  const char *what[2] = {"c", "aux"};
  for (int i = 0; i < 2; i++)
    if (mn[i] && (mn[i]->ndim != 2 || mn[i]->shape[0] != M || mn[i]->shape[1] != N ||
                  mn[i]->dtype != od))
      return nb_error_set(NB_ERR_SHAPE, "gemm_ex (cpu): %s must be (%lld x %lld) %s", what[i],
                          (long long)M, (long long)N, nb_dtype_name(od));
  if (ep->beta != 0.0f && !ep->c)
    return nb_error_set(NB_ERR_SHAPE, "gemm_ex (cpu): beta %g needs c", (double)ep->beta);
  return NB_OK;
}

/* A contiguous (rows x cols) view of dtype dt over fresh memory (*mem). */
static nb_status gx_scratch(nb_kview *v, int64_t rows, int64_t cols, nb_dtype dt, void **mem) {
  memset(v, 0, sizeof *v);
  v->dtype = dt;
  v->ndim = 2;
  v->shape[0] = rows;
  v->shape[1] = cols;
  v->strides[0] = cols;
  v->strides[1] = 1;
  size_t bytes = (size_t)(rows * cols) * nb_dtype_size(dt);
  v->data = *mem = malloc(bytes ? bytes : 1);
  if (!*mem)
    return nb_error_set(NB_ERR_OOM, "gemm_ex (cpu): out of memory for a %lld x %lld %s buffer",
                        (long long)rows, (long long)cols, nb_dtype_name(dt));
  return NB_OK;
}

/* x in the accumulator type: x itself, or an f32 copy of an f16/bf16 x. */
static nb_status gx_widen(const nb_kview *x, nb_dtype acc, nb_kview *w, void **mem) {
  *mem = NULL;
  if (x->dtype == acc) {
    *w = *x;
    return NB_OK;
  }
  nb_status st = gx_scratch(w, x->shape[0], x->shape[1], acc, mem);
  return st ? st : nb_cpu_copy(w, x);
}

/* Element (r, c) of a 2-D view; element c of a 1-D one (r = 0). */
static char *gx_at(const nb_kview *v, int64_t r, int64_t c) {
  int64_t off = v->ndim == 1 ? c * v->strides[0] : r * v->strides[0] + c * v->strides[1];
  return (char *)v->data + (size_t)off * nb_dtype_size(v->dtype);
}

/* Columns n0 .. n0 + cnt - 1 of row r (the last stride) into or out of d:
 * cpu_iter.h's tile loaders. */
static void gx_load(double *d, const nb_kview *v, int64_t r, int64_t n0, int cnt) {
  size_t isz = nb_dtype_size(v->dtype);
  nb_cpu_load_f64(v->dtype, cnt, gx_at(v, r, n0), v->strides[v->ndim - 1] * (int64_t)isz, d);
}

static void gx_store(const nb_kview *v, int64_t r, int64_t n0, int cnt, const double *d) {
  size_t isz = nb_dtype_size(v->dtype);
  nb_cpu_store_f64(v->dtype, cnt, d, gx_at(v, r, n0), v->strides[v->ndim - 1] * (int64_t)isz);
}

/* The tanh form of the elementwise gelu_tanh kernel (cpu_elementwise.c):
 * x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3); f32 in double. */
static double gx_gelu_d(double x) {
  double u2 = 2.0 * NB_VM_GELU_K * x * (1.0 + NB_VM_GELU_C * x * x);
  double a = exp(-fabs(u2)), big = 1.0 / (1.0 + a);
  return x * (u2 >= 0 ? big : a * big);
}

/* One chunk of a row: v holds P; pre = alpha P + beta c + bias, computed in
 * float (each step rounded to f32, as a float kernel computes) or in double
 * for f64; aux = pre; v becomes gelu(pre) or pre. */
#define GX_CHUNK 256
static void gx_chunk(double *v, const double *cv, const double *bv, int cnt, int f64,
                     const nb_gemm_epilogue *ep, double *aux) {
  for (int j = 0; j < cnt; j++) {
    double x;
    if (f64) {
      x = (double)ep->alpha * v[j];
      if (cv) x += (double)ep->beta * cv[j];
      if (bv) x += bv[j];
    } else {
      float f = ep->alpha * (float)v[j];
      if (cv) f += ep->beta * (float)cv[j];
      if (bv) f += (float)bv[j];
      x = f;
    }
    if (aux) aux[j] = x;
    v[j] = !ep->gelu ? x : f64 ? gx_gelu_d(x) : (double)nb_vm_gelu_tanhf((float)x);
  }
}

/* linear's case: out (f32, unit column stride) already holds P, += bias. */
static int gx_bias_only(const nb_kview *out, const nb_kview *P, const nb_gemm_epilogue *ep) {
  if (P->data != out->data || out->dtype != NB_F32 || out->strides[1] != 1 || !ep->bias ||
      ep->bias->dtype != NB_F32 || ep->alpha != 1.0f || ep->beta != 0.0f || ep->aux || ep->gelu)
    return 0;
  int64_t M = out->shape[0], N = out->shape[1], bs = ep->bias->strides[0];
  const float *b = ep->bias->data;
#pragma omp parallel for schedule(static) if (M * N >= 32768)
  for (int64_t r = 0; r < M; r++) {
    float *o = (float *)out->data + r * out->strides[0];
    for (int64_t n = 0; n < N; n++) o[n] += b[n * bs];
  }
  return 1;
}

/* The epilogue over every row, in chunks of GX_CHUNK columns; rows split
 * over threads (each element independent of the others). */
static void gx_epilogue(const nb_kview *out, const nb_kview *P, const nb_gemm_epilogue *ep) {
  if (gx_bias_only(out, P, ep)) return;
  int64_t M = out->shape[0], N = out->shape[1];
  int f64 = P->dtype == NB_F64;
  const nb_kview *c = ep->beta != 0.0f ? ep->c : NULL;
#pragma omp parallel for schedule(static) if (M * N >= 32768)
  for (int64_t r = 0; r < M; r++)
    for (int64_t n0 = 0; n0 < N; n0 += GX_CHUNK) {
      double v[GX_CHUNK], cv[GX_CHUNK], bv[GX_CHUNK], av[GX_CHUNK];
      int cnt = (int)(N - n0 < GX_CHUNK ? N - n0 : GX_CHUNK);
      gx_load(v, P, r, n0, cnt);
      if (c) gx_load(cv, c, r, n0, cnt);
      if (ep->bias) gx_load(bv, ep->bias, 0, n0, cnt);
      gx_chunk(v, c ? cv : NULL, ep->bias ? bv : NULL, cnt, f64, ep, ep->aux ? av : NULL);
      if (ep->aux) gx_store(ep->aux, r, n0, cnt, av);
      gx_store(out, r, n0, cnt, v);
    }
}

static int gx_plain(const nb_gemm_epilogue *ep) {
  return ep->alpha == 1.0f && ep->beta == 0.0f && !ep->bias && !ep->aux && !ep->gelu;
}

nb_status nb_cpu_gemm_ex(const nb_kview *out, const nb_kview *a, const nb_kview *b,
                         const nb_gemm_epilogue *ep) {
  nb_status st = gx_check(out, a, b, ep);
  if (st) return st;
  nb_gemm_epilogue plain = {NULL, NULL, NULL, 1.0f, 0.0f, 0};
  if (!ep) ep = &plain;
  int64_t M = out->shape[0], N = out->shape[1];
  if (M * N == 0) return NB_OK;
  /* no epilogue, one dtype: nb_cpu_matmul accumulates in f32 (f64) and
   * rounds once into out, the same result without the widened copies */
  if (gx_plain(ep) && out->dtype == a->dtype) return nb_cpu_matmul(out, a, b);
  nb_dtype acc = a->dtype == NB_F64 ? NB_F64 : NB_F32;
  nb_kview wa, wb, P;
  void *ma = NULL, *mb = NULL, *mp = NULL;
  int direct = out->dtype == acc && !(ep->beta != 0.0f && ep->c);
  st = gx_widen(a, acc, &wa, &ma);
  if (!st) st = gx_widen(b, acc, &wb, &mb);
  if (!st && direct) P = *out;
  else if (!st) st = gx_scratch(&P, M, N, acc, &mp);
  if (!st) st = nb_cpu_matmul(&P, &wa, &wb);
  if (!st && !(direct && gx_plain(ep))) gx_epilogue(out, &P, ep);
  free(ma);
  free(mb);
  free(mp);
  return st;
}
