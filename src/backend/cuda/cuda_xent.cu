/* Cross-entropy forward and backward over (N, C) logits of any strides: one
 * block per row; probabilities are never stored; a target outside [0, C)
 * that is not ignore_index sets the device flag, read by the host wrapper
 * (one stream sync) so the failing call returns NB_ERR_INDEX. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include <cooperative_groups.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_rows.cuh"

namespace cg = cooperative_groups;

/* ---- cross-entropy --------------------------------------------------------- */
struct nb_xent_args {
  int64_t N, C;
  int64_t s_row, s_col;   /* logits strides */
  const int64_t *tgt;
  int64_t s_tgt;
  int64_t ignore;
  double smooth;
  int64_t *flag;
};

__device__ __forceinline__ void nb_flag_raise(int64_t *flag, int64_t value) {
  if (atomicCAS((unsigned long long *)flag, 0ull, 1ull) == 0ull) flag[1] = value;
}

/* A row's loss lse - (1-eps) x[t] - eps mean(x), lse = m + ls (m the row
 * maximum, ls = log sum exp(x - m)), computed from differences of the
 * logits only: (m - x[t]) + ls + eps (x[t] - mean), mean = x0 + sdx / C
 * with sdx = sum(x - x0) over the row and x0 one of its logits. Forming
 * lse or sum(x) first would cost an ulp of the logits' size (6e-5 in f32
 * at logits near 1e3) in the loss. The smoothing term is left out when
 * eps = 0: sdx is -inf for a row with masked logits, and 0 * -inf would
 * make the loss NaN. */
template <typename A>
__device__ __forceinline__ A nb_xent_loss(const nb_xent_args &a, A m, A ls, A xt, A x0, A sdx) {
  A out = (m - xt) + ls;
  return a.smooth != 0.0 ? out + (A)a.smooth * ((xt - x0) - sdx / (A)a.C) : out;
}

/* The row's reference logit x0 for sdx: its first, or 0 when that is not
 * finite (a masked logit) or the row is empty. */
template <typename A, typename T>
__device__ __forceinline__ A nb_xent_x0(const nb_xent_args &a, const T *xr) {
  A v = a.C > 0 ? (A)nb_to_f(xr[0]) : (A)0;
  return isfinite(v) ? v : (A)0;
}

/* loss = lse - (1-eps) x[t] - eps/C sum(x); ignored rows give 0. */
template <typename T>
__global__ void __launch_bounds__(1024) nb_xent_fwd_kernel(nb_xent_args a, const T *logits, char *loss, int ldt,
                                   int64_t s_loss, char *lse, int lsdt, int64_t s_lse) {
  typedef typename nb_acc<T>::type A;
  __shared__ A smem[32];
  const int bd = blockDim.x, tid = threadIdx.x;
  int el = nb_dt_size(ldt), es = nb_dt_size(lsdt);
  for (int64_t r = blockIdx.x; r < a.N; r += gridDim.x) {
    const T *xr = logits + r * a.s_row;
    const A x0 = nb_xent_x0<A>(a, xr);
    A m = -INFINITY, s = 0, sx = 0;
    for (int64_t j = tid; j < a.C; j += bd) {
      A v = (A)nb_to_f(xr[j * a.s_col]);
      sx += v - x0;
      nb_online_add(m, s, v);
    }
    nb_online_merge(m, s, smem);
    sx = nb_block_sum(sx, smem);
    if (tid == 0) {
      A ls = nb_log_(s), l = m + ls, out = 0;
      int64_t t = a.tgt[r * a.s_tgt];
      if (t != a.ignore) {
        if (t < 0 || t >= a.C) nb_flag_raise(a.flag, t);
        else out = nb_xent_loss(a, m, ls, (A)nb_to_f(xr[t * a.s_col]), x0, sx);
      }
      if (lse) nb_store_any(lse + r * s_lse * es, lsdt, (double)l);
      nb_store_any(loss + r * s_loss * el, ldt, (double)out);
    }
  }
}

/* dlogits = dloss * (softmax - (1-eps) onehot - eps/C); ignored rows 0.
 * softmax = exp(x - lse) from the saved lse, which carries its own
 * rounding (an ulp of the logits' size); the training path (the fused
 * kernels below) recomputes the row statistics instead. */
template <typename T>
__global__ void __launch_bounds__(1024) nb_xent_bwd_kernel(nb_xent_args a, T *dlog, int64_t sd_row, int64_t sd_col,
                                   const T *logits, const char *dloss, int dldt, int64_t s_dloss,
                                   const char *lse, int lsdt, int64_t s_lse) {
  typedef typename nb_acc<T>::type A;
  const int bd = blockDim.x, tid = threadIdx.x;
  int el = nb_dt_size(dldt), es = nb_dt_size(lsdt);
  for (int64_t r = blockIdx.x; r < a.N; r += gridDim.x) {
    const T *xr = logits + r * a.s_row;
    T *dr = dlog + r * sd_row;
    int64_t t = a.tgt[r * a.s_tgt];
    int valid = t != a.ignore && t >= 0 && t < a.C;
    if (t != a.ignore && !valid && tid == 0) nb_flag_raise(a.flag, t);
    A g = valid ? (A)nb_load_any(dloss + r * s_dloss * el, dldt) : (A)0;
    A l = (A)nb_load_any(lse + r * s_lse * es, lsdt);
    A base = (A)(a.smooth / a.C), hit = (A)(1.0 - a.smooth);
    for (int64_t j = tid; j < a.C; j += bd) {
      A p = valid ? nb_exp_((A)nb_to_f(xr[j * a.s_col]) - l) : (A)0;
      A q = valid ? base + (j == t ? hit : (A)0) : (A)0;
      dr[j * sd_col] = nb_from_d<T>(g * (p - q));
    }
  }
}

static void xent_setup(nb_xent_args *a, const nb_kview *logits, const nb_kview *targets,
                       int64_t ignore, double smooth, int64_t *flag) {
  int nd = logits->ndim;
  a->C = nd ? logits->shape[nd - 1] : 1;
  a->N = nd == 2 ? logits->shape[0] : 1;
  a->s_col = nd ? logits->strides[nd - 1] : 0;
  a->s_row = nd == 2 ? logits->strides[0] : 0;
  a->tgt = (const int64_t *)targets->data;
  a->s_tgt = targets->ndim ? targets->strides[0] : 0;
  a->ignore = ignore;
  a->smooth = smooth;
  a->flag = flag;
}

extern "C" nb_status nb_cuda_xent_fwd(const nb_kview *loss, const nb_kview *lse,
                                      const nb_kview *logits, const nb_kview *targets,
                                      int64_t ignore_index, double smoothing) {
  NB_CUDA_ENTER(ctx, st, logits->data, "cross_entropy");
  nb_xent_args a;
  xent_setup(&a, logits, targets, ignore_index, smoothing, nb_cuda_flag(&ctx));
  if (a.N == 0) return NB_OK;
  int th = nb_cuda_row_threads(a.C);
  int64_t s_loss = loss->ndim ? loss->strides[0] : 0, s_lse = lse && lse->ndim ? lse->strides[0] : 0;
  NB_CUDA_FLOAT_SWITCH(logits->dtype, T,
    nb_xent_fwd_kernel<T><<<row_grid(&ctx, a.N, th), th, 0, ctx.stream>>>(
        a, (const T *)logits->data, (char *)loss->data, loss->dtype, s_loss,
        lse ? (char *)lse->data : NULL, lse ? (int)lse->dtype : 0, s_lse));
  if ((st = nb_cuda_launch_check("cross_entropy"))) return st;
  return nb_cuda_flag_check(&ctx, "cross_entropy: target", a.C);
}

extern "C" nb_status nb_cuda_xent_bwd(const nb_kview *dlogits, const nb_kview *dloss,
                                      const nb_kview *logits, const nb_kview *targets,
                                      const nb_kview *lse, int64_t ignore_index,
                                      double smoothing) {
  NB_CUDA_ENTER(ctx, st, logits->data, "cross_entropy_bwd");
  nb_xent_args a;
  xent_setup(&a, logits, targets, ignore_index, smoothing, nb_cuda_flag(&ctx));
  if (a.N == 0 || a.C == 0) return NB_OK;
  int nd = dlogits->ndim;
  int64_t sd_col = nd ? dlogits->strides[nd - 1] : 0, sd_row = nd == 2 ? dlogits->strides[0] : 0;
  int64_t s_dl = dloss->ndim ? dloss->strides[0] : 0, s_lse = lse->ndim ? lse->strides[0] : 0;
  int th = nb_cuda_row_threads(a.C);
  NB_CUDA_FLOAT_SWITCH(logits->dtype, T,
    nb_xent_bwd_kernel<T><<<row_grid(&ctx, a.N, th), th, 0, ctx.stream>>>(
        a, (T *)dlogits->data, sd_row, sd_col, (const T *)logits->data,
        (const char *)dloss->data, dloss->dtype, s_dl, (const char *)lse->data, lse->dtype, s_lse));
  if ((st = nb_cuda_launch_check("cross_entropy_bwd"))) return st;
  return nb_cuda_flag_check(&ctx, "cross_entropy_bwd: target", a.C);
}

/* ---- fused forward + backward ------------------------------------------------
 * One pass per row computes the loss, the log-sum-exp and
 * dlogits = dloss[row] * (softmax - onehot_smoothed): the logits are read
 * once (twice from L2 on the streaming path) and dlogits written once, so a
 * training step's cross-entropy costs one read and one write of the logits.
 * Float rows take exponentials in base 2 (the hardware ex2) of (x - m) L,
 * m the row maximum: the difference first, exact for logits near each
 * other, then the scaling (x L - m L would round both products to an ulp
 * of their size, 1.2e-4 at logits near 1e3, and so every probability). The
 * gradient's exponent (x - m) L - log2 S is one fma. f64 rows work in the
 * natural base with exp/log (L = 1). */
template <typename A> struct nb_xe;
template <> struct nb_xe<float> {
  static constexpr float L = NB_LOG2E_F; /* log2(e) */
  __device__ static float ex(float u) { return nb_ex2_ftz(u); }
  __device__ static float lg(float s) { return log2f(s); }
};
template <> struct nb_xe<double> {
  static constexpr double L = 1.0;
  __device__ static double ex(double u) { return exp(u); }
  __device__ static double lg(double s) { return log(s); }
};

/* The device words a fused launch shares across its blocks: zeroed once,
 * and left at zero by the last block of every launch that uses them. */
struct nb_xent_sync {
  unsigned ticket;          /* blocks finished */
  unsigned pad;
  unsigned long long nvalid; /* N_valid, when a count kernel ran first */
};

/* Where the fused kernels write loss/lse and read the row gradient (dloss
 * NULL: 1). mean: the row gradient is also divided by N_valid, which each
 * block counts itself (count_here: the targets are few next to the
 * logits) or reads from sync (a count kernel ran first). out (or NULL):
 * the reduced loss, written by the last block to finish. */
struct nb_xent_io {
  char *loss, *lse, *out;
  const char *dloss;
  int ldt, lsdt, dldt, odt, mean, count_here;
  int64_t s_loss, s_lse, s_dloss;
  nb_xent_sync *sync;
};

/* Sums two values over the block in one round of barriers (smem >= 64). */
template <typename A>
__device__ __forceinline__ void nb_xent_block_sum2(A &x, A &y, A *smem) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  x = nb_warp_sum(x);
  y = nb_warp_sum(y);
  __syncthreads(); /* smem may still be read by the previous reduction */
  if (lane == 0) { smem[warp] = x; smem[32 + warp] = y; }
  __syncthreads();
  x = lane < nw ? smem[lane] : (A)0;
  y = lane < nw ? smem[32 + lane] : (A)0;
  x = nb_warp_sum(x);
  y = nb_warp_sum(y);
}

/* Per-row constants of the gradient once the row maximum m and ls2 = log2
 * sum 2^((x - m) L) are known: dlogits[j] = g * 2^((x_j - m) L - ls2) - gb
 * - (j == t ? gh : 0). Thread 0 also stores loss and lse and raises the
 * flag for a bad target. */
template <typename A> struct nb_xent_row { A m, ls2, g, gb, gh; int64_t t; int valid; };

/* N_valid: the rows whose target is not ignore_index, counted by the
 * whole block from L2 (an integer count, so exact). */
__device__ __forceinline__ int64_t nb_xent_count(const nb_xent_args &a) {
  __shared__ int64_t cs[32];
  int64_t c = 0;
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < a.N; i += blockDim.x) c += a.tgt[i * a.s_tgt] != a.ignore;
  return nb_block_sum(c, cs);
}

/* N_valid for a mean launch (0 otherwise): counted here or read from sync. */
__device__ __forceinline__ int64_t nb_xent_nvalid(const nb_xent_args &a, const nb_xent_io &io) {
  if (!io.mean) return 0;
  if (io.count_here) return nb_xent_count(a);
  return (int64_t)*(volatile unsigned long long *)&io.sync->nvalid;
}

/* Counts N_valid into sync->nvalid (zero before) over many blocks, for
 * launches whose blocks would read the targets too often to count them
 * each; integer atomics, so the count is exact in any order. */
__global__ void nb_xent_count_kernel(nb_xent_args a, nb_xent_sync *sync) {
  __shared__ int64_t cs[32];
  int64_t c = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.N; i += (int64_t)gridDim.x * blockDim.x)
    c += a.tgt[i * a.s_tgt] != a.ignore;
  c = nb_block_sum(c, cs);
  if (threadIdx.x == 0 && c) atomicAdd(&sync->nvalid, (unsigned long long)c);
}

/* The block's end: the last block to finish sums the row losses in a fixed
 * order (thread i takes rows i, i + blockDim, ...; then a fixed tree), so
 * the reduced loss has the same bits whichever block comes last; it then
 * leaves the sync words at zero for the next launch. */
__device__ void nb_xent_reduce_last(const nb_xent_args &a, const nb_xent_io &io, int64_t nvalid) {
  __shared__ int last;
  __shared__ double ds[32];
  __syncthreads(); /* thread 0's row losses of this block are written */
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(&io.sync->ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (io.out) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < a.N; i += blockDim.x) {
      const char *p = io.loss + i * io.s_loss * nb_dt_size(io.ldt);
      s += io.ldt == NB_F64 ? __ldcg((const double *)p) : (double)__ldcg((const float *)p);
    }
    s = nb_block_sum(s, ds);
    if (threadIdx.x == 0) {
      if (io.mean) s /= (double)nvalid; /* 0/0 = NaN when every row is ignored */
      nb_store_any(io.out, io.odt, s);
    }
  }
  if (threadIdx.x == 0) {
    io.sync->ticket = 0u;
    io.sync->nvalid = 0ull;
  }
}

/* The row gradient scale: 1/N_valid for a mean, else 1; correctly rounded. */
__device__ __forceinline__ float nb_xent_rcp(float n) { return __frcp_rn(n); }
__device__ __forceinline__ double nb_xent_rcp(double n) { return __drcp_rn(n); }
template <typename A> __device__ __forceinline__ A nb_xent_scale(const nb_xent_io &io, int64_t nvalid) {
  return io.mean ? nb_xent_rcp((A)nvalid) : (A)1;
}

template <typename T, typename A>
__device__ __forceinline__ nb_xent_row<A> nb_xent_finish(const nb_xent_args &a, const nb_xent_io &io,
                                                          int64_t r, const T *xr, A M, A S, A sdx,
                                                          A x0, A scale, int lead = threadIdx.x == 0) {
  nb_xent_row<A> w;
  w.m = M;
  w.ls2 = nb_xe<A>::lg(S);
  w.t = a.tgt[r * a.s_tgt];
  int valid = w.valid = w.t != a.ignore && w.t >= 0 && w.t < a.C;
  if (lead) {
    A ls = w.ls2 / nb_xe<A>::L, l = M + ls, out = 0;
    if (w.t != a.ignore) {
      if (!valid) nb_flag_raise(a.flag, w.t);
      else out = nb_xent_loss(a, M, ls, (A)nb_to_f(xr[w.t * a.s_col]), x0, sdx);
    }
    if (io.lse) nb_store_any(io.lse + r * io.s_lse * nb_dt_size(io.lsdt), io.lsdt, (double)l);
    nb_store_any(io.loss + r * io.s_loss * nb_dt_size(io.ldt), io.ldt, (double)out);
  }
  A d = io.dloss ? (A)nb_load_any(io.dloss + r * io.s_dloss * nb_dt_size(io.dldt), io.dldt) : (A)1;
  w.g = valid ? (io.mean ? d * scale : d) : (A)0;
  w.gb = w.g * (A)(a.smooth / a.C);
  w.gh = w.g * (A)(1.0 - a.smooth);
  return w;
}

/* Ignored rows (and bad targets) get exact zeros, whatever their logits. */
template <typename A>
__device__ __forceinline__ A nb_xent_grad(const nb_xent_row<A> &w, A x, int64_t j) {
  if (!w.valid) return (A)0;
  A d = w.g * nb_xe<A>::ex(fma(x - w.m, nb_xe<A>::L, -w.ls2)) - w.gb;
  return j == w.t ? d - w.gh : d;
}

/* Any strides: online (max, sum) in one read, the gradient in a second. */
template <typename T>
__global__ void __launch_bounds__(1024) nb_xent_fused_kernel(nb_xent_args a, nb_xent_io io, const T *logits,
                                                             T *dlog, int64_t sd_row, int64_t sd_col) {
  typedef typename nb_acc<T>::type A;
  __shared__ A smem[64];
  const int bd = blockDim.x, tid = threadIdx.x;
  __shared__ int64_t nvalid; /* in shared memory: not a register held over the row loop */
  int64_t cnt = nb_xent_nvalid(a, io);
  if (tid == 0) nvalid = cnt;
  const A scale = nb_xent_scale<A>(io, cnt);
  for (int64_t r = blockIdx.x; r < a.N; r += gridDim.x) {
    const T *xr = logits + r * a.s_row;
    const A x0 = nb_xent_x0<A>(a, xr);
    A m = -INFINITY, s = 0, sx = 0;
    for (int64_t j = tid; j < a.C; j += bd) {
      A v = (A)nb_to_f(xr[j * a.s_col]);
      sx += v - x0;
      nb_online_add(m, s, v, [](A d) { return nb_xe<A>::ex(d * nb_xe<A>::L); });
    }
    A M = nb_block_max(m, smem);
    s = s == (A)0 ? (A)0 : s * nb_xe<A>::ex((m - M) * nb_xe<A>::L);
    nb_xent_block_sum2(s, sx, smem);
    nb_xent_row<A> w = nb_xent_finish(a, io, r, xr, M, s, sx, x0, scale);
    T *dr = dlog + r * sd_row;
    for (int64_t j = tid; j < a.C; j += bd)
      dr[j * sd_col] = nb_from_d<T>(nb_xent_grad(w, (A)nb_to_f(xr[j * a.s_col]), j));
  }
  if (io.sync) nb_xent_reduce_last(a, io, nvalid);
}

/* 16-byte vectors of E = 16 / sizeof(T) elements. */
template <typename T> union nb_xvec {
  uint4 u;
  T e[16 / sizeof(T)];
};

template <typename T, typename A>
__device__ __forceinline__ void nb_xent_store_vec(const nb_xent_row<A> &w, const nb_xvec<T> &q,
                                                  uint4 *dv, int i) {
  constexpr int E = 16 / sizeof(T);
  nb_xvec<T> o;
#pragma unroll
  for (int e = 0; e < E; e++) o.e[e] = nb_from_d<T>(nb_xent_grad(w, (A)nb_to_f(q.e[e]), (int64_t)(i * E + e)));
  __stcs(dv + i, o.u);
}

/* Contiguous, 16-byte aligned rows of at most NV vectors per thread: the row
 * stays in registers between the statistics and the gradient (one HBM read);
 * NV == 0 streams the row twice (the second read mostly hits L2). */
template <typename T, int NV>
__global__ void __launch_bounds__(1024) nb_xent_fused_vec_kernel(nb_xent_args a, nb_xent_io io,
                                                                 const T *logits, T *dlog, int64_t sd_row) {
  typedef typename nb_acc<T>::type A;
  constexpr int E = 16 / sizeof(T);
  __shared__ A smem[64];
  const int bd = blockDim.x, tid = threadIdx.x;
  const int nvec = (int)(a.C / E); /* the host checks C < 2^31 */
  __shared__ int64_t nvalid; /* in shared memory: not a register held over the row loop */
  int64_t cnt = nb_xent_nvalid(a, io);
  if (tid == 0) nvalid = cnt;
  const A scale = nb_xent_scale<A>(io, cnt);
  for (int64_t r = blockIdx.x; r < a.N; r += gridDim.x) {
    const T *xr = logits + r * a.s_row;
    const uint4 *xv = (const uint4 *)xr;
    uint4 *dv = (uint4 *)(dlog + r * sd_row);
    nb_xvec<T> c[NV > 0 ? NV : 1];
    const A x0 = nb_xent_x0<A>(a, xr);
    A m = -INFINITY, s = 0, sx = 0, M;
    if (NV > 0) {
#pragma unroll
      for (int k = 0; k < NV; k++) {
        int i = tid + k * bd;
        if (i < nvec) c[k].u = __ldcs(xv + i);
      }
      /* Only ~2 rows fit in an SM's registers: pull this block's next row
       * into L2 now (one 128-byte line per thread and step), so HBM stays
       * busy while this row is reduced and written. */
      if (r + gridDim.x < a.N) {
        const char *nx = (const char *)(logits + (r + gridDim.x) * a.s_row);
        for (int64_t off = (int64_t)tid * 128; off < a.C * (int64_t)sizeof(T); off += (int64_t)bd * 128)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(nx + off));
      }
#pragma unroll
      for (int k = 0; k < NV; k++)
        if (tid + k * bd < nvec)
#pragma unroll
          for (int e = 0; e < E; e++) m = fmax(m, (A)nb_to_f(c[k].e[e]));
      M = nb_block_max(m, smem);
#pragma unroll
      for (int k = 0; k < NV; k++)
        if (tid + k * bd < nvec)
#pragma unroll
          for (int e = 0; e < E; e++) {
            A v = (A)nb_to_f(c[k].e[e]);
            sx += v - x0;
            s += nb_xe<A>::ex((v - M) * nb_xe<A>::L);
          }
    } else {
      for (int i = tid; i < nvec; i += bd) { /* online: rescale when the max grows */
        nb_xvec<T> q;
        q.u = xv[i];
        A vm = -INFINITY;
#pragma unroll
        for (int e = 0; e < E; e++) vm = fmax(vm, (A)nb_to_f(q.e[e]));
        if (vm > m) { s = s == (A)0 ? (A)0 : s * nb_xe<A>::ex((m - vm) * nb_xe<A>::L); m = vm; }
#pragma unroll
        for (int e = 0; e < E; e++) {
          A v = (A)nb_to_f(q.e[e]);
          sx += v - x0;
          if (m != (A)-INFINITY) s += nb_xe<A>::ex((v - m) * nb_xe<A>::L); /* all -inf so far: 0 */
        }
      }
      M = nb_block_max(m, smem);
      s = s == (A)0 ? (A)0 : s * nb_xe<A>::ex((m - M) * nb_xe<A>::L);
    }
    nb_xent_block_sum2(s, sx, smem);
    nb_xent_row<A> w = nb_xent_finish(a, io, r, xr, M, s, sx, x0, scale);
    if (NV > 0) {
#pragma unroll
      for (int k = 0; k < NV; k++) {
        int i = tid + k * bd;
        if (i < nvec) nb_xent_store_vec<T, A>(w, c[k], dv, i);
      }
    } else {
      for (int i = tid; i < nvec; i += bd) {
        nb_xvec<T> q;
        q.u = __ldcs(xv + i); /* last use of the row */
        nb_xent_store_vec<T, A>(w, q, dv, i);
      }
    }
  }
  if (io.sync) nb_xent_reduce_last(a, io, nvalid);
}

/* Long contiguous rows split over a cluster of 2 blocks (Hopper): each
 * block keeps half the row in registers (NV vectors per thread, 512
 * threads), and the pair exchange their row max and (sum exp, sum x)
 * through distributed shared memory. Two half-rows of different rows
 * share an SM, so one block's loads and stores overlap the other's
 * reductions (one whole row per SM left HBM idle during them). Both blocks
 * of a pair add the two halves in rank order: the same bits on both. */
template <typename T, int NV>
__global__ void __launch_bounds__(512, 2) nb_xent_fused_pair_kernel(nb_xent_args a, nb_xent_io io,
                                                                    const T *logits, T *dlog,
                                                                    int64_t sd_row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  typedef float A;
  constexpr int E = 16 / sizeof(T);
  __shared__ A smem[64];
  __shared__ A xch[3]; /* this half's max, sum exp, sum x, read by the other block */
  __shared__ int64_t nvalid;
  cg::cluster_group cl = cg::this_cluster();
  const unsigned rank = cl.block_rank();
  const A *peer = cl.map_shared_rank(xch, rank ^ 1u);
  const int bd = blockDim.x, tid = threadIdx.x;
  const int nvec = (int)(a.C / E), half = (nvec + 1) / 2;
  const int v0 = rank ? half : 0, v1 = rank ? nvec : half;
  int64_t cnt = nb_xent_nvalid(a, io);
  if (tid == 0) nvalid = cnt;
  const A scale = nb_xent_scale<A>(io, cnt);
  const int64_t pair = blockIdx.x >> 1, npair = gridDim.x >> 1;
  for (int64_t r = pair; r < a.N; r += npair) {
    const T *xr = logits + r * a.s_row;
    const uint4 *xv = (const uint4 *)xr;
    uint4 *dv = (uint4 *)(dlog + r * sd_row);
    nb_xvec<T> c[NV];
    const A x0 = nb_xent_x0<A>(a, xr);
#pragma unroll
    for (int k = 0; k < NV; k++) {
      int i = v0 + tid + k * bd;
      if (i < v1) c[k].u = __ldcs(xv + i);
    }
    if (r + npair < a.N) { /* this block's half of its next row, into L2 */
      const char *nx = (const char *)(logits + (r + npair) * a.s_row) + (int64_t)v0 * 16;
      for (int64_t off = (int64_t)tid * 128; off < (int64_t)(v1 - v0) * 16; off += (int64_t)bd * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(nx + off));
    }
    A m = -INFINITY, s = 0, sx = 0;
#pragma unroll
    for (int k = 0; k < NV; k++)
      if (v0 + tid + k * bd < v1)
#pragma unroll
        for (int e = 0; e < E; e++) m = fmax(m, (A)nb_to_f(c[k].e[e]));
    A Mh = nb_block_max(m, smem);
    if (tid == 0) xch[0] = Mh;
    cl.sync();
    A M = fmax(Mh, peer[0]);
#pragma unroll
    for (int k = 0; k < NV; k++)
      if (v0 + tid + k * bd < v1)
#pragma unroll
        for (int e = 0; e < E; e++) {
          A v = (A)nb_to_f(c[k].e[e]);
          sx += v - x0;
          s += nb_xe<A>::ex((v - M) * nb_xe<A>::L);
        }
    nb_xent_block_sum2(s, sx, smem);
    if (tid == 0) { xch[1] = s; xch[2] = sx; }
    cl.sync();
    A S = rank ? peer[1] + s : s + peer[1], SX = rank ? peer[2] + sx : sx + peer[2];
    nb_xent_row<A> w = nb_xent_finish(a, io, r, xr, M, S, SX, x0, scale, tid == 0 && rank == 0);
#pragma unroll
    for (int k = 0; k < NV; k++) {
      int i = v0 + tid + k * bd;
      if (i < v1) nb_xent_store_vec<T, A>(w, c[k], dv, i);
    }
  }
  cl.sync(); /* the other block may still read this one's xch */
  if (io.sync) nb_xent_reduce_last(a, io, nvalid);
#endif
}

/* Compute capability major of device d (asked once per device). */
static int xent_cc_major(int d) {
  static int cc[64];
  if (d < 0 || d >= 64) return 0;
  if (!cc[d] && cudaDeviceGetAttribute(&cc[d], cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess) {
    cudaGetLastError();
    cc[d] = -1;
  }
  return cc[d];
}

/* How a mean launch of grid blocks gets N_valid: each block counts the
 * targets itself while all those reads (grid x N x 8 bytes, from L2) stay
 * under an eighth of the logits' bytes, so the forward stays one launch;
 * else a count kernel runs first (many blocks over short rows). */
static void xent_count_plan(const nb_cuda_ctx *ctx, const nb_xent_args &a, nb_xent_io *io,
                            int64_t grid, int es) {
  io->count_here = 0;
  if (!io->mean) return;
  if (grid * 64 <= a.C * es) {
    io->count_here = 1;
    return;
  }
  nb_xent_count_kernel<<<nb_cuda_blocks(ctx, a.N, 256), 256, 0, ctx->stream>>>(a, io->sync);
}

/* Resident blocks per SM of kernel k at th threads (asked once per kernel
 * and block size). */
static int xent_occupancy(const void *k, int th) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static struct { const void *k; int th, occ; } cache[32];
  static int n;
  int occ = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < n && !occ; i++)
    if (cache[i].k == k && cache[i].th == th) occ = cache[i].occ;
  if (!occ) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, th, 0) != cudaSuccess || occ < 1) occ = 1;
    cudaGetLastError();
    if (n < 32) { cache[n].k = k; cache[n].th = th; cache[n].occ = occ; n++; }
  }
  pthread_mutex_unlock(&lock);
  return occ;
}

/* Launches the pair kernel for rows of nvec vectors when it fits (Hopper,
 * 16- or 32-bit elements, half a row in at most 8 vectors x 512 threads,
 * rows long enough to pay for the exchange) and NABLA_XENT_PAIR=1 asks for
 * it; 0 otherwise. Off by default: on the H100 (2026-11-23) it ran
 * 16384x50304 bf16 in 1.597 ms against the one-block-per-row kernel's 1.300. */
template <typename T>
static int xent_pair_launch(const nb_cuda_ctx *ctx, const nb_xent_args &a, nb_xent_io io,
                            const T *x, T *d, int64_t sd_row, int64_t nvec) {
  const char *env = getenv("NABLA_XENT_PAIR");
  if (!env || env[0] != '1' || nvec < 4096 || nvec > 2 * 8 * 512 || xent_cc_major(ctx->dev) < 9)
    return 0;
  int64_t half = (nvec + 1) / 2, nv = (half + 511) / 512;
  int64_t pairs = a.N < (int64_t)ctx->n_sm ? a.N : (int64_t)ctx->n_sm; /* 2 blocks per SM */
  if (2 * pairs * 64 > a.C * (int64_t)sizeof(T)) return 0; /* each block counts N_valid itself */
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  io.count_here = io.mean;
  cfg.gridDim = dim3((unsigned)(2 * pairs));
  cfg.blockDim = dim3(512);
  cfg.stream = ctx->stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaError_t e = nv <= 4 ? cudaLaunchKernelEx(&cfg, nb_xent_fused_pair_kernel<T, 4>, a, io, x, d, sd_row)
                          : cudaLaunchKernelEx(&cfg, nb_xent_fused_pair_kernel<T, 8>, a, io, x, d, sd_row);
  return e == cudaSuccess ? 1 : (cudaGetLastError(), 0);
}

/* The vector kernel applies to contiguous, 16-byte aligned rows of whole
 * vectors in logits and dlogits. */
static int xent_vec_ok(const nb_xent_args *a, const void *x, const void *d, int64_t sd_row,
                       int64_t sd_col, int es) {
  int E = 16 / es;
  return a->C < INT32_MAX && a->s_col == 1 && sd_col == 1 && a->C % E == 0 && (a->N == 1 || (a->s_row % E == 0 && sd_row % E == 0)) &&
         nb_cuda_aligned16(x) && nb_cuda_aligned16(d);
}

template <typename T>
static void xent_fused_launch(const nb_cuda_ctx *ctx, const nb_xent_args &a, nb_xent_io io,
                              const T *x, T *d, int64_t sd_row, int64_t sd_col) {
  const int E = 16 / (int)sizeof(T);
  if (!xent_vec_ok(&a, x, d, sd_row, sd_col, (int)sizeof(T))) {
    int th = nb_cuda_row_threads(a.C);
    unsigned grid = row_grid(ctx, a.N, th);
    xent_count_plan(ctx, a, &io, grid, (int)sizeof(T));
    nb_xent_fused_kernel<T><<<grid, th, 0, ctx->stream>>>(a, io, x, d, sd_row, sd_col);
    return;
  }
  int64_t nvec = a.C / E;
  if (sizeof(T) <= 4 && xent_pair_launch(ctx, a, io, x, d, sd_row, nvec)) return;
  int th = nb_cuda_row_threads(nvec * 2); /* about 2 vectors per thread, up to 1024 threads */
  int64_t nv = (nvec + th - 1) / th;
  unsigned grid = row_grid(ctx, a.N, th);
  typedef void (*kern_t)(nb_xent_args, nb_xent_io, const T *, T *, int64_t);
  kern_t k = nv <= 1 ? nb_xent_fused_vec_kernel<T, 1> : nv <= 2 ? nb_xent_fused_vec_kernel<T, 2>
           : nv <= 4 ? nb_xent_fused_vec_kernel<T, 4> : nv <= 8 ? nb_xent_fused_vec_kernel<T, 8>
           : nb_xent_fused_vec_kernel<T, 0>;
  /* a mean's blocks that count N_valid themselves do it once each: one
   * resident wave of blocks, when that keeps the count cheap */
  if (io.mean) {
    int64_t wave = (int64_t)ctx->n_sm * xent_occupancy((const void *)k, th);
    if (wave < grid && wave * 64 <= a.C * (int64_t)sizeof(T)) grid = (unsigned)wave;
  }
  xent_count_plan(ctx, a, &io, grid, (int)sizeof(T));
  k<<<grid, th, 0, ctx->stream>>>(a, io, x, d, sd_row);
}

/* f64 (the checking dtype) always takes the general kernel. */
static void xent_fused_launch(const nb_cuda_ctx *ctx, const nb_xent_args &a, nb_xent_io io,
                              const double *x, double *d, int64_t sd_row, int64_t sd_col) {
  int th = nb_cuda_row_threads(a.C);
  unsigned grid = row_grid(ctx, a.N, th);
  xent_count_plan(ctx, a, &io, grid, 8);
  nb_xent_fused_kernel<double><<<grid, th, 0, ctx->stream>>>(a, io, x, d, sd_row, sd_col);
}

/* The sync words of device d (nb_xent_sync): zeroed once, then left at
 * zero by every launch (its last block resets them). One stream per device
 * orders the launches that share them. */
static nb_xent_sync *xent_sync(const nb_cuda_ctx *ctx) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static nb_xent_sync *syncs[64];
  if (ctx->dev < 0 || ctx->dev >= 64) {
    nb_error_set(NB_ERR_DEVICE, "cross_entropy: device cuda:%d out of range", ctx->dev);
    return NULL;
  }
  pthread_mutex_lock(&lock);
  nb_xent_sync *p = syncs[ctx->dev];
  if (!p) {
    if (nb_cuda_status(cudaMalloc((void **)&p, sizeof *p), "cross_entropy (sync words)") ||
        nb_cuda_status(cudaMemsetAsync(p, 0, sizeof *p, ctx->stream), "cross_entropy (sync words)")) {
      if (p) cudaFree(p);
      p = NULL;
    }
    syncs[ctx->dev] = p;
  }
  pthread_mutex_unlock(&lock);
  return p;
}

extern "C" nb_status nb_cuda_xent_fused(const nb_kview *loss, const nb_kview *lse,
                                        const nb_kview *dlogits, const nb_kview *dloss,
                                        const nb_kview *out, int mean, const nb_kview *logits,
                                        const nb_kview *targets, int64_t ignore_index,
                                        double smoothing) {
  NB_CUDA_ENTER(ctx, st, logits->data, "cross_entropy");
  nb_xent_args a;
  xent_setup(&a, logits, targets, ignore_index, smoothing, nb_cuda_flag(&ctx));
  if (a.N == 0) /* no rows: a sum of nothing, over N_valid = 0 for a mean */
    return out ? nb_cuda_fill(out, mean ? NAN : 0.0) : NB_OK;
  int nd = dlogits->ndim;
  int64_t sd_col = nd ? dlogits->strides[nd - 1] : 0, sd_row = nd == 2 ? dlogits->strides[0] : 0;
  nb_xent_io io;
  io.loss = (char *)loss->data;
  io.ldt = loss->dtype;
  io.s_loss = loss->ndim ? loss->strides[0] : 0;
  io.lse = lse ? (char *)lse->data : NULL;
  io.lsdt = lse ? (int)lse->dtype : 0;
  io.s_lse = lse && lse->ndim ? lse->strides[0] : 0;
  io.dloss = dloss ? (const char *)dloss->data : NULL;
  io.dldt = dloss ? (int)dloss->dtype : 0;
  io.s_dloss = dloss && dloss->ndim ? dloss->strides[0] : 0;
  io.out = out ? (char *)out->data : NULL;
  io.odt = out ? (int)out->dtype : 0;
  io.mean = mean;
  io.count_here = 0;
  io.sync = out || mean ? xent_sync(&ctx) : NULL;
  if ((out || mean) && !io.sync) return nb_last_status();
  NB_CUDA_FLOAT_SWITCH(logits->dtype, T,
    xent_fused_launch(&ctx, a, io, (const T *)logits->data, (T *)dlogits->data, sd_row, sd_col));
  if ((st = nb_cuda_launch_check("cross_entropy"))) return st;
  return nb_cuda_flag_check(&ctx, "cross_entropy: target", a.C);
}
