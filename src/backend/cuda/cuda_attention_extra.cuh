/* Attention's optional parts on the device (nb_attn_extra of backend.h),
 * shared by the SIMT (cuda_attention.cu) and tensor-core
 * (cuda_attention_mma.cu) kernels: the mask's value at (b, i, j) and the
 * dropout factor of probability (b, i, j), b the flat batch index over the
 * kernels' batch shape (q's, with grouped heads split: attn_group.h).
 *
 * Dropout keeps element e of the (B.., Hq, Lq, Lk) probability matrix when
 * word 0 of Philox block (seed, offset + e) has u01(w0) = (w0 >> 8) 2^-24
 * >= p, exactly nb_dropout's rule (cuda_random.cu, src/core/philox.h): as
 * integers, (w0 >> 8) >= thr with thr = ceil(p 2^24), the same decision
 * bit for bit. */
#ifndef NB_CUDA_ATTENTION_EXTRA_CUH
#define NB_CUDA_ATTENTION_EXTRA_CUH

#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_philox.cuh"

#define NB_ATTX_MAXB (NB_MAX_DIMS - 2)

enum { NB_ATTX_NONE, NB_ATTX_BOOL, NB_ATTX_F32, NB_ATTX_F16, NB_ATTX_BF16, NB_ATTX_F64 };

struct nb_attx {
  const void *mask;            /* NULL: no mask */
  int mdt;                     /* NB_ATTX_* */
  int64_t mbs[NB_ATTX_MAXB];   /* batch strides (0 on broadcast axes) */
  int64_t mrs, mcs;            /* row (query) and column (key) strides */
  int drop;                    /* dropout on */
  uint32_t thr;                /* keep when (w0 >> 8) >= thr */
  float zs;                    /* 1 / (1 - p), 0 for p = 1 */
  double zsd;                  /* the same in double (f64 inputs) */
  uint64_t seed, offset;
};

/* Word 0 of Philox-4x32-10 block (seed, counter) (cuda_philox.cuh). */
__device__ __forceinline__ uint32_t nb_attx_philox0(uint64_t seed, uint64_t counter) {
  uint32_t w[4];
  nb_philox_dev(seed, counter, w);
  return w[0];
}

/* Whether probability (b, i, j) of a (.., Lq, Lk) matrix is kept. */
__device__ __forceinline__ bool nb_attx_keep(const nb_attx &x, int64_t b, int64_t i, int64_t j,
                                             int64_t Lq, int64_t Lk) {
  const uint64_t e = (uint64_t)((b * Lq + i) * Lk + j);
  return (nb_attx_philox0(x.seed, x.offset + e) >> 8) >= x.thr;
}

/* Element offset of the mask's batch index b (unravelled over bshape). */
__device__ __forceinline__ int64_t nb_attx_boff(const nb_attx &x, int nb, const int64_t *bshape,
                                                int64_t b) {
  int64_t off = 0;
  for (int d = nb - 1; d >= 0; d--) {
    off += (b % bshape[d]) * x.mbs[d];
    b /= bshape[d];
  }
  return off;
}

/* The mask's value at element offset off (bool: 0 where true, -inf). */
__device__ __forceinline__ float nb_attx_val(const nb_attx &x, int64_t off) {
  switch (x.mdt) {
  case NB_ATTX_BOOL: return ((const uint8_t *)x.mask)[off] ? 0.0f : -INFINITY;
  case NB_ATTX_F16: return __half2float(((const __half *)x.mask)[off]);
  case NB_ATTX_BF16: return __bfloat162float(((const __nv_bfloat16 *)x.mask)[off]);
  case NB_ATTX_F64: return (float)((const double *)x.mask)[off];
  default: return ((const float *)x.mask)[off];
  }
}
__device__ __forceinline__ double nb_attx_val_d(const nb_attx &x, int64_t off) {
  return x.mdt == NB_ATTX_F64 ? ((const double *)x.mask)[off] : (double)nb_attx_val(x, off);
}

/* The device form of x for views of nb batch axes; 0 when the mask's dtype
 * is not one the kernels read. */
static inline int nb_attx_make(nb_attx *d, const nb_attn_extra *x, int nb) {
  memset(d, 0, sizeof *d);
  if (!x) return 1;
  if (x->mask) {
    const nb_kview *m = x->mask;
    d->mask = m->data;
    d->mdt = m->dtype == NB_BOOL ? NB_ATTX_BOOL : m->dtype == NB_F32 ? NB_ATTX_F32
           : m->dtype == NB_F16 ? NB_ATTX_F16 : m->dtype == NB_BF16 ? NB_ATTX_BF16
           : m->dtype == NB_F64 ? NB_ATTX_F64 : NB_ATTX_NONE;
    if (d->mdt == NB_ATTX_NONE || m->ndim != nb + 2) return 0;
    for (int i = 0; i < nb; i++) d->mbs[i] = m->strides[i];
    d->mrs = m->strides[nb];
    d->mcs = m->strides[nb + 1];
  }
  if (x->dropout_p > 0) {
    const double p = x->dropout_p;
    d->drop = 1;
    d->thr = p >= 1 ? 16777216u : (uint32_t)ceil(p * 16777216.0);
    d->zsd = p < 1 ? 1.0 / (1.0 - p) : 0.0;
    d->zs = (float)d->zsd;
    d->seed = x->seed;
    d->offset = x->offset;
  }
  return 1;
}

#endif /* NB_CUDA_ATTENTION_EXTRA_CUH */
