/* Index kernels: index_select, index_add, gather, scatter_add.
 *
 * A thread handles one element; its coordinate along the indexed axis picks
 * the index. A bad index (outside [0, size); negatives are not wrapped)
 * never touches memory: the element is skipped (gathers write 0) and the
 * device flag records the value; the host wrapper then reads the flag (one
 * stream sync) and returns NB_ERR_INDEX (cuda_api.h describes the deferred
 * mode).
 *
 * Whole rows: when the operands are contiguous and nothing precedes the
 * indexed axis (an embedding table), index_select and the deterministic
 * index_add move rows with one warp per row and 16-byte vectors.
 *
 * Accumulation, non-deterministic: atomics (f16/bf16 atomics round each
 * addition, as the CPU does). Deterministic:
 *   index_add:   the indices are sorted with their positions (a stable
 *                radix sort of 32-bit keys over only the bits an index
 *                needs, CUB's), so equal indices form runs in position
 *                order; one warp per run (whole rows) or one thread per
 *                (run, lane) then adds the run in that order into the
 *                destination, the CPU's order, so f32/f64 results equal the
 *                CPU's bit for bit.
 *   scatter_add: one thread per index element that is the first of its
 *                value in its line sums the line's matching elements in
 *                position order: O(line length) per element, meant for the
 *                short lines of gather backward; use the atomic path for
 *                long lines. */
#include <cub/device/device_radix_sort.cuh>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

#define NB_GRID_LOOP(i, n)                                                          \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);         \
       i += (int64_t)gridDim.x * blockDim.x)

/* Iteration over a full shape that also reports the coordinate on axis. */
struct nb_ix {
  int ndim, axis, small;
  int64_t size[NB_MAX_DIMS];
  nb_fastdiv div[NB_MAX_DIMS];
  int64_t st[3][NB_MAX_DIMS];
};

/* views[k] supplies strides; zero_axis[k] drops operand k's axis stride. */
static void ix_make(nb_ix *ix, int ndim, const int64_t *shape, int axis, int nops,
                    const nb_kview *const *views, const int *zero_axis) {
  memset(ix, 0, sizeof *ix);
  ix->ndim = ndim;
  ix->axis = axis;
  int64_t total = 1;
  for (int d = 0; d < ndim; d++) {
    ix->size[d] = shape[d];
    total *= shape[d];
    for (int k = 0; k < nops; k++) ix->st[k][d] = zero_axis[k] && d == axis ? 0 : views[k]->strides[d];
  }
  ix->small = total < ((int64_t)1 << 32);
  for (int d = 0; d < ndim; d++) ix->div[d] = nb_fastdiv_make(ix->small ? (uint32_t)shape[d] : 1u);
}

template <int N>
__device__ __forceinline__ int64_t nb_ix_offsets(const nb_ix &ix, int64_t i, int64_t *off) {
  int64_t ja = 0;
#pragma unroll
  for (int k = 0; k < N; k++) off[k] = 0;
  for (int d = ix.ndim - 1; d >= 0; d--) {
    int64_t c;
    if (ix.small) {
      uint32_t q = d ? nb_fastdiv_div(ix.div[d], (uint32_t)i) : 0;
      c = d ? (int64_t)((uint32_t)i - q * ix.div[d].d) : i;
      i = q;
    } else {
      int64_t q = d ? i / ix.size[d] : 0;
      c = d ? i - q * ix.size[d] : i;
      i = q;
    }
    if (d == ix.axis) ja = c;
#pragma unroll
    for (int k = 0; k < N; k++) off[k] += c * ix.st[k][d];
  }
  return ja;
}

__device__ __forceinline__ void nb_ix_bad(int64_t *flag, int64_t v) {
  if (atomicCAS((unsigned long long *)flag, 0ull, 1ull) == 0ull) flag[1] = v;
}

/* ---- index_select and gather: copies by element size ---------------------- */
template <typename E>
__global__ void nb_index_select_kernel(E *out, const E *x, const char *idx, int idt, int64_t sidx,
                                       int64_t xsa, int64_t lim, nb_ix ix, int64_t n,
                                       int64_t *flag) {
  int ies = idt == NB_I64 ? 8 : 4;
  NB_GRID_LOOP(i, n) {
    int64_t off[2];
    int64_t j = nb_ix_offsets<2>(ix, i, off);
    int64_t t = nb_load_int(idx + j * sidx * ies, idt);
    if (t < 0 || t >= lim) {
      nb_ix_bad(flag, t);
      out[off[0]] = (E)0;
    } else {
      out[off[0]] = x[off[1] + t * xsa];
    }
  }
}

template <typename E>
__global__ void nb_gather_kernel(E *out, const E *x, const char *idx, int idt, int64_t xsa,
                                 int64_t lim, nb_ix ix, int64_t n, int64_t *flag) {
  int ies = idt == NB_I64 ? 8 : 4;
  NB_GRID_LOOP(i, n) {
    int64_t off[3];
    nb_ix_offsets<3>(ix, i, off);
    int64_t t = nb_load_int(idx + off[2] * ies, idt);
    if (t < 0 || t >= lim) {
      nb_ix_bad(flag, t);
      out[off[0]] = (E)0;
    } else {
      out[off[0]] = x[off[1] + t * xsa];
    }
  }
}

/* ---- whole rows ---------------------------------------------------------- */
/* The row layout: out and x (or src) contiguous with only unit axes before
 * axis, so row j of the indexed axis is L consecutive elements. */
static int idx_rows(const nb_kview *a, const nb_kview *b, int axis, int64_t *L) {
  if (!nb_kview_is_contiguous(a) || !nb_kview_is_contiguous(b)) return 0;
  for (int d = 0; d < axis; d++)
    if (a->shape[d] != 1) return 0;
  *L = 1;
  for (int d = axis + 1; d < a->ndim; d++) *L *= a->shape[d];
  return 1;
}

/* Elements per 16-byte vector when every row start of both operands is
 * 16-byte aligned (rows of L elements of size es), else 1. */
static int idx_row_vec(const void *a, const void *b, int64_t L, size_t es) {
  int v = (int)(16 / es);
  if (((uintptr_t)a | (uintptr_t)b) & 15u) return 1;
  return ((size_t)L * es) % 16 == 0 ? v : 1;
}

#define NB_ROW_WARPS 8 /* warps per block of the row kernels */

/* out row j = x row idx[j]; W is a word of the copy (an element, or 16
 * bytes); L counts words. One warp per row. */
template <typename W>
__global__ void __launch_bounds__(NB_ROW_WARPS * 32)
nb_select_rows_kernel(W *out, const W *x, const char *idx, int idt, int64_t sidx, int64_t J,
                      int64_t L, int64_t lim, int64_t *flag) {
  int ies = idt == NB_I64 ? 8 : 4, lane = threadIdx.x & 31;
  for (int64_t j = (int64_t)blockIdx.x * NB_ROW_WARPS + (threadIdx.x >> 5); j < J;
       j += (int64_t)gridDim.x * NB_ROW_WARPS) {
    int64_t t = nb_load_int(idx + j * sidx * ies, idt);
    W *o = out + j * L;
    if (t < 0 || t >= lim) {
      if (lane == 0) nb_ix_bad(flag, t);
      const W z{};
      for (int64_t c = lane; c < L; c += 32) o[c] = z;
      continue;
    }
    const W *r = x + t * L;
    for (int64_t c = lane; c < L; c += 32) o[c] = r[c];
  }
}

static unsigned idx_row_blocks(const nb_cuda_ctx *ctx, int64_t rows) {
  int64_t b = (rows + NB_ROW_WARPS - 1) / NB_ROW_WARPS, cap = (int64_t)ctx->n_sm * 64;
  return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

static nb_status select_rows(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *x,
                             int axis, const nb_kview *idx, int64_t L) {
  size_t es = nb_dtype_size(out->dtype);
  int64_t J = out->shape[axis], sidx = idx->ndim ? idx->strides[0] : 0;
  unsigned g = idx_row_blocks(ctx, J);
  if (idx_row_vec(out->data, x->data, L, es) > 1)
    nb_select_rows_kernel<int4><<<g, NB_ROW_WARPS * 32, 0, ctx->stream>>>(
        (int4 *)out->data, (const int4 *)x->data, (const char *)idx->data, idx->dtype, sidx, J,
        (int64_t)(L * es / 16), x->shape[axis], nb_cuda_flag(ctx));
  else
    NB_CUDA_SIZE_SWITCH(es, E,
      nb_select_rows_kernel<E><<<g, NB_ROW_WARPS * 32, 0, ctx->stream>>>(
          (E *)out->data, (const E *)x->data, (const char *)idx->data, idx->dtype, sidx, J, L,
          x->shape[axis], nb_cuda_flag(ctx)));
  return nb_cuda_launch_check("index_select (rows)");
}

static nb_status idx_dtype_ok(const char *op, const nb_kview *idx) {
  if (idx->dtype == NB_I64 || idx->dtype == NB_I32) return NB_OK;
  return nb_error_set(NB_ERR_DTYPE, "cuda %s: index dtype %s (expected i64)", op,
                      nb_dtype_name(idx->dtype));
}

extern "C" nb_status nb_cuda_index_select(const nb_kview *out, const nb_kview *x, int axis,
                                          const nb_kview *idx) {
  int64_t n = nb_kview_numel(out);
  if (n == 0) return NB_OK;
  nb_status st = idx_dtype_ok("index_select", idx);
  if (st) return st;
  nb_cuda_ctx ctx;
  if ((st = nb_cuda_enter(out->data, "index_select", &ctx))) return st;
  int64_t L;
  if (idx_rows(out, x, axis, &L)) {
    if ((st = select_rows(&ctx, out, x, axis, idx, L))) return st;
    return nb_cuda_flag_check(&ctx, "index_select", x->shape[axis]);
  }
  const nb_kview *vs[2] = {out, x};
  const int za[2] = {0, 1};
  nb_ix ix;
  ix_make(&ix, out->ndim, out->shape, axis, 2, vs, za);
  int64_t sidx = idx->ndim ? idx->strides[0] : 0;
  unsigned g = nb_cuda_blocks(&ctx, n, NB_CUDA_THREADS);
  NB_CUDA_SIZE_SWITCH(nb_dtype_size(out->dtype), E,
    nb_index_select_kernel<E><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>(
        (E *)out->data, (const E *)x->data, (const char *)idx->data, idx->dtype, sidx,
        x->strides[axis], x->shape[axis], ix, n, nb_cuda_flag(&ctx)));
  if ((st = nb_cuda_launch_check("index_select"))) return st;
  return nb_cuda_flag_check(&ctx, "index_select", x->shape[axis]);
}

extern "C" nb_status nb_cuda_gather(const nb_kview *out, const nb_kview *x, int axis,
                                    const nb_kview *idx) {
  int64_t n = nb_kview_numel(out);
  if (n == 0) return NB_OK;
  nb_status st = idx_dtype_ok("gather", idx);
  if (st) return st;
  nb_cuda_ctx ctx;
  if ((st = nb_cuda_enter(out->data, "gather", &ctx))) return st;
  const nb_kview *vs[3] = {out, x, idx};
  const int za[3] = {0, 1, 0};
  nb_ix ix;
  ix_make(&ix, out->ndim, out->shape, axis, 3, vs, za);
  int64_t xsa = out->ndim ? x->strides[axis] : 0, lim = out->ndim ? x->shape[axis] : 1;
  unsigned g = nb_cuda_blocks(&ctx, n, NB_CUDA_THREADS);
  NB_CUDA_SIZE_SWITCH(nb_dtype_size(out->dtype), E,
    nb_gather_kernel<E><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>(
        (E *)out->data, (const E *)x->data, (const char *)idx->data, idx->dtype, xsa, lim, ix, n,
        nb_cuda_flag(&ctx)));
  if ((st = nb_cuda_launch_check("gather"))) return st;
  return nb_cuda_flag_check(&ctx, "gather", lim);
}

/* ---- atomic accumulation ---------------------------------------------------- */
__device__ __forceinline__ void nb_atomic_add(float *p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void nb_atomic_add(double *p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void nb_atomic_add(__half *p, __half v) { atomicAdd(p, v); }
__device__ __forceinline__ void nb_atomic_add(__nv_bfloat16 *p, __nv_bfloat16 v) { atomicAdd(p, v); }
__device__ __forceinline__ void nb_atomic_add(int64_t *p, int64_t v) {
  atomicAdd((unsigned long long *)p, (unsigned long long)v);
}
__device__ __forceinline__ void nb_atomic_add(int32_t *p, int32_t v) { atomicAdd((int *)p, (int)v); }
/* bytes: compare-and-swap on the aligned 32-bit word holding the byte */
__device__ __forceinline__ void nb_atomic_add(uint8_t *p, uint8_t v) {
  unsigned *w = (unsigned *)((uintptr_t)p & ~(uintptr_t)3);
  unsigned sh = ((unsigned)(uintptr_t)p & 3u) * 8u, old = *w, assumed;
  do {
    assumed = old;
    unsigned b = ((assumed >> sh) + v) & 0xffu;
    old = atomicCAS(w, assumed, (assumed & ~(0xffu << sh)) | (b << sh));
  } while (old != assumed);
}

/* index_add over src's shape: ops src (full), out (axis stride 0). */
template <typename T>
__global__ void nb_index_add_atomic_kernel(T *out, const T *src, const char *idx, int idt,
                                           int64_t sidx, int64_t osa, int64_t lim, nb_ix ix,
                                           int64_t n, int64_t *flag) {
  int ies = idt == NB_I64 ? 8 : 4;
  NB_GRID_LOOP(i, n) {
    int64_t off[2];
    int64_t j = nb_ix_offsets<2>(ix, i, off);
    int64_t t = nb_load_int(idx + j * sidx * ies, idt);
    if (t < 0 || t >= lim) nb_ix_bad(flag, t);
    else nb_atomic_add(out + off[1] + t * osa, src[off[0]]);
  }
}

/* scatter_add over idx's shape: ops idx, src, out (axis stride 0). */
template <typename T>
__global__ void nb_scatter_add_atomic_kernel(T *out, const T *src, const char *idx, int idt,
                                             int64_t osa, int64_t lim, nb_ix ix, int64_t n,
                                             int64_t *flag) {
  int ies = idt == NB_I64 ? 8 : 4;
  NB_GRID_LOOP(i, n) {
    int64_t off[3];
    nb_ix_offsets<3>(ix, i, off);
    int64_t t = nb_load_int(idx + off[0] * ies, idt);
    if (t < 0 || t >= lim) nb_ix_bad(flag, t);
    else nb_atomic_add(out + off[2] + t * osa, src[off[1]]);
  }
}

/* ---- deterministic scatter_add --------------------------------------------- */
template <typename T>
__device__ __forceinline__ T nb_acc_store(typename nb_acc<T>::type v) { return nb_from_d<T>(v); }
template <> __device__ __forceinline__ int64_t nb_acc_store<int64_t>(int64_t v) { return v; }
template <> __device__ __forceinline__ int32_t nb_acc_store<int32_t>(int64_t v) { return (int32_t)(uint32_t)v; }
template <> __device__ __forceinline__ uint8_t nb_acc_store<uint8_t>(int64_t v) { return (uint8_t)v; }

template <typename T>
__global__ void nb_scatter_add_det_kernel(T *out, const T *src, const char *idx, int idt,
                                          int64_t osa, int64_t lim, nb_ix ix, int64_t n,
                                          int64_t line, int64_t *flag) {
  typedef typename nb_acc<T>::type A;
  int ies = idt == NB_I64 ? 8 : 4;
  const int64_t isa = ix.st[0][ix.axis], ssa = ix.st[1][ix.axis];
  NB_GRID_LOOP(i, n) {
    int64_t off[3];
    int64_t j = nb_ix_offsets<3>(ix, i, off);
    int64_t ib = off[0] - j * isa, sb = off[1] - j * ssa; /* start of the line */
    int64_t t = nb_load_int(idx + off[0] * ies, idt);
    if (t < 0 || t >= lim) {
      nb_ix_bad(flag, t);
      continue;
    }
    int first = 1;
    for (int64_t k = 0; k < j && first; k++) first = nb_load_int(idx + (ib + k * isa) * ies, idt) != t;
    if (!first) continue;
    T *dst = out + off[2] + t * osa;
    A acc = nb_to_f(*dst);
    for (int64_t k = j; k < line; k++)
      if (nb_load_int(idx + (ib + k * isa) * ies, idt) == t) acc += nb_to_f(src[sb + k * ssa]);
    *dst = nb_acc_store<T>(acc);
  }
}

/* ---- deterministic index_add: stable sort of the indices -------------------- */
/* keys[j] = idx[j] (bad indices become lim and sort last), pos[j] = j. */
__global__ void nb_index_keys_kernel(uint32_t *keys, uint32_t *pos, const char *idx, int idt,
                                     int64_t sidx, int64_t J, int64_t lim, int64_t *flag) {
  int ies = idt == NB_I64 ? 8 : 4;
  NB_GRID_LOOP(j, J) {
    int64_t t = nb_load_int(idx + j * sidx * ies, idt);
    if (t < 0 || t >= lim) {
      nb_ix_bad(flag, t);
      t = lim;
    }
    keys[j] = (uint32_t)t;
    pos[j] = (uint32_t)j;
  }
}

/* Thread (s, lane): when sorted key s starts a run, adds the run's source
 * elements, in position order, into the destination (any strides). */
template <typename T>
__global__ void nb_index_add_det_kernel(T *out, const T *src, const uint32_t *keys,
                                        const uint32_t *pos, int64_t J, uint32_t lim, int64_t osa,
                                        int64_t ssa, nb_iter lanes, int64_t L) {
  typedef typename nb_acc<T>::type A;
  NB_GRID_LOOP(i, J * L) {
    int64_t s = i / L, l = i - s * L;
    uint32_t t = keys[s];
    if (t >= lim || (s > 0 && keys[s - 1] == t)) continue;
    int64_t off[2];
    nb_iter_offsets<2>(lanes, l, off);
    T *dst = out + off[0] + (int64_t)t * osa;
    A acc = nb_to_f(*dst);
    for (int64_t r = s; r < J && keys[r] == t; r++) acc += nb_to_f(src[off[1] + (int64_t)pos[r] * ssa]);
    *dst = nb_acc_store<T>(acc);
  }
}

/* Whole rows of L elements, V per vector (L % V == 0, rows aligned to V
 * elements): one warp per sorted key that starts a run; each lane keeps
 * NB_ADD_CH vectors of the destination row in registers, adds the run's
 * source rows in position order, and stores once. */
#define NB_ADD_CH 4
template <typename T, int V> struct alignas(V * sizeof(T)) nb_rowvec { T x[V]; };

template <typename T, int V>
__global__ void __launch_bounds__(NB_ROW_WARPS * 32)
nb_index_add_rows_kernel(T *out, const T *src, const uint32_t *keys, const uint32_t *pos,
                         int64_t J, uint32_t lim, int64_t L) {
  typedef typename nb_acc<T>::type A;
  typedef nb_rowvec<T, V> Vec;
  const int lane = threadIdx.x & 31;
  const int64_t nvec = L / V;
  for (int64_t s = (int64_t)blockIdx.x * NB_ROW_WARPS + (threadIdx.x >> 5); s < J;
       s += (int64_t)gridDim.x * NB_ROW_WARPS) {
    uint32_t t = keys[s];
    if (t >= lim || (s > 0 && keys[s - 1] == t)) continue;
    Vec *dst = (Vec *)(out + (int64_t)t * L);
    for (int64_t c0 = 0; c0 < nvec; c0 += 32 * NB_ADD_CH) {
      A acc[NB_ADD_CH][V];
#pragma unroll
      for (int q = 0; q < NB_ADD_CH; q++) {
        int64_t c = c0 + q * 32 + lane;
        if (c < nvec) {
          Vec d = dst[c];
#pragma unroll
          for (int e = 0; e < V; e++) acc[q][e] = nb_to_f(d.x[e]);
        }
      }
      for (int64_t r = s; r < J && keys[r] == t; r++) {
        const Vec *row = (const Vec *)(src + (int64_t)pos[r] * L);
#pragma unroll
        for (int q = 0; q < NB_ADD_CH; q++) {
          int64_t c = c0 + q * 32 + lane;
          if (c < nvec) {
            Vec a = row[c];
#pragma unroll
            for (int e = 0; e < V; e++) acc[q][e] += nb_to_f(a.x[e]);
          }
        }
      }
#pragma unroll
      for (int q = 0; q < NB_ADD_CH; q++) {
        int64_t c = c0 + q * 32 + lane;
        if (c < nvec) {
          Vec d;
#pragma unroll
          for (int e = 0; e < V; e++) d.x[e] = nb_acc_store<T>(acc[q][e]);
          dst[c] = d;
        }
      }
    }
  }
}

template <typename T>
static nb_status add_rows(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *src,
                          const uint32_t *keys, const uint32_t *pos, int64_t J, uint32_t lim,
                          int64_t L) {
  unsigned g = idx_row_blocks(ctx, J);
  const int V = (int)(16 / sizeof(T));
  if (V > 1 && idx_row_vec(out->data, src->data, L, sizeof(T)) == V)
    nb_index_add_rows_kernel<T, (int)(16 / sizeof(T))>
        <<<g, NB_ROW_WARPS * 32, 0, ctx->stream>>>((T *)out->data, (const T *)src->data, keys,
                                                   pos, J, lim, L);
  else
    nb_index_add_rows_kernel<T, 1><<<g, NB_ROW_WARPS * 32, 0, ctx->stream>>>(
        (T *)out->data, (const T *)src->data, keys, pos, J, lim, L);
  return nb_cuda_launch_check("index_add (rows)");
}

/* Bits that index values 0..lim need. */
static int idx_bits(int64_t lim) {
  int b = 1;
  while (b < 32 && ((int64_t)1 << b) <= lim) b++;
  return b;
}

template <typename T>
static nb_status index_add_det(const nb_cuda_ctx *ctx, const nb_kview *out, int axis,
                               const nb_kview *idx, const nb_kview *src) {
  int64_t J = src->shape[axis], lim = out->shape[axis];
  if (J >= ((int64_t)1 << 31) || lim >= ((int64_t)1 << 31))
    return nb_error_set(NB_ERR_UNSUPPORTED, "cuda index_add: deterministic path needs fewer "
                        "than 2^31 indices and an axis below 2^31");
  int bits = idx_bits(lim);
  size_t sort_bytes = 0;
  NB_CUDA_TRY(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const uint32_t *)NULL,
                                              (uint32_t *)NULL, (const uint32_t *)NULL,
                                              (uint32_t *)NULL, (int)J, 0, bits, ctx->stream),
              "index_add (sort size)");
  size_t arr = ((size_t)J * sizeof(uint32_t) + 255) & ~(size_t)255;
  size_t bytes = 4 * arr + sort_bytes;
  char *scratch = (char *)nb_cuda_scratch(ctx, bytes);
  if (!scratch) return nb_last_status();
  uint32_t *keys_in = (uint32_t *)scratch, *keys = (uint32_t *)(scratch + arr);
  uint32_t *pos_in = (uint32_t *)(scratch + 2 * arr), *pos = (uint32_t *)(scratch + 3 * arr);
  int64_t sidx = idx->ndim ? idx->strides[0] : 0;
  nb_index_keys_kernel<<<nb_cuda_blocks(ctx, J, NB_CUDA_THREADS), NB_CUDA_THREADS, 0,
                         ctx->stream>>>(keys_in, pos_in, (const char *)idx->data, idx->dtype, sidx,
                                        J, lim, nb_cuda_flag(ctx));
  nb_status st = nb_cuda_launch_check("index_add (keys)");
  if (!st)
    st = nb_cuda_status(cub::DeviceRadixSort::SortPairs(scratch + 4 * arr, sort_bytes, keys_in, keys,
                                                        pos_in, pos, (int)J, 0, bits, ctx->stream),
                        "index_add (sort)");
  int64_t L;
  if (!st && idx_rows(out, src, axis, &L)) {
    st = add_rows<T>(ctx, out, src, keys, pos, J, (uint32_t)lim, L);
  } else if (!st) {
    int64_t shape[NB_MAX_DIMS];
    memcpy(shape, src->shape, sizeof shape);
    shape[axis] = 1; /* lanes: every axis but the indexed one */
    const int64_t *strides[2] = {out->strides, src->strides};
    nb_iter lanes;
    nb_iter_make(&lanes, src->ndim, shape, 2, strides);
    L = nb_shape_numel(src->ndim, shape);
    nb_index_add_det_kernel<T><<<nb_cuda_blocks(ctx, J * L, NB_CUDA_THREADS), NB_CUDA_THREADS, 0,
                                 ctx->stream>>>((T *)out->data, (const T *)src->data, keys, pos, J,
                                                (uint32_t)lim, out->strides[axis],
                                                src->strides[axis], lanes, L);
    st = nb_cuda_launch_check("index_add (accumulate)");
  }
  nb_cuda_scratch_free(ctx, scratch, bytes);
  return st;
}

template <typename T>
static nb_status index_add_run(const nb_cuda_ctx *ctx, const nb_kview *out, int axis,
                               const nb_kview *idx, const nb_kview *src, int det) {
  if (det) return index_add_det<T>(ctx, out, axis, idx, src);
  int64_t n = nb_kview_numel(src);
  const nb_kview *vs[2] = {src, out};
  const int za[2] = {0, 1};
  nb_ix ix;
  ix_make(&ix, src->ndim, src->shape, axis, 2, vs, za);
  int64_t sidx = idx->ndim ? idx->strides[0] : 0;
  nb_index_add_atomic_kernel<T><<<nb_cuda_blocks(ctx, n, NB_CUDA_THREADS), NB_CUDA_THREADS, 0,
                                  ctx->stream>>>((T *)out->data, (const T *)src->data,
                                                 (const char *)idx->data, idx->dtype, sidx,
                                                 out->strides[axis], out->shape[axis], ix, n,
                                                 nb_cuda_flag(ctx));
  return nb_cuda_launch_check("index_add (atomic)");
}

template <typename T>
static nb_status scatter_add_run(const nb_cuda_ctx *ctx, const nb_kview *out, int axis,
                                 const nb_kview *idx, const nb_kview *src, int det) {
  int64_t n = nb_kview_numel(idx);
  const nb_kview *vs[3] = {idx, src, out};
  const int za[3] = {0, 0, 1};
  nb_ix ix;
  ix_make(&ix, idx->ndim, idx->shape, axis, 3, vs, za);
  int64_t osa = out->ndim ? out->strides[axis] : 0, lim = out->ndim ? out->shape[axis] : 1;
  unsigned g = nb_cuda_blocks(ctx, n, NB_CUDA_THREADS);
  if (det)
    nb_scatter_add_det_kernel<T><<<g, NB_CUDA_THREADS, 0, ctx->stream>>>(
        (T *)out->data, (const T *)src->data, (const char *)idx->data, idx->dtype, osa, lim, ix, n,
        idx->ndim ? idx->shape[axis] : 1, nb_cuda_flag(ctx));
  else
    nb_scatter_add_atomic_kernel<T><<<g, NB_CUDA_THREADS, 0, ctx->stream>>>(
        (T *)out->data, (const T *)src->data, (const char *)idx->data, idx->dtype, osa, lim, ix, n,
        nb_cuda_flag(ctx));
  return nb_cuda_launch_check(det ? "scatter_add (deterministic)" : "scatter_add (atomic)");
}

#define NB_CUDA_ADD_SWITCH(dt, T, op, ...)                                          \
  switch (dt) {                                                                    \
  case NB_F64: { typedef double T; st = __VA_ARGS__; } break;                     \
  case NB_F32: { typedef float T; st = __VA_ARGS__; } break;                      \
  case NB_F16: { typedef __half T; st = __VA_ARGS__; } break;                     \
  case NB_BF16: { typedef __nv_bfloat16 T; st = __VA_ARGS__; } break;             \
  case NB_I64: { typedef int64_t T; st = __VA_ARGS__; } break;                    \
  case NB_I32: { typedef int32_t T; st = __VA_ARGS__; } break;                    \
  case NB_U8: { typedef uint8_t T; st = __VA_ARGS__; } break;                     \
  default:                                                                         \
    return nb_error_set(NB_ERR_DTYPE, "cuda %s: dtype %s cannot be accumulated (expected a " \
                        "float or integer dtype)", op, nb_dtype_name(dt));         \
  }

extern "C" nb_status nb_cuda_index_add(const nb_kview *out, int axis, const nb_kview *idx,
                                       const nb_kview *src, int deterministic) {
  if (nb_kview_numel(src) == 0 || nb_kview_numel(out) == 0) return NB_OK;
  nb_status st = idx_dtype_ok("index_add", idx);
  if (st) return st;
  nb_cuda_ctx ctx;
  if ((st = nb_cuda_enter(out->data, "index_add", &ctx))) return st;
  NB_CUDA_ADD_SWITCH(out->dtype, T, "index_add",
                     index_add_run<T>(&ctx, out, axis, idx, src, deterministic));
  if (st) return st;
  return nb_cuda_flag_check(&ctx, "index_add", out->shape[axis]);
}

extern "C" nb_status nb_cuda_scatter_add(const nb_kview *out, int axis, const nb_kview *idx,
                                         const nb_kview *src, int deterministic) {
  if (nb_kview_numel(idx) == 0 || nb_kview_numel(out) == 0) return NB_OK;
  nb_status st = idx_dtype_ok("scatter_add", idx);
  if (st) return st;
  nb_cuda_ctx ctx;
  if ((st = nb_cuda_enter(out->data, "scatter_add", &ctx))) return st;
  NB_CUDA_ADD_SWITCH(out->dtype, T, "scatter_add",
                     scatter_add_run<T>(&ctx, out, axis, idx, src, deterministic));
  if (st) return st;
  return nb_cuda_flag_check(&ctx, "scatter_add", out->ndim ? out->shape[axis] : 1);
}
