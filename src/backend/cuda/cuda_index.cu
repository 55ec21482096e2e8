/* Index kernels: index_select, index_add, gather, scatter_add.
 *
 * A thread handles one element; its coordinate along the indexed axis picks
 * the index. A bad index (outside [0, size); negatives are not wrapped)
 * never touches memory: the element is skipped (gathers write 0) and the
 * device flag records the value; the host wrapper then reads the flag (one
 * stream sync) and returns NB_ERR_INDEX (cuda_api.h describes the deferred
 * mode).
 *
 * Accumulation, non-deterministic: atomics (f16/bf16 atomics round each
 * addition, as the CPU does). Deterministic:
 *   index_add:   the (index, position) pairs are sorted (bitonic sort of
 *                64-bit keys, shared-memory stages for the short strides);
 *                one thread per (run of equal indices, lane) then adds the
 *                run in position order into the destination, the CPU's
 *                order, so f32/f64 results equal the CPU's bit for bit.
 *   scatter_add: one thread per index element that is the first of its
 *                value in its line sums the line's matching elements in
 *                position order: O(line length) per element, meant for the
 *                short lines of gather backward; use the atomic path for
 *                long lines. */
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

#define NB_CUDA_SIZE_SWITCH(sz, E, ...)                       \
  switch (sz) {                                               \
  case 1: { typedef uint8_t E; __VA_ARGS__; } break;          \
  case 2: { typedef uint16_t E; __VA_ARGS__; } break;         \
  case 4: { typedef uint32_t E; __VA_ARGS__; } break;         \
  default: { typedef uint64_t E; __VA_ARGS__; } break;        \
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
__device__ __forceinline__ T nb_acc_store(typename nb_acc<T>::type v) { return nb_from_d<T>((double)v); }
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

/* ---- deterministic index_add: sort (index, position) keys ------------------ */
#define NB_SORT_TILE 2048

__device__ __forceinline__ void nb_cswap(uint64_t *a, uint64_t *b, bool up) {
  uint64_t x = *a, y = *b;
  if ((x > y) == up) { *a = y; *b = x; }
}

/* Stages j < NB_SORT_TILE of every k in [k0, k1] inside one tile. */
__global__ void nb_bitonic_tile_kernel(uint64_t *keys, int64_t k0, int64_t k1) {
  __shared__ uint64_t s[NB_SORT_TILE];
  int64_t base = (int64_t)blockIdx.x * NB_SORT_TILE;
  for (int t = threadIdx.x; t < NB_SORT_TILE; t += blockDim.x) s[t] = keys[base + t];
  __syncthreads();
  for (int64_t k = k0; k <= k1; k <<= 1) {
    int64_t j0 = k >> 1 < NB_SORT_TILE / 2 ? k >> 1 : NB_SORT_TILE / 2;
    for (int64_t j = j0; j > 0; j >>= 1) {
      for (int t = threadIdx.x; t < NB_SORT_TILE / 2; t += blockDim.x) {
        int lo = (int)(2 * t - (t & (j - 1))); /* index with bit j clear */
        int64_t gi = base + lo;
        nb_cswap(&s[lo], &s[lo + j], (gi & k) == 0);
      }
      __syncthreads();
    }
  }
  for (int t = threadIdx.x; t < NB_SORT_TILE; t += blockDim.x) keys[base + t] = s[t];
}

/* One stage (k, j) with j >= NB_SORT_TILE over the whole array. */
__global__ void nb_bitonic_global_kernel(uint64_t *keys, int64_t n, int64_t k, int64_t j) {
  NB_GRID_LOOP(t, n / 2) {
    int64_t lo = 2 * t - (t & (j - 1));
    nb_cswap(&keys[lo], &keys[lo + j], (lo & k) == 0);
  }
}

/* keys[j] = idx[j] << 32 | j; bad indices and padding sort last. */
__global__ void nb_index_keys_kernel(uint64_t *keys, int64_t n_pad, const char *idx, int idt,
                                     int64_t sidx, int64_t J, int64_t lim, int64_t *flag) {
  int ies = idt == NB_I64 ? 8 : 4;
  NB_GRID_LOOP(j, n_pad) {
    uint64_t key = ~(uint64_t)0;
    if (j < J) {
      int64_t t = nb_load_int(idx + j * sidx * ies, idt);
      if (t < 0 || t >= lim) nb_ix_bad(flag, t);
      else key = (uint64_t)t << 32 | (uint64_t)j;
    }
    keys[j] = key;
  }
}

/* Thread (s, lane): when sorted key s starts a run, adds the run's source
 * rows, in position order, into the destination row. */
template <typename T>
__global__ void nb_index_add_det_kernel(T *out, const T *src, const uint64_t *keys, int64_t J,
                                        int64_t osa, int64_t ssa, nb_iter lanes, int64_t L) {
  typedef typename nb_acc<T>::type A;
  NB_GRID_LOOP(i, J * L) {
    int64_t s = i / L, l = i - s * L;
    uint64_t key = keys[s];
    if (key == ~(uint64_t)0) continue;
    uint64_t t = key >> 32;
    if (s > 0 && keys[s - 1] >> 32 == t) continue;
    int64_t off[2];
    nb_iter_offsets<2>(lanes, l, off);
    T *dst = out + off[0] + (int64_t)t * osa;
    A acc = nb_to_f(*dst);
    for (int64_t r = s; r < J && keys[r] >> 32 == t; r++)
      acc += nb_to_f(src[off[1] + (int64_t)(keys[r] & 0xffffffffu) * ssa]);
    *dst = nb_acc_store<T>(acc);
  }
}

static nb_status sort_keys(const nb_cuda_ctx *ctx, uint64_t *keys, int64_t n) {
  const int th = 512;
  int64_t tiles = n / NB_SORT_TILE;
  nb_bitonic_tile_kernel<<<(unsigned)tiles, th, 0, ctx->stream>>>(keys, 2, NB_SORT_TILE);
  nb_status st = nb_cuda_launch_check("index_add (sort)");
  for (int64_t k = 2 * NB_SORT_TILE; k <= n && !st; k <<= 1) {
    for (int64_t j = k >> 1; j >= NB_SORT_TILE && !st; j >>= 1) {
      nb_bitonic_global_kernel<<<nb_cuda_blocks(ctx, n / 2, NB_CUDA_THREADS), NB_CUDA_THREADS, 0,
                                 ctx->stream>>>(keys, n, k, j);
      st = nb_cuda_launch_check("index_add (sort)");
    }
    if (st) break;
    nb_bitonic_tile_kernel<<<(unsigned)tiles, th, 0, ctx->stream>>>(keys, k, k);
    st = nb_cuda_launch_check("index_add (sort)");
  }
  return st;
}

template <typename T>
static nb_status index_add_det(const nb_cuda_ctx *ctx, const nb_kview *out, int axis,
                               const nb_kview *idx, const nb_kview *src) {
  int64_t J = src->shape[axis], lim = out->shape[axis];
  if (J >= ((int64_t)1 << 32) || lim >= ((int64_t)1 << 31))
    return nb_error_set(NB_ERR_UNSUPPORTED, "cuda index_add: deterministic path needs fewer "
                        "than 2^32 indices and an axis below 2^31");
  int64_t n_pad = NB_SORT_TILE;
  while (n_pad < J) n_pad <<= 1;
  size_t bytes = (size_t)n_pad * sizeof(uint64_t);
  uint64_t *keys = (uint64_t *)nb_cuda_scratch(ctx, bytes);
  if (!keys) return nb_last_status();
  int64_t sidx = idx->ndim ? idx->strides[0] : 0;
  nb_index_keys_kernel<<<nb_cuda_blocks(ctx, n_pad, NB_CUDA_THREADS), NB_CUDA_THREADS, 0,
                         ctx->stream>>>(keys, n_pad, (const char *)idx->data, idx->dtype, sidx, J,
                                        lim, nb_cuda_flag(ctx));
  nb_status st = nb_cuda_launch_check("index_add (keys)");
  if (!st) st = sort_keys(ctx, keys, n_pad);
  if (!st) {
    int64_t shape[NB_MAX_DIMS];
    memcpy(shape, src->shape, sizeof shape);
    shape[axis] = 1; /* lanes: every axis but the indexed one */
    const int64_t *strides[2] = {out->strides, src->strides};
    nb_iter lanes;
    nb_iter_make(&lanes, src->ndim, shape, 2, strides);
    int64_t L = nb_shape_numel(src->ndim, shape);
    nb_index_add_det_kernel<T><<<nb_cuda_blocks(ctx, J * L, NB_CUDA_THREADS), NB_CUDA_THREADS, 0,
                                 ctx->stream>>>((T *)out->data, (const T *)src->data, keys, J,
                                                out->strides[axis], src->strides[axis], lanes, L);
    st = nb_cuda_launch_check("index_add (accumulate)");
  }
  nb_cuda_scratch_free(ctx, keys, bytes);
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
