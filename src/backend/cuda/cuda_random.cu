/* Random draws and dropout from Philox-4x32-10, mirroring src/core/philox.c
 * and the mapping in src/core/philox.h: element i (row-major in out) uses
 * the block at counter offset + i with key seed.
 *
 * Bit-exactness: the Philox words, uniform draws (integer to float
 * conversions and multiplications by powers of two are exact, and the
 * affine map is the same explicit fma in double as the CPU's), randint and
 * the dropout mask equal the CPU's bit for bit, also under --use_fast_math.
 * Normal draws use the GPU's logf/cosf/sqrtf, which may differ from the
 * CPU's libm in the last bits. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_philox.cuh"

/* nb_philox_u01 and friends, with explicitly rounded operations. */
__device__ __forceinline__ float nb_u01_dev(uint32_t x) {
  return __fmul_rn((float)(x >> 8), 1.0f / 16777216.0f);
}
__device__ __forceinline__ float nb_u01_open0_dev(uint32_t x) {
  return __fmul_rn(__fadd_rn((float)(x >> 8), 1.0f), 1.0f / 16777216.0f);
}
__device__ __forceinline__ double nb_u53_dev(uint32_t x0, uint32_t x1) {
  uint64_t u = ((uint64_t)x0 << 32 | x1) >> 11;
  return __dmul_rn((double)u, 1.0 / 9007199254740992.0);
}

#define NB_GRID_LOOP(i, n)                                                          \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);         \
       i += (int64_t)gridDim.x * blockDim.x)

/* kind: 0 uniform, 1 normal */
__global__ void nb_rand_kernel(char *out, int dt, int64_t es, nb_iter it, int64_t n, uint64_t seed,
                               uint64_t offset, double a, double b, int kind) {
  NB_GRID_LOOP(i, n) {
    uint32_t w[4];
    nb_philox_dev(seed, offset + (uint64_t)i, w);
    double v;
    if (kind == 0) { /* v = fma(hi - lo, u, lo) in double, as the CPU */
      double u = dt == NB_F64 ? nb_u53_dev(w[0], w[1]) : (double)nb_u01_dev(w[0]);
      v = __fma_rn(b - a, u, a);
      /* f16/bf16 round from the f32 value, as the CPU documents: nb_store_any
       * would round the double once, which differs at f32's ties */
      if (dt != NB_F64) v = (double)__double2float_rn(v);
    } else if (dt == NB_F64) {
      /* u1 = 1 - u53(w0, w1) in (0, 1], u2 = u53(w2, w3) */
      double u1 = __dadd_rn(1.0, -nb_u53_dev(w[0], w[1])), u2 = nb_u53_dev(w[2], w[3]);
      v = __fma_rn(b, sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925286766559 * u2), a);
    } else {
      float u1 = nb_u01_open0_dev(w[0]), u2 = nb_u01_dev(w[1]);
      float z = sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
      v = (double)__fmaf_rn((float)b, z, (float)a);
    }
    int64_t off[1];
    nb_iter_offsets<1>(it, i, off);
    nb_store_any(out + off[0] * es, dt, v);
  }
}

static nb_status rand_launch(const nb_kview *out, uint64_t seed, uint64_t offset, double a,
                             double b, int kind, const char *name) {
  int64_t n = nb_kview_numel(out);
  if (n == 0) return NB_OK;
  if (!nb_dtype_is_float(out->dtype))
    return nb_error_set(NB_ERR_DTYPE, "cuda %s: dtype %s is not a float dtype", name,
                        nb_dtype_name(out->dtype));
  NB_CUDA_ENTER(ctx, st, out->data, name);
  nb_iter it;
  nb_iter_views(&it, 1, &out);
  nb_rand_kernel<<<nb_cuda_blocks(&ctx, n, NB_CUDA_THREADS), NB_CUDA_THREADS, 0, ctx.stream>>>(
      (char *)out->data, out->dtype, (int64_t)nb_dtype_size(out->dtype), it, n, seed, offset, a, b,
      kind);
  return nb_cuda_launch_check(name);
}

extern "C" nb_status nb_cuda_rand_uniform(const nb_kview *out, uint64_t seed, uint64_t offset,
                                          double lo, double hi) {
  return rand_launch(out, seed, offset, lo, hi, 0, "rand_uniform");
}

extern "C" nb_status nb_cuda_rand_normal(const nb_kview *out, uint64_t seed, uint64_t offset,
                                         double mean, double std) {
  return rand_launch(out, seed, offset, mean, std, 1, "rand_normal");
}

__global__ void nb_randint_kernel(char *out, int dt, int64_t es, nb_iter it, int64_t n,
                                  uint64_t seed, uint64_t offset, int64_t lo, uint64_t range) {
  NB_GRID_LOOP(i, n) {
    uint32_t w[4];
    nb_philox_dev(seed, offset + (uint64_t)i, w);
    uint64_t r = ((uint64_t)w[0] | (uint64_t)w[1] << 32) % range;
    int64_t v = (int64_t)((uint64_t)lo + r);
    int64_t off[1];
    nb_iter_offsets<1>(it, i, off);
    nb_store_int(out + off[0] * es, dt, v);
  }
}

extern "C" nb_status nb_cuda_randint(const nb_kview *out, uint64_t seed, uint64_t offset,
                                     int64_t lo, int64_t hi) {
  int64_t n = nb_kview_numel(out);
  if (n == 0) return NB_OK;
  NB_CUDA_ENTER(ctx, st, out->data, "randint");
  nb_iter it;
  nb_iter_views(&it, 1, &out);
  uint64_t range = (uint64_t)hi - (uint64_t)lo;
  if (range == 0) range = 1;
  nb_randint_kernel<<<nb_cuda_blocks(&ctx, n, NB_CUDA_THREADS), NB_CUDA_THREADS, 0, ctx.stream>>>(
      (char *)out->data, out->dtype, (int64_t)nb_dtype_size(out->dtype), it, n, seed, offset, lo,
      range);
  return nb_cuda_launch_check("randint");
}

/* ---- dropout: out = keep ? x * scale : 0, keep = u01(w0) >= p ------------- */
template <typename T>
__global__ void nb_dropout_kernel(T *out, const T *x, nb_iter it, int64_t n, uint64_t seed,
                                  uint64_t offset, double p, double scale) {
  typedef typename nb_acc<T>::type C;
  NB_GRID_LOOP(i, n) {
    uint32_t w[4];
    nb_philox_dev(seed, offset + (uint64_t)i, w);
    int keep = (double)nb_u01_dev(w[0]) >= p;
    int64_t off[2];
    nb_iter_offsets<2>(it, i, off);
    C v = keep ? nb_to_f(x[off[1]]) * (C)scale : (C)0;
    out[off[0]] = nb_from_d<T>(v);
  }
}

extern "C" nb_status nb_cuda_dropout(const nb_kview *out, const nb_kview *x, double p,
                                     uint64_t seed, uint64_t offset) {
  int64_t n = nb_kview_numel(out);
  if (n == 0) return NB_OK;
  NB_CUDA_ENTER(ctx, st, out->data, "dropout");
  const nb_kview *vs[2] = {out, x};
  nb_iter it;
  nb_iter_views(&it, 2, vs);
  double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  unsigned g = nb_cuda_blocks(&ctx, n, NB_CUDA_THREADS);
  NB_CUDA_FLOAT_SWITCH(out->dtype, T,
    nb_dropout_kernel<T><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>((T *)out->data,
                                                               (const T *)x->data, it, n, seed,
                                                               offset, p, scale));
  return nb_cuda_launch_check("dropout");
}
