/* Fused row kernels: layer norm and RMS norm, forward and backward.
 *
 * One block per row (rows strided over the grid), or the contiguous packed
 * fast path (cuda_rows.cuh). Statistics accumulate in f32 (f64 for f64
 * inputs) and the saved mean and rstd have that type too (nb_acc<T>: f64
 * statistics keep f64 gradients exact to f64 rounding). Backward computes dx per row, then dw/db deterministically: a
 * column kernel writes per-split partial sums, and a small kernel adds the
 * splits in order. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

#include "backend/cuda/cuda_rows.cuh"

/* ---- layer norm / RMS norm ---------------------------------------------- */
struct nb_norm_args {
  int64_t R, D;
  const void *w, *b;
  int wdt, bdt;
  void *mean, *rstd; /* (R) of nb_acc<T> (f64 for f64 x, else f32); mean may be NULL */
  double eps;
  int rms;
};

/* w[j] or b[j] of any float dtype, or dflt when absent. */
__device__ __forceinline__ double nb_opt_load(const void *p, int dt, int64_t j, double dflt) {
  return p ? nb_load_any((const char *)p + j * nb_dt_size(dt), dt) : dflt;
}

/* y = (x - mean) * rstd * w + b (rms: mean 0, no b). */
template <typename A>
__device__ __forceinline__ A nb_norm_out(const nb_norm_args &a, A xv, A mu, A rs, int64_t j) {
  A o = (xv - mu) * rs * (A)nb_opt_load(a.w, a.wdt, j, 1.0);
  if (!a.rms) o += (A)nb_opt_load(a.b, a.bdt, j, 0.0);
  return o;
}

template <typename T>
__global__ void __launch_bounds__(1024) nb_norm_fwd_kernel(T *y, const T *x, nb_norm_args a) {
  typedef typename nb_acc<T>::type A;
  __shared__ A smem[32];
  const int bd = blockDim.x, tid = threadIdx.x;
  const int cached = a.D <= (int64_t)NB_ROW_CACHE * bd;
  for (int64_t r = blockIdx.x; r < a.R; r += gridDim.x) {
    const T *xr = x + r * a.D;
    T *yr = y + r * a.D;
    A v[NB_ROW_CACHE];
    A s = 0;
    if (cached) {
#pragma unroll
      for (int k = 0; k < NB_ROW_CACHE; k++) {
        int64_t j = tid + (int64_t)k * bd;
        v[k] = j < a.D ? (A)nb_to_f(xr[j]) : (A)0;
        s += a.rms ? v[k] * v[k] : v[k];
      }
    } else {
      for (int64_t j = tid; j < a.D; j += bd) {
        A t = (A)nb_to_f(xr[j]);
        s += a.rms ? t * t : t;
      }
    }
    s = nb_block_sum(s, smem);
    A mu = a.rms ? (A)0 : s / (A)a.D, var;
    if (a.rms) {
      var = s / (A)a.D;
    } else { /* second pass over the centred values for accuracy */
      A q = 0;
      if (cached) {
#pragma unroll
        for (int k = 0; k < NB_ROW_CACHE; k++)
          if (tid + (int64_t)k * bd < a.D) q += (v[k] - mu) * (v[k] - mu);
      } else {
        for (int64_t j = tid; j < a.D; j += bd) {
          A t = (A)nb_to_f(xr[j]) - mu;
          q += t * t;
        }
      }
      var = nb_block_sum(q, smem) / (A)a.D;
    }
    A rs = (A)1 / sqrt(var + (A)a.eps);
    if (tid == 0) {
      ((A *)a.rstd)[r] = rs;
      if (a.mean) ((A *)a.mean)[r] = mu;
    }
    if (cached) {
#pragma unroll
      for (int k = 0; k < NB_ROW_CACHE; k++) {
        int64_t j = tid + (int64_t)k * bd;
        if (j < a.D) yr[j] = nb_from_d<T>(nb_norm_out(a, v[k], mu, rs, j));
      }
    } else {
      for (int64_t j = tid; j < a.D; j += bd)
        yr[j] = nb_from_d<T>(nb_norm_out(a, (A)nb_to_f(xr[j]), mu, rs, j));
    }
  }
}

/* ---- layer norm / RMS norm, contiguous fast path --------------------------
 * x, y, dx, dy are contiguous (R, D) by contract; w and b in x's dtype (the
 * ops layer casts them). Each group of tpr threads (any multiple of 32)
 * caches its row in registers as NCH packs per thread. With PF, a group
 * also loads its next row while it reduces and writes the current one, so
 * about twice the bytes are in flight per thread; the grid is then one
 * resident wave, each group walking several rows. */

/* Per-run plan overrides, for measuring variants (unset: the defaults).
 * NABLA_NORM_FWD_NCH / NABLA_NORM_BWD_NCH: packs per thread; NABLA_NORM_PF:
 * 0 or 1. Prefetch is off by default: on the H100 (2026-11-23) it made
 * 16384x4096 bf16 slower (forward 0.124 -> 0.146 ms, fwd+bwd 0.297 -> 0.324)
 * and 16384x768 no faster (fwd+bwd 0.0711 -> 0.0726). */
static int norm_env(const char *name, int dflt) {
  const char *e = getenv(name);
  return e && e[0] ? atoi(e) : dflt;
}

/* Resident blocks per SM of a kernel at th threads and smem bytes, asked
 * once per (kernel, th, smem). */
static int rows_occupancy(const void *k, int th, size_t smem) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static struct { const void *k; int th; size_t smem; int occ; } cache[64];
  static int n;
  int occ = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < n && !occ; i++)
    if (cache[i].k == k && cache[i].th == th && cache[i].smem == smem) occ = cache[i].occ;
  if (!occ) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, th, smem) != cudaSuccess || occ < 1) occ = 1;
    cudaGetLastError();
    if (n < 64) { cache[n].k = k; cache[n].th = th; cache[n].smem = smem; cache[n].occ = occ; n++; }
  }
  pthread_mutex_unlock(&lock);
  return occ;
}

/* A 16-byte row pack issued exactly where it stands (volatile): the next
 * row's loads must go out before the current row's reductions. */
template <typename P> __device__ __forceinline__ P nb_ld_row_now(const P *p) {
  if (sizeof(P) == 16) {
    uint4 u;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
    P r;
    *reinterpret_cast<uint4 *>(&r) = u;
    return r;
  }
  return *p; /* element packs (the unaligned fallback): plain loads */
}

/* A weight or bias pack (the same few KB for every row: L1-cached), loaded
 * where it is used rather than held over the row's reductions. */
template <typename P> __device__ __forceinline__ P nb_ld_param(const P *p) {
  if (sizeof(P) == 16) {
    uint4 u;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
    P r;
    *reinterpret_cast<uint4 *>(&r) = u;
    return r;
  }
  return *p;
}

/* The thread's packs of row r of a (R, D) array. */
template <int NCH, int NOW, typename P>
__device__ __forceinline__ void nb_load_packs(P *v, const P *row, int t, int tpr, int nvec) {
#pragma unroll
  for (int k = 0; k < NCH; k++)
    if (t + k * tpr < nvec) v[k] = NOW ? nb_ld_row_now(row + t + k * tpr) : nb_ld_row(row + t + k * tpr);
}

template <typename T, int VEC, int NCH, int PF>
__global__ void __launch_bounds__(PF ? 768 : 1024) nb_norm_fwd_rows(T *y, const T *x, const T *w, const T *b,
                                                         typename nb_acc<T>::type *mean,
                                                         typename nb_acc<T>::type *rstd, int64_t R,
                                                         int D, int tpr, double eps, int rms) {
  typedef typename nb_acc<T>::type A;
  typedef nb_pack<T, VEC> P;
  __shared__ A red[96];
  const int t = threadIdx.x % tpr, g = threadIdx.x / tpr, G = blockDim.x / tpr;
  const int nvec = D / VEC, bar = 1 + g;
  A *sm = red + 3 * g * (tpr >> 5);
  const P *wp = (const P *)w, *bp = (const P *)b;
  const int64_t step = (int64_t)gridDim.x * G;
  int64_t r = (int64_t)blockIdx.x * G + g;
  P nx[NCH]; /* the next row (PF only; unused registers vanish otherwise) */
  if (PF && r < R) nb_load_packs<NCH, 1>(nx, (const P *)(x + r * D), t, tpr, nvec);
  for (; r < R; r += step) {
    P v[NCH];
    if (PF) {
#pragma unroll
      for (int k = 0; k < NCH; k++) v[k] = nx[k];
      if (r + step < R) nb_load_packs<NCH, 1>(nx, (const P *)(x + (r + step) * D), t, tpr, nvec);
    } else {
      nb_load_packs<NCH, 0>(v, (const P *)(x + r * D), t, tpr, nvec);
    }
    /* Two passes over the cached row: its mean, then the sum of squared
     * deviations from that mean (as accurate as merging Welford triples,
     * without a division in each of the ~10 merges: those divisions were
     * 12% of the kernel's instructions in the accurate build). */
    A s = 0;
#pragma unroll
    for (int k = 0; k < NCH; k++)
      if (t + k * tpr < nvec) {
        A f[VEC];
        nb_unpack(v[k], f);
#pragma unroll
        for (int e = 0; e < VEC; e++) s += rms ? f[e] * f[e] : f[e];
      }
    s = nb_grp_reduce<0>(s, sm, tpr, bar);
    A mu = 0, var;
    if (rms) {
      var = s / (A)D;
    } else {
      mu = s / (A)D;
      A q = 0;
#pragma unroll
      for (int k = 0; k < NCH; k++)
        if (t + k * tpr < nvec) {
          A f[VEC];
          nb_unpack(v[k], f);
#pragma unroll
          for (int e = 0; e < VEC; e++) {
            A c = f[e] - mu;
            q += c * c;
          }
        }
      var = nb_grp_reduce<0>(q, sm, tpr, bar) / (A)D;
    }
    A rs = (A)1 / sqrt(var + (A)eps);
    if (t == 0) {
      rstd[r] = rs;
      if (mean) mean[r] = mu;
    }
    P *yr = (P *)(y + r * D);
#pragma unroll
    for (int k = 0; k < NCH; k++) {
      int j = t + k * tpr;
      if (j < nvec) {
        P wv, bv, o;
        A f[VEC], fw[VEC], fb[VEC];
        if (wp) wv = nb_ld_param(wp + j);
        if (bp) bv = nb_ld_param(bp + j);
        nb_unpack(v[k], f);
        if (wp) nb_unpack(wv, fw);
        if (bp) nb_unpack(bv, fb);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
          A u = (f[e] - mu) * rs;
          if (wp) u *= fw[e];
          if (bp) u += fb[e];
          o.v[e] = nb_from_d<T>(u);
        }
        nb_st_row<1>(yr + j, o);
      }
    }
  }
}

/* Fused backward: per row dx = rstd * (g - mean(g) - xhat * mean(g*xhat)),
 * g = dy*w (rms drops mean(g)); x and dy are read once. With part, each
 * thread also sums dy*xhat and dy over its rows for its own columns; the
 * block's groups then add theirs in group order through shared memory and
 * the block writes part[block][0..D) (dw) and part[block][D..2D) (db).
 * One pack per thread fits 64 registers (1024-thread blocks); more packs
 * take 512-thread blocks of up to 128 registers. */
template <typename T, int VEC, int NCH, int PF>
__global__ void __launch_bounds__(NCH == 1 ? 768 : 512, 1) nb_norm_bwd_rows(
    T *dx, const T *dy, const T *x, const T *w, const typename nb_acc<T>::type *mean,
    const typename nb_acc<T>::type *rstd, int64_t R, int D, int tpr, int rms,
    typename nb_acc<T>::type *part) {
  typedef typename nb_acc<T>::type A;
  typedef nb_pack<T, VEC> P;
  constexpr int HOLDW = NCH <= 2; /* w packs kept in registers for the whole kernel */
  __shared__ A red[64];
  extern __shared__ unsigned char nb_norm_smem[];
  const int t = threadIdx.x % tpr, g = threadIdx.x / tpr, G = blockDim.x / tpr;
  const int nvec = D / VEC, bar = 1 + g;
  A *sm = red + 2 * g * (tpr >> 5);
  const P *wp = (const P *)w;
  P wh[HOLDW ? NCH : 1];
  if (HOLDW && wp) nb_load_packs<NCH, 0>(wh, wp, t, tpr, nvec);
  A aw[NCH][VEC], ab[NCH][VEC];
#pragma unroll
  for (int k = 0; k < NCH; k++)
#pragma unroll
    for (int e = 0; e < VEC; e++) aw[k][e] = ab[k][e] = 0;
  const int64_t step = (int64_t)gridDim.x * G;
  int64_t r = (int64_t)blockIdx.x * G + g;
  P xn[NCH], gn[NCH]; /* the next row (PF only) */
  A mun = 0, rsn = 0;
  if (PF && r < R) {
    nb_load_packs<NCH, 1>(xn, (const P *)(x + r * D), t, tpr, nvec);
    nb_load_packs<NCH, 1>(gn, (const P *)(dy + r * D), t, tpr, nvec);
    mun = mean ? (A)mean[r] : (A)0;
    rsn = (A)rstd[r];
  }
  /* Every group of a block makes the same number of trips (a group past
   * the last row takes part in its group's reduction with nothing), so all
   * groups pass the same named barriers before the dw/db turns below. */
  for (; r - g < R; r += step) { /* r - g: the block's first row of this trip */
    const bool live = r < R;
    P xv[NCH], gv[NCH];
    A mu = 0, rs = 0;
    if (!live) {
#pragma unroll
      for (int k = 0; k < NCH; k++) xv[k] = gv[k] = P{};
    } else if (PF) {
#pragma unroll
      for (int k = 0; k < NCH; k++) { xv[k] = xn[k]; gv[k] = gn[k]; }
      mu = mun;
      rs = rsn;
      int64_t rn = r + step;
      if (rn < R) {
        nb_load_packs<NCH, 1>(xn, (const P *)(x + rn * D), t, tpr, nvec);
        nb_load_packs<NCH, 1>(gn, (const P *)(dy + rn * D), t, tpr, nvec);
        mun = mean ? (A)mean[rn] : (A)0;
        rsn = (A)rstd[rn];
      }
    } else {
      nb_load_packs<NCH, 0>(xv, (const P *)(x + r * D), t, tpr, nvec);
      nb_load_packs<NCH, 0>(gv, (const P *)(dy + r * D), t, tpr, nvec);
      mu = mean ? (A)mean[r] : (A)0;
      rs = (A)rstd[r];
    }
    A sg = 0, sgx = 0;
#pragma unroll
    for (int k = 0; k < NCH; k++)
      if (t + k * tpr < nvec) {
        P wv;
        A fg[VEC], fx[VEC], fw[VEC];
        if (wp) wv = HOLDW ? wh[k] : nb_ld_param(wp + t + k * tpr);
        nb_unpack(gv[k], fg);
        nb_unpack(xv[k], fx);
        if (wp) nb_unpack(wv, fw);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
          A d = fg[e], xh = (fx[e] - mu) * rs;
          A gg = wp ? d * fw[e] : d;
          sg += gg;
          sgx += gg * xh;
          if (part && live) {
            aw[k][e] += d * xh;
            ab[k][e] += d;
          }
        }
      }
    nb_grp_sum2(sg, sgx, sm, tpr, bar);
    sg = rms ? (A)0 : sg / (A)D;
    sgx /= (A)D;
    P *dxr = (P *)(dx + r * D);
#pragma unroll
    for (int k = 0; k < NCH; k++)
      if (live && t + k * tpr < nvec) {
        P wv, o;
        A fg[VEC], fx[VEC], fw[VEC];
        if (wp) wv = HOLDW ? wh[k] : nb_ld_param(wp + t + k * tpr);
        nb_unpack(gv[k], fg);
        nb_unpack(xv[k], fx);
        if (wp) nb_unpack(wv, fw);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
          A d = fg[e], xh = (fx[e] - mu) * rs;
          A gg = wp ? d * fw[e] : d;
          o.v[e] = nb_from_d<T>(rs * (gg - sg - xh * sgx));
        }
        nb_st_row<1>(dxr + t + k * tpr, o);
      }
  }
  if (!part) return;
  /* Groups take turns in a fixed order, so the sums are the same bits on
   * every run; each column belongs to one thread of every group. */
  A *acc = (A *)nb_norm_smem, *out = part + (int64_t)blockIdx.x * 2 * D;
  for (int turn = 0; turn < G; turn++) {
    if (g == turn) {
      A *dst = turn == G - 1 ? out : acc;
#pragma unroll
      for (int k = 0; k < NCH; k++)
        if (t + k * tpr < nvec)
#pragma unroll
          for (int e = 0; e < VEC; e++) {
            int c = (t + k * tpr) * VEC + e;
            A pw = aw[k][e], pb = ab[k][e];
            if (turn > 0) { pw += acc[c]; pb += acc[D + c]; }
            dst[c] = pw;
            dst[D + c] = pb;
          }
    }
    if (G > 1) __syncthreads();
  }
}

/* dw[c] and db[c]: the blocks' partials added in block order. A block of
 * 32 x 32 threads: 32 slices of the blocks per column (a few loads per
 * thread, all in flight), then the slices in order. */
template <typename A>
__global__ void __launch_bounds__(1024) nb_norm_dwdb_finish(const A *part, int nblk, int D, void *dw,
                                                            int dwdt, void *db, int dbdt) {
  __shared__ A sl[32][33];
  int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  int c = blockIdx.x * 32 + tx;
  A s = 0;
  if (c < 2 * D) {
#pragma unroll 8
    for (int b = ty; b < nblk; b += 32) s += part[(int64_t)b * 2 * D + c];
  }
  sl[ty][tx] = s;
  __syncthreads();
  if (ty || c >= 2 * D) return;
  s = 0;
#pragma unroll
  for (int i = 0; i < 32; i++) s += sl[i][tx];
  if (c < D) {
    if (dw) nb_store_any((char *)dw + (int64_t)c * nb_dt_size(dwdt), dwdt, (double)s);
  } else if (db) {
    nb_store_any((char *)db + (int64_t)(c - D) * nb_dt_size(dbdt), dbdt, (double)s);
  }
}

#define NB_NORM_NCH4_SWITCH(nch, NCH, ...)                 \
  switch (nch) {                                          \
  case 1: { const int NCH = 1; __VA_ARGS__; } break;      \
  case 2: { const int NCH = 2; __VA_ARGS__; } break;      \
  case 3: { const int NCH = 3; __VA_ARGS__; } break;      \
  default: { const int NCH = 4; __VA_ARGS__; } break;     \
  }
#define NB_NORM_NCH_SWITCH(nch, NCH, ...)                  \
  switch (nch) {                                          \
  case 1: { const int NCH = 1; __VA_ARGS__; } break;      \
  case 2: { const int NCH = 2; __VA_ARGS__; } break;      \
  case 3: { const int NCH = 3; __VA_ARGS__; } break;      \
  case 4: { const int NCH = 4; __VA_ARGS__; } break;      \
  default: { const int NCH = 8; __VA_ARGS__; } break;     \
  }

/* Packs per thread for a row of nvec packs: of the candidate counts whose
 * threads per row (multiples of 32, at most max_tpr) fit, the one leaving
 * the fewest idle pack slots, the earlier candidate on a tie; force (if
 * not 0) admits that count only. 0 when none fits. */
static int norm_plan(int64_t nvec, const int *cand, int ncand, int max_tpr, int force, int *tpr) {
  int best = 0, bt = 0;
  int64_t waste = -1;
  for (int i = 0; i < ncand; i++) {
    int t;
    if (force && cand[i] != force) continue;
    if (!nb_rows_fit(nvec, cand[i], max_tpr, &t)) continue;
    int64_t wst = (int64_t)t * cand[i] - nvec;
    if (waste < 0 || wst < waste) { best = cand[i]; bt = t; waste = wst; }
  }
  *tpr = bt;
  return best;
}

template <typename T, int VEC, int NCH, int PF>
static void norm_fwd_rows_launch(const nb_cuda_ctx *ctx, T *y, const T *x, const T *w, const T *b,
                                 void *mean, void *rstd, int64_t R, int D, int tpr, double eps,
                                 int rms) {
  typedef typename nb_acc<T>::type A;
  auto k = nb_norm_fwd_rows<T, VEC, NCH, PF>;
  int th = tpr * ((128 + tpr - 1) / tpr); /* blocks of at least 128 threads */
  int64_t G = th / tpr, want = (R + G - 1) / G;
  int64_t cap = PF ? (int64_t)ctx->n_sm * rows_occupancy((const void *)k, th, 0)
                   : (int64_t)ctx->n_sm * (2048 / th) * 16;
  unsigned grid = (unsigned)(want < cap ? want : cap);
  k<<<grid, th, 0, ctx->stream>>>(y, x, w, b, (A *)mean, (A *)rstd, R, D, tpr, eps, rms);
}

/* Fast forward when w and b (if any) share x's dtype and the row fits the
 * register plan; 0 to run the generic kernel. */
template <typename T>
static int norm_fwd_fast(const nb_cuda_ctx *ctx, const nb_kview *y, const nb_kview *x,
                         const nb_kview *w, const nb_kview *b, const nb_norm_args *a) {
  if ((w && w->dtype != x->dtype) || (b && b->dtype != x->dtype)) return 0;
  const void *ptrs[4] = {y->data, x->data, w ? w->data : NULL, b ? b->data : NULL};
  int vec = rows_vec(nb_vec_width<T>::value, a->D, ptrs, 4), tpr;
  /* 3 or 2 packs per thread (a row and the next in about 48 registers),
   * else 4 or 1, the fewest idle slots; 8 (no prefetch) for rows over 4096
   * packs */
  static const int cand[] = {3, 2, 4, 1, 8};
  int force = norm_env("NABLA_NORM_FWD_NCH", 0), pf = norm_env("NABLA_NORM_PF", 0);
  int nch = pf ? norm_plan(a->D / vec, cand, 4, 768, force, &tpr) : 0; /* PF: 768-thread bound */
  if (nch > 3) nch = 0;           /* 4 packs and the next row's 4 spill */
  /* The prefetching grid is one resident wave (about 768 threads per SM at
   * 80 registers), each group walking rows in a fixed stride: with under 16
   * rows per group the last, partly idle round costs more than the overlap
   * gains, and independent blocks (no prefetch) balance better. */
  if (nch && a->R < 16 * (int64_t)ctx->n_sm * (768 / tpr)) nch = 0;
  if (!nch) {
    pf = 0;
    nch = norm_plan(a->D / vec, cand, 4, 1024, force, &tpr);
  }
  if (!nch) nch = norm_plan(a->D / vec, cand + 4, 1, 1024, force, &tpr);
  if (!nch) return 0;
  const T *wp = w ? (const T *)w->data : NULL, *bp = b ? (const T *)b->data : NULL;
  T *yp = (T *)y->data;
  const T *xp = (const T *)x->data;
  if (vec > 1) {
    const int V = nb_vec_width<T>::value;
    if (pf) { NB_NORM_NCH_SWITCH(nch, NCH, norm_fwd_rows_launch<T, V, (NCH > 3 ? 3 : NCH), 1>(ctx, yp, xp, wp, bp, a->mean, a->rstd, a->R, (int)a->D, tpr, a->eps, a->rms)); }
    else { NB_NORM_NCH_SWITCH(nch, NCH, norm_fwd_rows_launch<T, V, NCH, 0>(ctx, yp, xp, wp, bp, a->mean, a->rstd, a->R, (int)a->D, tpr, a->eps, a->rms)); }
  } else {
    if (pf) { NB_NORM_NCH_SWITCH(nch, NCH, norm_fwd_rows_launch<T, 1, (NCH > 3 ? 3 : NCH), 1>(ctx, yp, xp, wp, bp, a->mean, a->rstd, a->R, (int)a->D, tpr, a->eps, a->rms)); }
    else { NB_NORM_NCH_SWITCH(nch, NCH, norm_fwd_rows_launch<T, 1, NCH, 0>(ctx, yp, xp, wp, bp, a->mean, a->rstd, a->R, (int)a->D, tpr, a->eps, a->rms)); }
  }
  return 1;
}

/* The fused backward, then the partials' reduction into dw and db. One
 * resident wave of blocks, so the partials stay small (blocks x 2D). */
template <typename T, int VEC, int NCH, int PF>
static nb_status norm_bwd_rows_run(const nb_cuda_ctx *ctx, const nb_kview *dx, const nb_kview *dw,
                                   const nb_kview *db, const T *dy, const T *x, const T *w,
                                   const nb_norm_args *a, int tpr) {
  typedef typename nb_acc<T>::type A;
  auto k = nb_norm_bwd_rows<T, VEC, NCH, PF>;
  int maxth = NCH == 1 ? 768 : 512, G = maxth / tpr, want = dw || db;
  if (tpr > 32 && G > 15) G = 15; /* named barriers 1..15 */
  int th = G * tpr;
  size_t smem = want && G > 1 ? 2 * (size_t)a->D * sizeof(A) : 0;
  if (smem > 48 * 1024)
    NB_CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                "norm_bwd (shared memory)");
  int occ = rows_occupancy((const void *)k, th, smem);
  int64_t blocks = (a->R + G - 1) / G, cap = (int64_t)ctx->n_sm * occ;
  int nblk = (int)(blocks < cap ? blocks : cap);
  size_t pbytes = want ? (size_t)nblk * 2 * (size_t)a->D * sizeof(A) : 0;
  A *part = want ? (A *)nb_cuda_scratch(ctx, pbytes) : NULL;
  if (want && !part) return nb_last_status();
  k<<<nblk, th, smem, ctx->stream>>>((T *)dx->data, dy, x, w, (const A *)a->mean,
                                     (const A *)a->rstd, a->R, (int)a->D, tpr, a->rms, part);
  nb_status st = nb_cuda_launch_check(a->rms ? "rms_norm_bwd" : "layer_norm_bwd");
  if (!st && want) {
    unsigned cols = (unsigned)((2 * a->D + 31) / 32);
    nb_norm_dwdb_finish<A><<<cols, 1024, 0, ctx->stream>>>(
        part, nblk, (int)a->D, dw ? dw->data : NULL, dw ? (int)dw->dtype : 0,
        db ? db->data : NULL, db ? (int)db->dtype : 0);
    st = nb_cuda_launch_check("norm_bwd (dw/db)");
  }
  if (part) nb_cuda_scratch_free(ctx, part, pbytes);
  return st;
}

/* Fast backward when dx is wanted, w shares x's dtype and the two cached
 * rows (x, dy) fit 4 packs per thread; 0 otherwise. One pack per thread
 * where a row has at most 1024 packs (16 accumulators, 1024-thread blocks),
 * else the fewest idle slots at 2, 3 or 4 packs of up to 512 threads. */
template <typename T>
static int norm_bwd_fast(const nb_cuda_ctx *ctx, const nb_kview *dx, const nb_kview *dw,
                         const nb_kview *db, const nb_kview *dy, const nb_kview *x,
                         const nb_kview *w, const nb_norm_args *a, nb_status *st) {
  if (w && w->dtype != x->dtype) return 0;
  const void *ptrs[4] = {dx->data, dy->data, x->data, w ? w->data : NULL};
  int vec = rows_vec(nb_vec_width<T>::value, a->D, ptrs, 4), tpr;
  int64_t nvec = a->D / vec;
  int force = norm_env("NABLA_NORM_BWD_NCH", 0);
  /* 2 packs per thread (512-thread blocks) or 1 (768-thread blocks), the
   * fewer idle slots, 2 on a tie; 3 or 4 only for rows over 1024 packs */
  static const int one[] = {1}, two[] = {2}, more[] = {3, 4};
  int t1 = 0, t2 = 0, nch;
  int n1 = norm_plan(nvec, one, 1, 768, force, &t1), n2 = norm_plan(nvec, two, 1, 512, force, &t2);
  if (n1 && (!n2 || t1 < 2 * t2)) { nch = 1; tpr = t1; }
  else if (n2) { nch = 2; tpr = t2; }
  else nch = norm_plan(nvec, more, 2, 512, force, &tpr);
  if (!nch) return 0;
  int pf = norm_env("NABLA_NORM_PF", 0) && nch <= 2; /* 3 or 4 packs and the next row's spill */
  const T *wp = w ? (const T *)w->data : NULL, *dyp = (const T *)dy->data, *xp = (const T *)x->data;
  if (vec > 1) {
    const int V = nb_vec_width<T>::value;
    if (pf) { NB_NORM_NCH4_SWITCH(nch, NCH, *st = norm_bwd_rows_run<T, V, (NCH > 2 ? 2 : NCH), 1>(ctx, dx, dw, db, dyp, xp, wp, a, tpr)); }
    else { NB_NORM_NCH4_SWITCH(nch, NCH, *st = norm_bwd_rows_run<T, V, NCH, 0>(ctx, dx, dw, db, dyp, xp, wp, a, tpr)); }
  } else {
    if (pf) { NB_NORM_NCH4_SWITCH(nch, NCH, *st = norm_bwd_rows_run<T, 1, (NCH > 2 ? 2 : NCH), 1>(ctx, dx, dw, db, dyp, xp, wp, a, tpr)); }
    else { NB_NORM_NCH4_SWITCH(nch, NCH, *st = norm_bwd_rows_run<T, 1, NCH, 0>(ctx, dx, dw, db, dyp, xp, wp, a, tpr)); }
  }
  return 1;
}

/* The saved statistics are nb_acc<T> of x's dtype: f64 for f64, else f32. */
static nb_status norm_stats_ok(const char *op, const nb_kview *x, const nb_kview *mean,
                               const nb_kview *rstd, int rms) {
  nb_dtype want = x->dtype == NB_F64 ? NB_F64 : NB_F32;
  if (rstd->dtype == want && (rms || !mean || mean->dtype == want)) return NB_OK;
  return nb_error_set(NB_ERR_DTYPE, "%s: saved statistics rstd %s, mean %s for a %s input (expected %s)",
                      op, nb_dtype_name(rstd->dtype), mean && !rms ? nb_dtype_name(mean->dtype) : "none",
                      nb_dtype_name(x->dtype), nb_dtype_name(want));
}

extern "C" nb_status nb_cuda_norm_fwd(const nb_kview *y, const nb_kview *mean,
                                      const nb_kview *rstd, const nb_kview *x, const nb_kview *w,
                                      const nb_kview *b, double eps, int rms) {
  int nd = x->ndim;
  nb_norm_args a;
  a.D = nd ? x->shape[nd - 1] : 1;
  a.R = a.D ? nb_kview_numel(x) / a.D : 0;
  if (a.R == 0 || a.D == 0) return NB_OK;
  nb_status st = norm_stats_ok(rms ? "rms_norm" : "layer_norm", x, mean, rstd, rms);
  if (st) return st;
  nb_cuda_ctx ctx;
  if ((st = nb_cuda_enter(y->data, rms ? "rms_norm" : "layer_norm", &ctx))) return st;
  a.w = w ? w->data : NULL;
  a.b = b && !rms ? b->data : NULL;
  a.wdt = w ? (int)w->dtype : 0;
  a.bdt = b ? (int)b->dtype : 0;
  a.mean = mean && !rms ? mean->data : NULL;
  a.rstd = rstd->data;
  a.eps = eps;
  a.rms = rms;
  int fast = 0;
  NB_CUDA_FLOAT_SWITCH(x->dtype, T, fast = norm_fwd_fast<T>(&ctx, y, x, w, a.b ? b : NULL, &a));
  if (fast) return nb_cuda_launch_check(rms ? "rms_norm" : "layer_norm");
  int th = nb_cuda_row_threads(a.D);
  NB_CUDA_FLOAT_SWITCH(x->dtype, T,
    nb_norm_fwd_kernel<T><<<row_grid(&ctx, a.R, th), th, 0, ctx.stream>>>((T *)y->data,
                                                                       (const T *)x->data, a));
  return nb_cuda_launch_check(rms ? "rms_norm" : "layer_norm");
}

/* dx = rstd * (g - mean(g) - xhat * mean(g*xhat)), g = dy*w; rms drops mean(g). */
template <typename T>
__global__ void __launch_bounds__(1024) nb_norm_bwd_dx_kernel(T *dx, const T *dy, const T *x, nb_norm_args a) {
  typedef typename nb_acc<T>::type A;
  __shared__ A smem[32];
  const int bd = blockDim.x, tid = threadIdx.x;
  for (int64_t r = blockIdx.x; r < a.R; r += gridDim.x) {
    const T *xr = x + r * a.D, *dyr = dy + r * a.D;
    T *dxr = dx + r * a.D;
    A mu = a.mean && !a.rms ? ((const A *)a.mean)[r] : (A)0, rs = ((const A *)a.rstd)[r];
    A sg = 0, sgx = 0;
    for (int64_t j = tid; j < a.D; j += bd) {
      A g = (A)nb_to_f(dyr[j]) * (A)nb_opt_load(a.w, a.wdt, j, 1.0);
      A xh = ((A)nb_to_f(xr[j]) - mu) * rs;
      sg += g;
      sgx += g * xh;
    }
    sg = nb_block_sum(sg, smem) / (A)a.D;
    sgx = nb_block_sum(sgx, smem) / (A)a.D;
    if (a.rms) sg = 0;
    for (int64_t j = tid; j < a.D; j += bd) {
      A g = (A)nb_to_f(dyr[j]) * (A)nb_opt_load(a.w, a.wdt, j, 1.0);
      A xh = ((A)nb_to_f(xr[j]) - mu) * rs;
      dxr[j] = nb_from_d<T>(rs * (g - sg - xh * sgx));
    }
  }
}

/* Column partials: part_w/part_b[s * D + d] = sums over the rows of split s. */
template <typename T>
__global__ void nb_norm_bwd_dw_kernel(const T *dy, const T *x, nb_norm_args a, int64_t rows_per,
                                      double *part_w, double *part_b) {
  typedef typename nb_acc<T>::type A;
  int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t s = blockIdx.y;
  if (d >= a.D) return;
  int64_t r0 = s * rows_per, r1 = r0 + rows_per < a.R ? r0 + rows_per : a.R;
  A aw = 0, ab = 0;
  for (int64_t r = r0; r < r1; r++) {
    A g = (A)nb_to_f(dy[r * a.D + d]);
    A mu = a.mean && !a.rms ? ((const A *)a.mean)[r] : (A)0;
    aw += g * (((A)nb_to_f(x[r * a.D + d]) - mu) * ((const A *)a.rstd)[r]);
    ab += g;
  }
  part_w[s * a.D + d] = aw;
  part_b[s * a.D + d] = ab;
}

__global__ void nb_norm_bwd_finish_kernel(int64_t D, int64_t S, const double *part_w,
                                          const double *part_b, void *dw, int dwdt, void *db,
                                          int dbdt) {
  int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= D) return;
  double sw = 0, sb = 0;
  for (int64_t s = 0; s < S; s++) {
    sw += part_w[s * D + d];
    sb += part_b[s * D + d];
  }
  if (dw) nb_store_any((char *)dw + d * nb_dt_size(dwdt), dwdt, sw);
  if (db) nb_store_any((char *)db + d * nb_dt_size(dbdt), dbdt, sb);
}

template <typename T>
static nb_status norm_dw_run(const nb_cuda_ctx *ctx, const nb_kview *dw, const nb_kview *db,
                             const nb_kview *dy, const nb_kview *x, const nb_norm_args *a) {
  int64_t cols = (a->D + 127) / 128;
  int64_t S = ((int64_t)ctx->n_sm * 8 + cols - 1) / cols;
  int64_t maxS = (a->R + 15) / 16;
  if (S > maxS) S = maxS;
  if (S > 65535) S = 65535;
  if (S < 1) S = 1;
  int64_t rows_per = (a->R + S - 1) / S;
  size_t bytes = (size_t)(S * a->D) * sizeof(double);
  double *pw = (double *)nb_cuda_scratch(ctx, 2 * bytes);
  if (!pw) return nb_last_status();
  double *pb = pw + S * a->D;
  nb_norm_bwd_dw_kernel<T><<<dim3((unsigned)cols, (unsigned)S), 128, 0, ctx->stream>>>(
      (const T *)dy->data, (const T *)x->data, *a, rows_per, pw, pb);
  nb_status st = nb_cuda_launch_check("norm_bwd (dw partials)");
  if (!st) {
    nb_norm_bwd_finish_kernel<<<(unsigned)cols, 128, 0, ctx->stream>>>(
        a->D, S, pw, pb, dw ? dw->data : NULL, dw ? (int)dw->dtype : 0, db ? db->data : NULL,
        db ? (int)db->dtype : 0);
    st = nb_cuda_launch_check("norm_bwd (dw finish)");
  }
  nb_cuda_scratch_free(ctx, pw, 2 * bytes);
  return st;
}

extern "C" nb_status nb_cuda_norm_bwd(const nb_kview *dx, const nb_kview *dw, const nb_kview *db,
                                      const nb_kview *dy, const nb_kview *x,
                                      const nb_kview *mean, const nb_kview *rstd,
                                      const nb_kview *w, int rms) {
  int nd = x->ndim;
  nb_norm_args a;
  a.D = nd ? x->shape[nd - 1] : 1;
  a.R = a.D ? nb_kview_numel(x) / a.D : 0;
  if (a.D == 0) return NB_OK;
  nb_status st = norm_stats_ok(rms ? "rms_norm_bwd" : "layer_norm_bwd", x, mean, rstd, rms);
  if (st) return st;
  nb_cuda_ctx ctx;
  if ((st = nb_cuda_enter(x->data, rms ? "rms_norm_bwd" : "layer_norm_bwd", &ctx))) return st;
  if (a.R == 0) { /* no rows: the parameter gradients are zero */
    if (dw && (st = nb_cuda_fill(dw, 0.0))) return st;
    if (db && (st = nb_cuda_fill(db, 0.0))) return st;
    return NB_OK;
  }
  a.w = w ? w->data : NULL;
  a.b = NULL;
  a.wdt = w ? (int)w->dtype : 0;
  a.bdt = 0;
  a.mean = mean && !rms ? mean->data : NULL;
  a.rstd = rstd->data;
  a.eps = 0;
  a.rms = rms;
  if (dx) {
    int fast = 0;
    NB_CUDA_FLOAT_SWITCH(x->dtype, T,
      fast = norm_bwd_fast<T>(&ctx, dx, dw, db, dy, x, w, &a, &st));
    if (fast) return st;
  }
  int th = nb_cuda_row_threads(a.D);
  if (dx) {
    NB_CUDA_FLOAT_SWITCH(x->dtype, T,
      nb_norm_bwd_dx_kernel<T><<<row_grid(&ctx, a.R, th), th, 0, ctx.stream>>>(
          (T *)dx->data, (const T *)dy->data, (const T *)x->data, a));
    if ((st = nb_cuda_launch_check("norm_bwd (dx)"))) return st;
  }
  if (!dw && !db) return NB_OK;
  NB_CUDA_FLOAT_SWITCH(x->dtype, T, return norm_dw_run<T>(&ctx, dw, db, dy, x, &a));
  return NB_OK;
}
