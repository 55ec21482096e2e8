/* Attention without a (Lq, Lk) matrix: the portable flash-attention kernels
 * (every float dtype, head dimensions up to 256, any sm_80+ GPU).
 *
 * Forward: a warp per query row, eight rows per block sharing tiles of 32
 * keys and values staged in shared memory. Lane t of a warp scores key t of
 * the tile (q.k over the head dimension), the warp takes the tile's max,
 * and the row's running max m, per-lane partial sums l of exp(s - m) and
 * output accumulators (lane t owns output columns t, t + 32, ...) are
 * rescaled when the max grows; each probability is broadcast by a shuffle
 * to the lanes accumulating p v. o = acc / l, lse = m + log(l).
 *
 * Backward recomputes p = exp(scale q.k - lse): delta = dout.o per row (one
 * kernel), then dk and dv with a warp per key and lanes over tiles of 32
 * queries, then dq with a warp per query and lanes over tiles of 32 keys.
 * Every output element is summed by one thread in a fixed order: no
 * atomics, the same bits every run. Causal (key j for query i when j <= i,
 * top-left) skips the tiles a block cannot see. Statistics and sums in f32
 * (f64 for f64), standard expf/logf. Every view read or written (q, k, v,
 * dout, o, dq, dk, dv) may have any batch and row strides with unit column
 * stride: the (B, H, T, D) views of a packed (B, T, 3 H D) projection and
 * its gradient need no copy; lse and delta are contiguous (B, Lq).
 *
 * The optional parts (nb_attn_extra; cuda_attention_extra.cuh): the mask's
 * value is added to the scaled score (a tile whose scores are all -inf so
 * far is skipped, and a row with none allowed ends with o = 0 and
 * lse = -inf; backward takes p = 0 for it), dropout multiplies the
 * probability broadcast to the p v products (l sums the undropped ones),
 * backward recomputes both: dv += p z dout, ds = p (z dout.v - delta).
 * Grouped-query heads run on attn_group.h's split views; the dk, dv kernel
 * takes a block per kv head and loops over its G query heads in order.
 *
 * bf16 and f16 calls with head dimension 64, 96 or 128 and 16-byte aligned
 * rows take the tensor-core kernels of cuda_attention_mma.cu instead, and
 * on a 9.0 device their forward with head dimension 64 or 128 and views TMA
 * can describe takes the sm_90a kernel of cuda_attention_sm90.cu first
 * (NABLA_ATTENTION_SM90=0 turns it off). This one is correct everywhere
 * and stores nothing of size T^2. */
#include <math.h>
#include <string.h>

#include "backend/attn_group.h"
#include "backend/cuda/cuda_attention_extra.cuh"
#include "backend/cuda/cuda_attention_mma.cuh"
#include "backend/cuda/cuda_attention_sm90.h"
#include "backend/cuda/cuda_attention_sm90_bwd.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

#define ATT_W 8     /* warps (rows or keys) per block */
#define ATT_TILE 32 /* keys or queries per shared tile */
#define ATT_MAXB (NB_MAX_DIMS - 2)

/* A (.., L, E) view: its data, batch strides and row stride, in elements. */
struct att_view {
  const void *p;
  int64_t bs[ATT_MAXB];
  int64_t rs;
};

struct att_args {
  int nb;
  int64_t bshape[ATT_MAXB];
  int64_t B, Lq, Lk;
  int D, Dv;
  att_view q, k, v, o, g; /* g: dout */
  att_view dq, dk, dv;    /* written (any strides, as o) */
  void *lse, *delta;      /* (B, Lq) of the compute type */
  double scale;
  int causal;
  int G;     /* query heads per kv head: dk, dv blocks loop over them */
  nb_attx x; /* mask, dropout */
};

static att_view att_view_of(const nb_kview *v, int nb) {
  att_view a;
  a.p = v ? v->data : NULL;
  for (int d = 0; d < ATT_MAXB; d++) a.bs[d] = v && d < nb ? v->strides[d] : 0;
  a.rs = v ? v->strides[nb] : 0;
  return a;
}

/* Element offset of batch index b of view v. */
__device__ __forceinline__ int64_t att_off(const att_args &a, const att_view &v, int64_t b) {
  int64_t off = 0;
  for (int d = a.nb - 1; d >= 0; d--) {
    off += (b % a.bshape[d]) * v.bs[d];
    b /= a.bshape[d];
  }
  return off;
}

/* The keys query i sees: [0, end). */
__device__ __forceinline__ int64_t att_end(const att_args &a, int64_t i) {
  return a.causal ? (i + 1 < a.Lk ? i + 1 : a.Lk) : a.Lk;
}

/* Rows [r0, r0 + n) of a view's batch b, columns [0, E), into shared s with
 * row stride ss, by the whole block. */
template <typename T, typename A>
__device__ void att_stage(A *s, int ss, const att_view &v, int64_t off, int64_t r0, int n, int E) {
  const T *p = (const T *)v.p + off;
  for (int e = threadIdx.x; e < n * E; e += blockDim.x) {
    int t = e / E, d = e - t * E;
    s[t * ss + d] = nb_to_f(p[(r0 + t) * v.rs + d]);
  }
}

template <typename A> __device__ __forceinline__ A att_dot(const A *x, const A *y, int n) {
  A s = 0;
  for (int d = 0; d < n; d++) s += x[d] * y[d];
  return s;
}

/* The mask's value at (b, i, j) and the dropout factor z of (b, i, j). */
__device__ __forceinline__ double att_mask(const att_args &a, int64_t b, int64_t i, int64_t j) {
  return nb_attx_val_d(a.x, nb_attx_boff(a.x, a.nb, a.bshape, b) + i * a.x.mrs + j * a.x.mcs);
}
__device__ __forceinline__ double att_drop(const att_args &a, int64_t b, int64_t i, int64_t j) {
  return nb_attx_keep(a.x, b, i, j, a.Lq, a.Lk) ? a.x.zsd : 0.0;
}

/* exp(s - L), 0 for a row with no allowed key (L = -inf). */
template <typename A> __device__ __forceinline__ A att_p(A s, A L) {
  return L == -INFINITY ? (A)0 : exp(s - L);
}

/* ---- forward ----------------------------------------------------------- */
// q (B, Lq, D), k (B, Lk, D), v (B, Lk, Dv) -> o (B, Lq, Dv), lse (B, Lq)
template <typename T, int NC>
__global__ void __launch_bounds__(ATT_W * 32) nb_attn_fwd_kernel(const att_args a, int64_t nrb) {
  typedef typename nb_acc<T>::type A;
  extern __shared__ __align__(16) unsigned char att_smem[];
  const int ks = a.D | 1, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  A *Ks = (A *)att_smem, *Vs = Ks + ATT_TILE * ks, *Qw = Vs + ATT_TILE * a.Dv + w * a.D;
  const int64_t b = blockIdx.x / nrb, i0 = (blockIdx.x % nrb) * ATT_W, i = i0 + w;
  const bool row = i < a.Lq;
  const A scale = (A)a.scale;
  const T *q = (const T *)a.q.p + att_off(a, a.q, b) + (row ? i : 0) * a.q.rs;
  for (int d = lane; d < a.D; d += 32) Qw[d] = row ? nb_to_f(q[d]) : (A)0;
  const int64_t end = row ? att_end(a, i) : 0;
  const int64_t last = i0 + ATT_W - 1 < a.Lq ? i0 + ATT_W - 1 : a.Lq - 1;
  const int64_t bend = att_end(a, last), koff = att_off(a, a.k, b), voff = att_off(a, a.v, b);
  A m = -INFINITY, l = 0, acc[NC];
#pragma unroll
  for (int c = 0; c < NC; c++) acc[c] = 0;
  for (int64_t j0 = 0; j0 < bend; j0 += ATT_TILE) {
    const int n = bend - j0 < ATT_TILE ? (int)(bend - j0) : ATT_TILE;
    __syncthreads();
    att_stage<T>(Ks, ks, a.k, koff, j0, n, a.D);
    att_stage<T>(Vs, a.Dv, a.v, voff, j0, n, a.Dv);
    __syncthreads();
    if (j0 >= end) continue; /* warp-uniform */
    const int64_t j = j0 + lane;
    A s = -INFINITY;
    if (j < end) s = scale * att_dot(Qw, Ks + lane * ks, a.D);
    if (a.x.mask && j < end) s += att_mask(a, b, i, j);
    const A mn = fmax(m, nb_warp_max(s)); /* finite without a mask: key j0 is visible */
    if (mn == -INFINITY) continue;        /* warp-uniform: every score so far masked */
    const A corr = exp(m - mn);
    A p = j < end ? exp(s - mn) : (A)0;
    l = l * corr + p;
    if (a.x.drop && j < end) p *= att_drop(a, b, i, j);
    const int nt = end - j0 < ATT_TILE ? (int)(end - j0) : ATT_TILE;
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] *= corr;
    for (int t = 0; t < nt; t++) {
      const A pt = __shfl_sync(0xffffffffu, p, t);
#pragma unroll
      for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < a.Dv) acc[c] += pt * Vs[t * a.Dv + d];
      }
    }
    m = mn;
  }
  l = nb_warp_sum(l);
  if (!row) return;
  T *o = (T *)a.o.p + att_off(a, a.o, b) + i * a.o.rs;
#pragma unroll
  for (int c = 0; c < NC; c++) {
    const int d = lane + 32 * c;
    if (d < a.Dv) o[d] = nb_from_d<T>(l > 0 ? acc[c] / l : (A)0);
  }
  if (lane == 0) ((A *)a.lse)[b * a.Lq + i] = l > 0 ? m + log(l) : (A)-INFINITY;
}

/* ---- backward ---------------------------------------------------------- */
/* delta[b, i] = dout[b, i, :] . o[b, i, :]: a warp per row. */
template <typename T>
__global__ void nb_attn_delta_kernel(const att_args a) {
  typedef typename nb_acc<T>::type A;
  const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= a.B * a.Lq) return;
  const int64_t b = r / a.Lq, i = r % a.Lq;
  const T *g = (const T *)a.g.p + att_off(a, a.g, b) + i * a.g.rs;
  const T *o = (const T *)a.o.p + att_off(a, a.o, b) + i * a.o.rs;
  A s = 0;
  for (int d = lane; d < a.Dv; d += 32) s += nb_to_f(g[d]) * nb_to_f(o[d]);
  s = nb_warp_sum(s);
  if (lane == 0) ((A *)a.delta)[r] = s;
}

// dk (B, Lk, D), dv (B, Lk, Dv): a warp per key, lanes over 32-query tiles;
// a block per kv batch index bk, over its query heads b = bk G + g in order
template <typename T, int NC>
__global__ void __launch_bounds__(ATT_W * 32) nb_attn_bwd_kv_kernel(const att_args a, int64_t nkb) {
  typedef typename nb_acc<T>::type A;
  extern __shared__ __align__(16) unsigned char att_smem[];
  const int qs = a.D | 1, gs = a.Dv | 1, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  A *Qs = (A *)att_smem, *Gs = Qs + ATT_TILE * qs, *Ls = Gs + ATT_TILE * gs, *Ds = Ls + ATT_TILE;
  A *Kw = Ds + ATT_TILE + w * (a.D + a.Dv), *Vw = Kw + a.D;
  const int64_t bk = blockIdx.x / nkb * a.G, j0k = (blockIdx.x % nkb) * ATT_W, j = j0k + w;
  const bool col = j < a.Lk;
  const A scale = (A)a.scale;
  const T *k = (const T *)a.k.p + att_off(a, a.k, bk) + (col ? j : 0) * a.k.rs;
  const T *v = (const T *)a.v.p + att_off(a, a.v, bk) + (col ? j : 0) * a.v.rs;
  for (int d = lane; d < a.D; d += 32) Kw[d] = col ? nb_to_f(k[d]) : (A)0;
  for (int d = lane; d < a.Dv; d += 32) Vw[d] = col ? nb_to_f(v[d]) : (A)0;
  A ak[NC], av[NC];
#pragma unroll
  for (int c = 0; c < NC; c++) ak[c] = av[c] = 0;
  for (int64_t b = bk; b < bk + a.G; b++) {
    const int64_t qoff = att_off(a, a.q, b), goff = att_off(a, a.g, b);
    const A *lse = (const A *)a.lse + b * a.Lq, *delta = (const A *)a.delta + b * a.Lq;
    for (int64_t i0 = a.causal ? j0k / ATT_TILE * ATT_TILE : 0; i0 < a.Lq; i0 += ATT_TILE) {
      const int n = a.Lq - i0 < ATT_TILE ? (int)(a.Lq - i0) : ATT_TILE;
      __syncthreads();
      att_stage<T>(Qs, qs, a.q, qoff, i0, n, a.D);
      att_stage<T>(Gs, gs, a.g, goff, i0, n, a.Dv);
      if (threadIdx.x < n) Ls[threadIdx.x] = lse[i0 + threadIdx.x];
      if (threadIdx.x < n) Ds[threadIdx.x] = delta[i0 + threadIdx.x];
      __syncthreads();
      if (!col || (a.causal && i0 + n <= j)) continue; /* warp-uniform */
      const int64_t i = i0 + lane;
      A p = 0, pz = 0, ds = 0;
      if (lane < n && (!a.causal || i >= j)) {
        A s = scale * att_dot(Qs + lane * qs, Kw, a.D);
        if (a.x.mask) s += att_mask(a, b, i, j);
        p = att_p(s, Ls[lane]);
        const A z = a.x.drop ? (A)att_drop(a, b, i, j) : (A)1;
        pz = p * z;
        ds = p * (z * att_dot(Gs + lane * gs, Vw, a.Dv) - Ds[lane]) * scale;
      }
      for (int t = 0; t < n; t++) {
        const A pt = __shfl_sync(0xffffffffu, pz, t), dt = __shfl_sync(0xffffffffu, ds, t);
#pragma unroll
        for (int c = 0; c < NC; c++) {
          const int d = lane + 32 * c;
          if (d < a.Dv) av[c] += pt * Gs[t * gs + d];
          if (d < a.D) ak[c] += dt * Qs[t * qs + d];
        }
      }
    }
  }
  if (!col) return;
  T *dk = (T *)a.dk.p + att_off(a, a.dk, bk) + j * a.dk.rs;
  T *dv = (T *)a.dv.p + att_off(a, a.dv, bk) + j * a.dv.rs;
#pragma unroll
  for (int c = 0; c < NC; c++) {
    const int d = lane + 32 * c;
    if (d < a.D) dk[d] = nb_from_d<T>(ak[c]);
    if (d < a.Dv) dv[d] = nb_from_d<T>(av[c]);
  }
}

// dq (B, Lq, D): a warp per query, lanes over 32-key tiles
template <typename T, int NC>
__global__ void __launch_bounds__(ATT_W * 32) nb_attn_bwd_q_kernel(const att_args a, int64_t nrb) {
  typedef typename nb_acc<T>::type A;
  extern __shared__ __align__(16) unsigned char att_smem[];
  const int ks = a.D | 1, vs = a.Dv | 1, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  A *Ks = (A *)att_smem, *Vs = Ks + ATT_TILE * ks;
  A *Qw = Vs + ATT_TILE * vs + w * (a.D + a.Dv), *Gw = Qw + a.D;
  const int64_t b = blockIdx.x / nrb, i0 = (blockIdx.x % nrb) * ATT_W, i = i0 + w;
  const bool row = i < a.Lq;
  const A scale = (A)a.scale;
  const T *q = (const T *)a.q.p + att_off(a, a.q, b) + (row ? i : 0) * a.q.rs;
  const T *g = (const T *)a.g.p + att_off(a, a.g, b) + (row ? i : 0) * a.g.rs;
  for (int d = lane; d < a.D; d += 32) Qw[d] = row ? nb_to_f(q[d]) : (A)0;
  for (int d = lane; d < a.Dv; d += 32) Gw[d] = row ? nb_to_f(g[d]) : (A)0;
  const A L = row ? ((const A *)a.lse)[b * a.Lq + i] : (A)0;
  const A delta = row ? ((const A *)a.delta)[b * a.Lq + i] : (A)0;
  const int64_t end = row ? att_end(a, i) : 0;
  const int64_t last = i0 + ATT_W - 1 < a.Lq ? i0 + ATT_W - 1 : a.Lq - 1;
  const int64_t bend = att_end(a, last), koff = att_off(a, a.k, b), voff = att_off(a, a.v, b);
  A aq[NC];
#pragma unroll
  for (int c = 0; c < NC; c++) aq[c] = 0;
  for (int64_t j0 = 0; j0 < bend; j0 += ATT_TILE) {
    const int n = bend - j0 < ATT_TILE ? (int)(bend - j0) : ATT_TILE;
    __syncthreads();
    att_stage<T>(Ks, ks, a.k, koff, j0, n, a.D);
    att_stage<T>(Vs, vs, a.v, voff, j0, n, a.Dv);
    __syncthreads();
    if (j0 >= end) continue; /* warp-uniform */
    const int64_t j = j0 + lane;
    A ds = 0;
    if (j < end) {
      A s = scale * att_dot(Qw, Ks + lane * ks, a.D);
      if (a.x.mask) s += att_mask(a, b, i, j);
      const A p = att_p(s, L), z = a.x.drop ? (A)att_drop(a, b, i, j) : (A)1;
      ds = p * (z * att_dot(Gw, Vs + lane * vs, a.Dv) - delta) * scale;
    }
    const int nt = end - j0 < ATT_TILE ? (int)(end - j0) : ATT_TILE;
    for (int t = 0; t < nt; t++) {
      const A dt = __shfl_sync(0xffffffffu, ds, t);
#pragma unroll
      for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < a.D) aq[c] += dt * Ks[t * ks + d];
      }
    }
  }
  if (!row) return;
  T *dq = (T *)a.dq.p + att_off(a, a.dq, b) + i * a.dq.rs;
#pragma unroll
  for (int c = 0; c < NC; c++) {
    const int d = lane + 32 * c;
    if (d < a.D) dq[d] = nb_from_d<T>(aq[c]);
  }
}

/* ---- host side --------------------------------------------------------- */
static att_args att_make(const nb_kview *q, const nb_kview *k, const nb_kview *v,
                         const nb_kview *o, const nb_kview *g, double scale, int causal) {
  att_args a;
  memset(&a, 0, sizeof a);
  int nd = q->ndim;
  a.nb = nd - 2;
  a.B = 1;
  for (int d = 0; d < a.nb; d++) a.B *= a.bshape[d] = q->shape[d];
  a.Lq = q->shape[nd - 2];
  a.Lk = k->shape[nd - 2];
  a.D = (int)q->shape[nd - 1];
  a.Dv = (int)v->shape[nd - 1];
  a.q = att_view_of(q, a.nb); a.k = att_view_of(k, a.nb); a.v = att_view_of(v, a.nb);
  a.o = att_view_of(o, a.nb); a.g = att_view_of(g, a.nb);
  a.scale = scale;
  a.causal = causal;
  return a;
}

/* Output columns per lane, rounded up to 1, 2, 4 or 8; 0 when the head
 * dimension is over 256. */
static int att_chunks(const att_args &a) {
  int e = a.D > a.Dv ? a.D : a.Dv, c = (e + 31) / 32;
  return c <= 1 ? 1 : c <= 2 ? 2 : c <= 4 ? 4 : c <= 8 ? 8 : 0;
}

#define ATT_NC_SWITCH(nc, NC, ...)                     \
  switch (nc) {                                       \
  case 1: { const int NC = 1; __VA_ARGS__; } break;   \
  case 2: { const int NC = 2; __VA_ARGS__; } break;   \
  case 4: { const int NC = 4; __VA_ARGS__; } break;   \
  default: { const int NC = 8; __VA_ARGS__; } break;  \
  }

/* Launches kernel k over grid blocks with smem bytes of dynamic shared
 * memory, raising the kernel's limit when over the default 48 KB. */
template <typename K>
static nb_status att_launch(const nb_cuda_ctx *ctx, K k, int64_t grid, size_t smem,
                            const att_args &a, int64_t per_b, const char *name) {
  if (grid > 0x7fffffff)
    return nb_error_set(NB_ERR_UNSUPPORTED, "%s (cuda): %lld blocks (batch too large)", name,
                        (long long)grid);
  if (smem > 48 * 1024)
    NB_CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                name);
  k<<<(unsigned)grid, ATT_W * 32, smem, ctx->stream>>>(a, per_b);
  return nb_cuda_launch_check(name);
}

extern "C" nb_status nb_cuda_attn_fwd(const nb_kview *o0, const nb_kview *lse, const nb_kview *q0,
                                      const nb_kview *k0, const nb_kview *v0, double scale,
                                      int causal, const nb_attn_extra *x) {
  nb_kview qv[3] = {*q0, *o0}, kv[2] = {*k0, *v0};
  if (x && x->mask) qv[2] = *x->mask;
  const int64_t G = nb_attn_group_views(q0, k0, qv, x && x->mask ? 3 : 2, kv, 2);
  nb_attn_extra xs;
  if (x) xs = *x, xs.mask = x->mask ? &qv[2] : NULL;
  const nb_kview *q = &qv[0], *o = &qv[1], *k = &kv[0], *v = &kv[1];
  att_args a = att_make(q, k, v, o, NULL, scale, causal);
  a.lse = lse->data;
  a.G = (int)G;
  int nc = att_chunks(a);
  if (!nc || !G || !nb_attx_make(&a.x, x ? &xs : NULL, a.nb))
    return nb_error_set(NB_ERR_UNSUPPORTED, "attention (cuda): head dimensions %d, %d (the kernels "
                        "take up to 256), %lld batch axes with grouped heads, mask %s",
                        a.D, a.Dv, (long long)(q0->ndim - 2),
                        x && x->mask ? nb_dtype_name(x->mask->dtype) : "none");
  if (!a.B || !a.Lq) return NB_OK;
  NB_CUDA_ENTER(ctx, st, o->data, "attention");
  /* the sm_90a forward takes plain calls only (no mask, dropout or grouped heads) */
  if (!x && G == 1 && nb_cuda_attn_sm90_fwd(&ctx, o, lse, q, k, v, scale, causal, &st)) return st;
  if (nb_cuda_attn_mma_fwd(&ctx, o, lse, q, k, v, scale, causal, x ? &a.x : NULL, &st)) return st;
  int64_t nrb = (a.Lq + ATT_W - 1) / ATT_W;
  NB_CUDA_FLOAT_SWITCH(q->dtype, T, {
    typedef typename nb_acc<T>::type A;
    size_t smem = (size_t)(ATT_TILE * (a.D | 1) + ATT_TILE * a.Dv + ATT_W * a.D) * sizeof(A);
    ATT_NC_SWITCH(nc, NC, st = att_launch(&ctx, nb_attn_fwd_kernel<T, NC>, a.B * nrb, smem, a,
                                          nrb, "attention"));
  });
  return st;
}

extern "C" nb_status nb_cuda_attn_bwd(const nb_kview *dq0, const nb_kview *dk0, const nb_kview *dv0,
                                      const nb_kview *dout0, const nb_kview *q0, const nb_kview *k0,
                                      const nb_kview *v0, const nb_kview *o0, const nb_kview *lse,
                                      double scale, int causal, const nb_attn_extra *x) {
  nb_kview qv[5] = {*q0, *o0, *dout0, *dq0}, kv[4] = {*k0, *v0, *dk0, *dv0};
  if (x && x->mask) qv[4] = *x->mask;
  const int64_t G = nb_attn_group_views(q0, k0, qv, x && x->mask ? 5 : 4, kv, 4);
  nb_attn_extra xs;
  if (x) xs = *x, xs.mask = x->mask ? &qv[4] : NULL;
  const nb_kview *q = &qv[0], *o = &qv[1], *dout = &qv[2], *dq = &qv[3];
  const nb_kview *k = &kv[0], *v = &kv[1], *dk = &kv[2], *dv = &kv[3];
  att_args a = att_make(q, k, v, o, dout, scale, causal);
  a.lse = lse->data;
  a.G = (int)G;
  a.dq = att_view_of(dq, a.nb); a.dk = att_view_of(dk, a.nb); a.dv = att_view_of(dv, a.nb);
  int nc = att_chunks(a);
  if (!nc || !G || !nb_attx_make(&a.x, x ? &xs : NULL, a.nb))
    return nb_error_set(NB_ERR_UNSUPPORTED, "attention backward (cuda): head dimensions %d, %d "
                        "(the kernels take up to 256), %lld batch axes with grouped heads, mask %s",
                        a.D, a.Dv, (long long)(q0->ndim - 2),
                        x && x->mask ? nb_dtype_name(x->mask->dtype) : "none");
  if (!a.B || (!a.Lq && !a.Lk)) return NB_OK;
  NB_CUDA_ENTER(ctx, st, dq->data, "attention_bwd");
  /* the sm_90a backward takes plain calls only (no mask, dropout or grouped heads) */
  if (!x && G == 1 && nb_cuda_attn_sm90_bwd(&ctx, dq, dk, dv, dout, q, k, v, o, lse, scale, causal, &st))
    return st;
  if (nb_cuda_attn_mma_bwd(&ctx, dq, dk, dv, dout, q, k, v, o, lse, scale, causal,
                           x ? &a.x : NULL, (int)G, &st))
    return st;
  size_t asz = q->dtype == NB_F64 ? 8 : 4, dbytes = (size_t)(a.B * a.Lq) * asz;
  a.delta = dbytes ? nb_cuda_scratch(&ctx, dbytes) : NULL;
  if (dbytes && !a.delta) return nb_last_status();
  int64_t nrb = (a.Lq + ATT_W - 1) / ATT_W, nkb = (a.Lk + ATT_W - 1) / ATT_W;
  NB_CUDA_FLOAT_SWITCH(q->dtype, T, {
    typedef typename nb_acc<T>::type A;
    if (a.Lq) {
      int64_t rows = a.B * a.Lq, blocks = (rows + ATT_W - 1) / ATT_W;
      nb_attn_delta_kernel<T><<<(unsigned)blocks, ATT_W * 32, 0, ctx.stream>>>(a);
      st = nb_cuda_launch_check("attention_bwd (delta)");
    }
    size_t kv = (size_t)(ATT_TILE * ((a.D | 1) + (a.Dv | 1) + 2) + ATT_W * (a.D + a.Dv)) * sizeof(A);
    size_t qm = (size_t)(ATT_TILE * ((a.D | 1) + (a.Dv | 1)) + ATT_W * (a.D + a.Dv)) * sizeof(A);
    if (!st && a.Lk)
      ATT_NC_SWITCH(nc, NC, st = att_launch(&ctx, nb_attn_bwd_kv_kernel<T, NC>, a.B / G * nkb, kv,
                                            a, nkb, "attention_bwd (dk, dv)"));
    if (!st && a.Lq)
      ATT_NC_SWITCH(nc, NC, st = att_launch(&ctx, nb_attn_bwd_q_kernel<T, NC>, a.B * nrb, qm, a,
                                            nrb, "attention_bwd (dq)"));
  });
  if (a.delta) nb_cuda_scratch_free(&ctx, a.delta, dbytes);
  return st;
}
