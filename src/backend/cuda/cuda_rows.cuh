/* Shared pieces of the row kernels (softmax, norms, cross-entropy).
 *
 * Generic strided path: one block per row; the register row cache size,
 * online max/sum merging, row offsets, and the grid size for R rows.
 *
 * Contiguous fast path: a row of D elements is read as packs of VEC elements
 * (16 bytes when aligned, else single elements) by a group of tpr threads
 * (a warp, or up to 1024 threads); each thread keeps its NCH packs in
 * registers, so the row is read once. A block holds blockDim / tpr groups,
 * each with its own rows, reducing through shuffles and a named barrier of
 * its own (no block-wide barrier inside the row loop). */
#ifndef NB_CUDA_ROWS_CUH
#define NB_CUDA_ROWS_CUH
#include "backend/cuda/cuda_common.cuh"

#define NB_ROW_CACHE 8

/* Element size of a runtime dtype, on the device. */
__device__ __forceinline__ int nb_dt_size(int dt) {
  return dt == NB_F64 || dt == NB_I64 ? 8 : dt == NB_F32 || dt == NB_I32 ? 4 : dt == NB_U8 || dt == NB_BOOL ? 1 : 2;
}


template <typename A> __device__ __forceinline__ A nb_exp_(A x) { return exp(x); }
template <typename A> __device__ __forceinline__ A nb_log_(A x) { return log(x); }

/* Adds v to a thread's online (max m, sum s of exp(x - m)), rescaling s
 * when the max grows. A -inf v adds nothing: with m still -inf (the
 * thread has seen only masked values) exp(v - m) would be NaN. */
template <typename A, typename EX>
__device__ __forceinline__ void nb_online_add(A &m, A &s, A v, EX ex) {
  if (v > m) { s = s * ex(m - v) + (A)1; m = v; }
  else if (v != (A)-INFINITY) s += ex(v - m);
}
template <typename A> __device__ __forceinline__ void nb_online_add(A &m, A &s, A v) {
  nb_online_add(m, s, v, [](A d) { return nb_exp_(d); });
}

/* Merges a thread's online (max, sum of exp(x - max)) into the block's. */
template <typename A>
__device__ __forceinline__ void nb_online_merge(A &m, A &s, A *smem) {
  A M = nb_block_max(m, smem);
  A scaled = s == (A)0 ? (A)0 : s * nb_exp_(m - M);
  s = nb_block_sum(scaled, smem);
  m = M;
}

/* Row offsets of row r for the ops of a rows iterator. */
template <int N>
__device__ __forceinline__ void nb_row_offsets(const nb_iter &rows, int64_t r, int64_t *off) {
  nb_iter_offsets<N>(rows, r, off);
}

/* ---- contiguous fast path ------------------------------------------------ */
/* VEC elements of T loaded or stored as one access (16 bytes for VEC * size
 * == 16). Indexed only with compile-time constants, so it stays in registers. */
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) nb_pack {
  T v[VEC];
};

/* A pack's elements in the accumulation type. The 16-bit types convert
 * through volatile asm, one 32-bit word (two elements) at a time: the
 * compiler then re-converts the packed row in each pass instead of keeping
 * a converted copy live across the row's reductions (twice the registers,
 * which spilled). */
__device__ __forceinline__ void nb_unpack2(__nv_bfloat16, uint32_t w, float &lo, float &hi) {
  uint32_t l, h;
  asm volatile("shl.b32 %0, %2, 16;\n\tand.b32 %1, %2, 0xffff0000;" : "=r"(l), "=r"(h) : "r"(w));
  lo = __uint_as_float(l);
  hi = __uint_as_float(h);
}
__device__ __forceinline__ void nb_unpack2(__half, uint32_t w, float &lo, float &hi) {
  asm volatile("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.f32.f16 %0, a;\n\tcvt.f32.f16 %1, b;\n\t}"
               : "=f"(lo), "=f"(hi) : "r"(w));
}
/* never called: the 32- and 64-bit types take the plain branch */
__device__ __forceinline__ void nb_unpack2(float, uint32_t, float &, float &) {}
__device__ __forceinline__ void nb_unpack2(double, uint32_t, double &, double &) {}
template <typename T, int VEC, typename A>
__device__ __forceinline__ void nb_unpack(const nb_pack<T, VEC> &p, A *f) {
  if (sizeof(T) == 2 && VEC % 2 == 0) {
    const uint32_t *u = (const uint32_t *)p.v;
#pragma unroll
    for (int i = 0; i < VEC / 2; i++) nb_unpack2(T(), u[i], f[2 * i], f[2 * i + 1]);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; e++) f[e] = (A)nb_to_f(p.v[e]);
  }
}

/* Elements per 16-byte access. */
template <typename T> struct nb_vec_width { enum { value = 16 / sizeof(T) }; };

/* e^x of a float from the hardware 2^x (ex2.approx.ftz, about 2 ulp
 * relative for normal results): x log2 e is rounded to p, and the rounding
 * error of that product, c = x log2 e - p (exact from one fma, plus x times
 * the error of the constant), is put back as 2^p (1 + c ln 2). Without the
 * correction the error grows with |x| (x = -80: 2^-24 * 80 * 1.44, about 115
 * ulp); with it the result stays within about 3 ulp of e^x (the standard
 * expf's 2), at two fmas and a multiply more. Results below 2^-126 flush to
 * zero: only used where such a value is a negligible term of a sum or a
 * probability under that size. */
#define NB_LOG2E_F 1.44269502162933349609375f  /* log2(e) rounded to f32 */
#define NB_LOG2E_LO 1.925962989e-08f           /* log2(e) - NB_LOG2E_F */
__device__ __forceinline__ float nb_ex2_ftz(float p) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(p));
  return y;
}
__device__ __forceinline__ float nb_exp_acc(float x) {
  float p = x * NB_LOG2E_F;
  float c = fmaf(x, NB_LOG2E_LO, fmaf(x, NB_LOG2E_F, -p));
  float y = nb_ex2_ftz(p);
  return c == c ? fmaf(y, c * 0.693147180559945309f, y) : y; /* x = +-inf: c is NaN, y exact */
}

/* exp(f - m) for softmax rows, the row maximum subtracted first (f - m is
 * exact when f and m are within a factor of two, as they are for rows of
 * large logits). Rows stored in f32 (PREC = 1) take nb_exp_acc. Rows stored
 * in 16 bits take the bare ex2 of (f - m) log2 e: its error (below 2^-24 *
 * 1.44 |f - m| + 2 ulp of f32, under 1e-5 relative for any representable
 * probability) stays far under the output's rounding (2^-11 of f16, 2^-8 of
 * bf16). f64: exact. */
template <int PREC> __device__ __forceinline__ float nb_row_exp(float f, float m) {
  return PREC ? nb_exp_acc(f - m) : nb_ex2_ftz((f - m) * NB_LOG2E_F);
}
template <int PREC> __device__ __forceinline__ double nb_row_exp(double f, double m) { return exp(f - m); }
/* PREC for storage type T: 1 for f32 (and f64, which ignores it). */
template <typename T> struct nb_row_prec { enum { value = sizeof(T) >= 4 }; };

/* Pack loads and stores for rows read once and written once. 16-byte packs
 * load through the non-coherent path without L1 allocation (the operands
 * are read-only for the kernel's life) and, with STREAM, store with the
 * evict-first hint (output larger than what L2 would keep anyway). Other
 * packs take plain accesses. */
template <typename P> __device__ __forceinline__ P nb_ld_row(const P *p) {
  if (sizeof(P) == 16) {
    uint4 u;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
    P r;
    *reinterpret_cast<uint4 *>(&r) = u;
    return r;
  }
  return *p;
}
template <int STREAM, typename P> __device__ __forceinline__ void nb_st_row(P *p, const P &v) {
  if (STREAM && sizeof(P) == 16) __stcs(reinterpret_cast<uint4 *>(p), *reinterpret_cast<const uint4 *>(&v));
  else *p = v;
}

/* Named barrier over nthreads (a multiple of 32) threads of the block. */
__device__ __forceinline__ void nb_bar_sync(int id, int nthreads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

/* Sum (MAX = 0) or max (MAX = 1) over a row group of tpr threads; every
 * thread of the group gets the result. sm: the group's tpr/32 slots; bar:
 * the group's barrier id (1..15). The group's threads are consecutive and
 * warp-aligned; tpr is any multiple of 32 (groups of 3 warps serve rows of
 * 96 packs, such as 768 bf16 values). */
template <int MAX, typename A>
__device__ __forceinline__ A nb_grp_reduce(A v, A *sm, int tpr, int bar) {
  v = MAX ? nb_warp_max(v) : nb_warp_sum(v);
  if (tpr == 32) return v;
  int lane = threadIdx.x & 31, w = (threadIdx.x % tpr) >> 5;
  nb_bar_sync(bar, tpr); /* earlier readers of the slots are done */
  if (lane == 0) sm[w] = v;
  nb_bar_sync(bar, tpr);
  A u = lane < (tpr >> 5) ? sm[lane] : sm[0];
  if (!MAX && lane >= (tpr >> 5)) u = (A)0;
  return MAX ? nb_warp_max(u) : nb_warp_sum(u);
}

/* Two sums at once (one pair of barriers); sm holds 2 * tpr/32 slots. */
template <typename A>
__device__ __forceinline__ void nb_grp_sum2(A &a, A &b, A *sm, int tpr, int bar) {
  a = nb_warp_sum(a);
  b = nb_warp_sum(b);
  if (tpr == 32) return;
  int lane = threadIdx.x & 31, w = (threadIdx.x % tpr) >> 5, nw = tpr >> 5;
  nb_bar_sync(bar, tpr);
  if (lane == 0) { sm[w] = a; sm[nw + w] = b; }
  nb_bar_sync(bar, tpr);
  a = nb_warp_sum(lane < nw ? sm[lane] : (A)0);
  b = nb_warp_sum(lane < nw ? sm[nw + lane] : (A)0);
}

/* Merges the warps' (max, sum of exp(x - max)) pairs of a row group, every
 * warp holding its own pair in all lanes: one barrier round, one exp per
 * lane (PREC as nb_row_exp); every thread gets the row's pair. sm holds
 * 2 * tpr/32 slots. */
template <int PREC, typename A>
__device__ __forceinline__ void nb_grp_merge_warps(A &m, A &s, A *sm, int tpr, int bar) {
  int lane = threadIdx.x & 31, w = (threadIdx.x % tpr) >> 5, nw = tpr >> 5;
  nb_bar_sync(bar, tpr); /* earlier readers of the slots are done */
  if (lane == 0) { sm[w] = m; sm[nw + w] = s; }
  nb_bar_sync(bar, tpr);
  A mw = lane < nw ? sm[lane] : (A)-INFINITY, sw = lane < nw ? sm[nw + lane] : (A)0;
  m = nb_warp_max(mw);
  s = nb_warp_sum(sw == (A)0 ? (A)0 : sw * nb_row_exp<PREC>(mw, m));
}

/* Packs per thread and threads per row (a multiple of 32, at most max_tpr)
 * for a row of nvec packs at nch packs per thread; 0 when it does not fit. */
static inline int nb_rows_fit(int64_t nvec, int nch, int max_tpr, int *tpr) {
  int64_t t = (nvec + nch - 1) / nch;
  t = (t + 31) / 32 * 32;
  if (t > max_tpr) return 0;
  *tpr = (int)t;
  return 1;
}

/* Plan for a row of nvec packs: threads per row (power of two, 32..max_tpr,
 * about per packs each) and packs per thread (1, 2, 4 or 8, at most
 * max_nch). 0 when the row does not fit in registers that way. */
static inline int nb_rows_plan(int64_t nvec, int max_tpr, int max_nch, int per, int *tpr,
                               int *nch) {
  int t = 32, c = 1;
  while (t < max_tpr && (int64_t)t * per < nvec) t <<= 1;
  while ((int64_t)c * t < nvec && c < 8) c <<= 1;
  if ((int64_t)c * t < nvec || c > max_nch) return 0;
  *tpr = t;
  *nch = c;
  return 1;
}

/* 1 when the view is row-major contiguous (size-1 axes ignored): rows of
 * its last axis follow each other with stride D. */
static inline int nb_view_rows_contig(const nb_kview *v) {
  int64_t expect = 1;
  for (int d = v->ndim - 1; d >= 0; d--) {
    if (v->shape[d] != 1 && v->strides[d] != expect) return 0;
    expect *= v->shape[d];
  }
  return 1;
}

static inline unsigned row_grid(const nb_cuda_ctx *ctx, int64_t R, int threads) {
  int64_t per_sm = 2048 / threads;
  int64_t cap = (int64_t)ctx->n_sm * (per_sm < 1 ? 1 : per_sm) * 4;
  return (unsigned)(R < cap ? R : cap);
}

/* Element-aligned packs: VEC-wide when D is a multiple of VEC and every
 * pointer is 16-byte aligned, else single elements. */
static inline int rows_vec(int vec, int64_t D, const void *const *ptrs, int n) {
  if (D % vec) return 1;
  for (int i = 0; i < n; i++)
    if (ptrs[i] && !nb_cuda_aligned16(ptrs[i])) return 1;
  return vec;
}
#endif
