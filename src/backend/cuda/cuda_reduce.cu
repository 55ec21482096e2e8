/* Reductions: SUM, MAX, MIN, ARGMAX, ARGMIN over the trailing nred axes.
 *
 * The kept axes and the reduced axes become two coalesced iteration spaces
 * (O outputs, R reduced elements each). Three kernels cover the layouts:
 *   row:    the reduced axis is innermost with stride 1: a block per output
 *           reads its row coalesced (warp shuffles, then shared memory);
 *   column sums: float sums whose kept axes are one run of unit stride
 *           (a bias gradient): 16-byte loads of neighbouring columns, rows
 *           split over the grid, partials added in a fixed order (below);
 *   column: otherwise (e.g. max over a batch axis): 32 x 8 threads per
 *           32 outputs, neighbouring threads reading neighbouring columns,
 *           thread rows taking every 8th reduced element.
 * When there are few outputs for the device, R is split into S chunks;
 * each (output, chunk) writes a partial and a second small kernel combines
 * the S partials in a fixed order, so results are deterministic. With
 * nb_deterministic() == 0, f32/f64 sums of the row and column kernels
 * instead add the partials into the zeroed output with atomics (one kernel,
 * no scratch); column sums are always in a fixed order.
 *
 * Accumulation: f32 for f32/f16/bf16, f64 for f64, int64 for integers.
 * MAX/MIN/ARG* propagate NaN (a NaN is the extreme); ARG* return the first
 * index of the extreme in row-major order of the reduced axes. */
#include <math.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

template <typename A> struct nb_rv {
  A v;
  int64_t i;
};

template <typename A> __device__ __forceinline__ A nb_red_lowest();
template <> __device__ __forceinline__ float nb_red_lowest<float>() { return -INFINITY; }
template <> __device__ __forceinline__ double nb_red_lowest<double>() { return -INFINITY; }
template <> __device__ __forceinline__ int64_t nb_red_lowest<int64_t>() { return INT64_MIN; }
template <typename A> __device__ __forceinline__ A nb_red_highest();
template <> __device__ __forceinline__ float nb_red_highest<float>() { return INFINITY; }
template <> __device__ __forceinline__ double nb_red_highest<double>() { return INFINITY; }
template <> __device__ __forceinline__ int64_t nb_red_highest<int64_t>() { return INT64_MAX; }

template <typename A> __device__ __forceinline__ nb_rv<A> nb_red_init(int op) {
  nb_rv<A> r;
  r.i = INT64_MAX;
  if (op == NB_ROP_SUM) r.v = (A)0;
  else if (op == NB_ROP_MAX || op == NB_ROP_ARGMAX) r.v = nb_red_lowest<A>();
  else r.v = nb_red_highest<A>();
  return r;
}

/* Whether b replaces a as the running extreme (ties: the smaller index). */
template <typename A> __device__ __forceinline__ bool nb_red_better(int op, nb_rv<A> b, nb_rv<A> a) {
  bool bn = b.v != b.v, an = a.v != a.v;
  if (bn || an) return bn && (!an || b.i < a.i);
  bool mx = op == NB_ROP_MAX || op == NB_ROP_ARGMAX;
  return (mx ? b.v > a.v : b.v < a.v) || (b.v == a.v && b.i < a.i);
}

template <typename A> __device__ __forceinline__ nb_rv<A> nb_red_combine(int op, nb_rv<A> a, nb_rv<A> b) {
  if (op == NB_ROP_SUM) {
    a.v += b.v;
    return a;
  }
  return nb_red_better(op, b, a) ? b : a;
}

template <typename A> __device__ __forceinline__ nb_rv<A> nb_red_warp(int op, nb_rv<A> r) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    nb_rv<A> t;
    t.v = __shfl_xor_sync(0xffffffffu, r.v, o);
    t.i = __shfl_xor_sync(0xffffffffu, (long long)r.i, o);
    r = nb_red_combine(op, r, t);
  }
  return r;
}

/* Block-wide combine; thread 0 gets the result. */
template <typename A> __device__ nb_rv<A> nb_red_block(int op, nb_rv<A> r) {
  __shared__ A sv[32];
  __shared__ int64_t si[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  r = nb_red_warp(op, r);
  if (nw == 1) return r;
  if (lane == 0) { sv[warp] = r.v; si[warp] = r.i; }
  __syncthreads();
  if (warp == 0) {
    r = nb_red_init<A>(op);
    if (lane < nw) { r.v = sv[lane]; r.i = si[lane]; }
    r = nb_red_warp(op, r);
  }
  return r;
}

template <typename T, typename A>
__device__ __forceinline__ void nb_red_atomic(T *p, A v) {}
__device__ __forceinline__ void nb_red_atomic(float *p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void nb_red_atomic(double *p, double v) { atomicAdd(p, v); }

/* Writes a final result for output o. */
template <typename T, typename A>
__device__ __forceinline__ void nb_red_store(int op, void *out, int64_t off, nb_rv<A> r) {
  if (op == NB_ROP_ARGMAX || op == NB_ROP_ARGMIN)
    ((int64_t *)out)[off] = r.i == INT64_MAX ? 0 : r.i;
  else
    ((T *)out)[off] = nb_from_d<T>(r.v);
}
template <> __device__ __forceinline__ void nb_red_store<int64_t, int64_t>(int op, void *out, int64_t off, nb_rv<int64_t> r) {
  ((int64_t *)out)[off] = (op == NB_ROP_ARGMAX || op == NB_ROP_ARGMIN) ? (r.i == INT64_MAX ? 0 : r.i) : r.v;
}
template <> __device__ __forceinline__ void nb_red_store<int32_t, int64_t>(int op, void *out, int64_t off, nb_rv<int64_t> r) {
  if (op == NB_ROP_ARGMAX || op == NB_ROP_ARGMIN) ((int64_t *)out)[off] = r.i == INT64_MAX ? 0 : r.i;
  else ((int32_t *)out)[off] = (int32_t)r.v;
}
template <> __device__ __forceinline__ void nb_red_store<uint8_t, int64_t>(int op, void *out, int64_t off, nb_rv<int64_t> r) {
  if (op == NB_ROP_ARGMAX || op == NB_ROP_ARGMIN) ((int64_t *)out)[off] = r.i == INT64_MAX ? 0 : r.i;
  else ((uint8_t *)out)[off] = (uint8_t)r.v;
}

struct nb_red_args {
  int op;
  int64_t O, R, S, chunk; /* outputs, reduced length, splits, chunk length */
  nb_iter keep;           /* ops: out, in (base of each output's row) */
  nb_iter red;            /* op: in (offset of reduced element r) */
  int atomic;             /* add block results into out with atomics */
};

template <typename T, typename A>
__device__ __forceinline__ void nb_red_accum(const nb_red_args &a, const T *in, int64_t base,
                                             int64_t r, nb_rv<A> &acc) {
  int64_t off;
  if (a.red.ndim == 1) off = r * a.red.stride[0][0];
  else nb_iter_offsets<1>(a.red, r, &off);
  nb_rv<A> e;
  e.v = (A)nb_to_f(in[base + off]);
  e.i = r;
  acc = nb_red_combine(a.op, acc, e);
}

/* Writes one (output, split) result: final, atomic, or a partial. */
template <typename T, typename A>
__device__ __forceinline__ void nb_red_emit(const nb_red_args &a, void *out, nb_rv<A> *part,
                                            int64_t o, int64_t s, int64_t out_off, nb_rv<A> r) {
  if (a.S == 1) nb_red_store<T, A>(a.op, out, out_off, r);
  else if (a.atomic) nb_red_atomic((T *)out + out_off, r.v);
  else part[o * a.S + s] = r;
}

/* grid.x: outputs (strided), grid.y: splits; one block per (o, s). */
template <typename T, typename A>
__global__ void nb_reduce_row_kernel(nb_red_args a, void *out, const T *in, nb_rv<A> *part) {
  int64_t s = blockIdx.y;
  int64_t r0 = s * a.chunk, r1 = r0 + a.chunk < a.R ? r0 + a.chunk : a.R;
  for (int64_t o = blockIdx.x; o < a.O; o += gridDim.x) {
    int64_t off[2];
    nb_iter_offsets<2>(a.keep, o, off);
    nb_rv<A> acc = nb_red_init<A>(a.op);
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) nb_red_accum<T, A>(a, in, off[1], r, acc);
    acc = nb_red_block(a.op, acc);
    if (threadIdx.x == 0) nb_red_emit<T, A>(a, out, part, o, s, off[0], acc);
    __syncthreads(); /* the block's shared memory is reused next output */
  }
}

/* Column layout: a block of 32 x 8 threads per 32 neighbouring outputs (x)
 * and split (grid.y). Thread row y adds rows y, y + 8, ... of the split's
 * chunk, so a warp keeps loads of several rows in flight (one thread per
 * output left the memory system nearly idle: bias gradients over 16k rows
 * ran at a few percent of DRAM bandwidth). The 8 partial results of an
 * output are then combined in y order: a fixed order, so sums repeat bit for
 * bit. */
constexpr int kColX = 32, kColY = 8;
template <typename T, typename A>
__global__ void __launch_bounds__(kColX * kColY)
    nb_reduce_col_kernel(nb_red_args a, void *out, const T *in, nb_rv<A> *part) {
  __shared__ A sv[kColY][kColX];
  __shared__ int64_t si[kColY][kColX];
  int tx = threadIdx.x, ty = threadIdx.y;
  int64_t s = blockIdx.y;
  int64_t r0 = s * a.chunk, r1 = r0 + a.chunk < a.R ? r0 + a.chunk : a.R;
  for (int64_t o0 = (int64_t)blockIdx.x * kColX; o0 < a.O; o0 += (int64_t)gridDim.x * kColX) {
    int64_t o = o0 + tx, off[2] = {0, 0};
    nb_rv<A> acc = nb_red_init<A>(a.op);
    if (o < a.O) {
      nb_iter_offsets<2>(a.keep, o, off);
#pragma unroll 4
      for (int64_t r = r0 + ty; r < r1; r += kColY) nb_red_accum<T, A>(a, in, off[1], r, acc);
    }
    sv[ty][tx] = acc.v;
    si[ty][tx] = acc.i;
    __syncthreads();
    if (ty == 0 && o < a.O) {
      for (int y = 1; y < kColY; y++) {
        nb_rv<A> t;
        t.v = sv[y][tx];
        t.i = si[y][tx];
        acc = nb_red_combine(a.op, acc, t);
      }
      nb_red_emit<T, A>(a, out, part, o, s, off[0], acc);
    }
    __syncthreads(); /* sv/si are reused by the next outputs */
  }
}

/* Combines the S partials of each output in split order. */
template <typename T, typename A>
__global__ void nb_reduce_finish_kernel(nb_red_args a, void *out, const nb_rv<A> *part) {
  for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < a.O;
       o += (int64_t)gridDim.x * blockDim.x) {
    nb_rv<A> acc = part[o * a.S];
    for (int64_t s = 1; s < a.S; s++) acc = nb_red_combine(a.op, acc, part[o * a.S + s]);
    int64_t off[2];
    nb_iter_offsets<2>(a.keep, o, off);
    nb_red_store<T, A>(a.op, out, off[0], acc);
  }
}

/* ---- column sums: kept axes contiguous, reduced axes strided ---------------
 * out[c] = sum_r in[r * stride + c] (a bias gradient: (B*T, C) summed over
 * its rows). A warp reads 32 * V neighbouring columns of one row, V per
 * thread in one 16-byte load (V = 16 / sizeof(T) when the pointer, the row
 * strides and the column count allow it, else 1), so each request is whole
 * sectors; 8 thread rows take rows y, y + 8, ... of a split of R, a grid of
 * splits fills the device. Each (column, split) sum is combined over the 8
 * thread rows in y order and written as an f32 (f64) partial; a second
 * kernel adds the splits' partials in split order: a fixed order, the same
 * bits every run, no atomics. (16384, 3072) bf16 took 195 us on the H100
 * with the generic column kernel (2-byte loads, 64 bytes a warp). */
constexpr int kColvY = 8;

template <typename T, int V> struct alignas(sizeof(T) * V) nb_colv_vec { T v[V]; };

template <typename T, typename A, int V>
__global__ void __launch_bounds__(32 * kColvY)
    nb_reduce_colv_kernel(nb_red_args a, int64_t ostride, void *out, const T *in, A *part) {
  __shared__ A sm[kColvY][32 * V];
  int tx = threadIdx.x, ty = threadIdx.y;
  int64_t s = blockIdx.y, c0 = ((int64_t)blockIdx.x * 32 + tx) * V;
  int64_t r0 = s * a.chunk, r1 = r0 + a.chunk < a.R ? r0 + a.chunk : a.R;
  A acc[V];
#pragma unroll
  for (int j = 0; j < V; j++) acc[j] = (A)0;
  if (c0 < a.O) {
#pragma unroll 4
    for (int64_t r = r0 + ty; r < r1; r += kColvY) {
      int64_t off = 0;
      if (a.red.ndim == 1) off = r * a.red.stride[0][0];
      else if (a.red.ndim > 1) nb_iter_offsets<1>(a.red, r, &off);
      if (V > 1) {
        nb_colv_vec<T, V> x = *(const nb_colv_vec<T, V> *)(in + off + c0);
#pragma unroll
        for (int j = 0; j < V; j++) acc[j] += (A)nb_to_f(x.v[j]);
      } else {
        acc[0] += (A)nb_to_f(in[off + c0]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < V; j++) sm[ty][tx * V + j] = acc[j];
  __syncthreads();
  /* thread (tx, ty) finishes columns ty * 32 + tx, + 256, ..., of the block */
  for (int k = ty * 32 + tx; k < 32 * V; k += 32 * kColvY) {
    int64_t c = (int64_t)blockIdx.x * 32 * V + k;
    if (c >= a.O) continue;
    A v = sm[0][k];
    for (int y = 1; y < kColvY; y++) v += sm[y][k];
    if (a.S == 1) ((T *)out)[c * ostride] = nb_from_d<T>(v);
    else part[s * a.O + c] = v;
  }
}

/* Adds the S partials of each column in split order. */
template <typename T, typename A>
__global__ void nb_reduce_colv_finish(int64_t O, int64_t S, int64_t ostride, void *out, const A *part) {
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < O;
       c += (int64_t)gridDim.x * blockDim.x) {
    A v = part[c];
    for (int64_t s = 1; s < S; s++) v += part[s * O + c];
    ((T *)out)[c * ostride] = nb_from_d<T>(v);
  }
}

/* Whether a float sum takes the column kernel: its kept axes one run of
 * unit stride in the input, its reduced axes not (the row kernel's case). */
static int colv_applies(const nb_red_args *a) {
  if (a->op != NB_ROP_SUM || a->keep.ndim != 1 || a->keep.stride[1][0] != 1) return 0;
  return !(a->red.ndim >= 1 && a->red.stride[0][a->red.ndim - 1] == 1);
}

/* V elements a load when every row start is 16-byte aligned, else 1. */
template <typename T>
static int colv_width(const nb_red_args *a, const void *in) {
  int v = 16 / (int)sizeof(T);
  if ((uintptr_t)in % 16 || a->O % v) return 1;
  for (int d = 0; d < a->red.ndim; d++)
    if (a->red.stride[0][d] % v) return 1;
  return v;
}

template <typename T, typename A, int V>
static nb_status colv_launch(const nb_cuda_ctx *ctx, const nb_red_args *a, int64_t ostride,
                             void *out, const T *in) {
  int64_t units = (a->O + 32 * V - 1) / (32 * V), want = (int64_t)ctx->n_sm * 8;
  int64_t S = units < want ? (want + units - 1) / units : 1;
  int64_t maxS = (a->R + 4 * kColvY - 1) / (4 * kColvY); /* at least 4 rows a thread row */
  if (S > maxS) S = maxS;
  if (S > 65535) S = 65535;
  if (S < 1) S = 1;
  nb_red_args g = *a;
  g.S = S;
  g.chunk = (a->R + S - 1) / S;
  size_t bytes = S > 1 ? (size_t)(a->O * S) * sizeof(A) : 0;
  A *part = NULL;
  if (bytes && !(part = (A *)nb_cuda_scratch(ctx, bytes))) return nb_last_status();
  if (units > 65535 * 1024LL) units = 65535 * 1024LL; /* never: O < 2^31 columns */
  nb_reduce_colv_kernel<T, A, V><<<dim3((unsigned)units, (unsigned)S), dim3(32, kColvY), 0,
                                   ctx->stream>>>(g, ostride, out, in, part);
  nb_status st = nb_cuda_launch_check("reduce (column sums)");
  if (!st && part) {
    nb_reduce_colv_finish<T, A><<<nb_cuda_blocks(ctx, a->O, 256), 256, 0, ctx->stream>>>(
        a->O, S, ostride, out, part);
    st = nb_cuda_launch_check("reduce (column sums, finish)");
  }
  nb_cuda_scratch_free(ctx, part, bytes);
  return st;
}

template <typename T>
static nb_status colv_run(const nb_cuda_ctx *ctx, const nb_red_args *a, const nb_kview *out,
                          const nb_kview *in) {
  typedef typename nb_acc<T>::type A;
  const T *p = (const T *)in->data;
  int64_t os = a->keep.stride[0][0];
  constexpr int VW = 16 / sizeof(T);
  if (colv_width<T>(a, p) == VW) return colv_launch<T, A, VW>(ctx, a, os, out->data, p);
  return colv_launch<T, A, 1>(ctx, a, os, out->data, p);
}

template <typename T>
static nb_status reduce_run(const nb_cuda_ctx *ctx, nb_red_args *a, const nb_kview *out,
                            const nb_kview *in) {
  typedef typename nb_acc<T>::type A;
  int row = a->R > 16 && a->red.stride[0][a->red.ndim - 1] == 1;
  /* blocks to fill the GPU: row blocks, or column blocks of 32 outputs
   * (8 warps each, 8 per SM: full occupancy for a memory-bound loop) */
  int64_t want = (int64_t)ctx->n_sm * (row ? 4 : 8);
  int64_t units = row ? a->O : (a->O + kColX - 1) / kColX;
  int64_t S = 1;
  if (units < want) {
    S = (want + units - 1) / units;
    int64_t min_chunk = row ? 2048 : 64; /* keep each split worth a launch slot */
    int64_t maxS = (a->R + min_chunk - 1) / min_chunk;
    if (S > maxS) S = maxS;
    if (S > 65535) S = 65535;
    if (S < 1) S = 1;
  }
  a->S = S;
  a->chunk = (a->R + S - 1) / S;
  int sum_f = a->op == NB_ROP_SUM && (out->dtype == NB_F32 || out->dtype == NB_F64);
  a->atomic = S > 1 && sum_f && !nb_deterministic();
  nb_rv<A> *part = NULL;
  size_t part_bytes = 0;
  if (S > 1 && !a->atomic) {
    part_bytes = (size_t)(a->O * S) * sizeof(nb_rv<A>);
    part = (nb_rv<A> *)nb_cuda_scratch(ctx, part_bytes);
    if (!part) return nb_last_status();
  }
  if (a->atomic) { /* out is zeroed first: every split adds into it */
    nb_status st = nb_cuda_fill(out, 0.0);
    if (st) return st;
  }
  nb_status st;
  if (row) {
    int threads = nb_cuda_row_threads(a->chunk);
    int64_t gx = a->O < (int64_t)1 << 30 ? a->O : (int64_t)1 << 30;
    nb_reduce_row_kernel<T, A><<<dim3((unsigned)gx, (unsigned)S), threads, 0, ctx->stream>>>(
        *a, out->data, (const T *)in->data, part);
    st = nb_cuda_launch_check("reduce (row)");
  } else {
    int64_t gx = (a->O + kColX - 1) / kColX;
    if (gx > (int64_t)1 << 30) gx = (int64_t)1 << 30;
    nb_reduce_col_kernel<T, A><<<dim3((unsigned)gx, (unsigned)S), dim3(kColX, kColY), 0, ctx->stream>>>(
        *a, out->data, (const T *)in->data, part);
    st = nb_cuda_launch_check("reduce (column)");
  }
  if (st == NB_OK && part) {
    nb_reduce_finish_kernel<T, A><<<nb_cuda_blocks(ctx, a->O, 128), 128, 0, ctx->stream>>>(
        *a, out->data, part);
    st = nb_cuda_launch_check("reduce (finish)");
  }
  nb_cuda_scratch_free(ctx, part, part_bytes);
  return st;
}

extern "C" nb_status nb_cuda_reduce(nb_rop op, const nb_kview *out, const nb_kview *in, int nred) {
  int64_t O = nb_kview_numel(out);
  if (O == 0) return NB_OK;
  int kd = out->ndim;
  int64_t R = 1;
  for (int d = kd; d < kd + nred; d++) R *= in->shape[d];
  if (R == 0) { /* empty reductions: 0 for sums and indices, NaN otherwise */
    return nb_cuda_fill(out, op == NB_ROP_SUM || op >= NB_ROP_ARGMAX ? 0.0 : NAN);
  }
  NB_CUDA_ENTER(ctx, st, out->data, "reduce");
  nb_red_args a;
  a.op = (int)op;
  a.O = O;
  a.R = R;
  const int64_t *ks[2] = {out->strides, in->strides};
  nb_iter_make(&a.keep, kd, out->shape, 2, ks);
  const int64_t *rs[1] = {in->strides + kd};
  nb_iter_make(&a.red, nred, in->shape + kd, 1, rs);
  if (colv_applies(&a)) {
    switch (in->dtype) {
    case NB_F64: return colv_run<double>(&ctx, &a, out, in);
    case NB_F32: return colv_run<float>(&ctx, &a, out, in);
    case NB_F16: return colv_run<__half>(&ctx, &a, out, in);
    case NB_BF16: return colv_run<__nv_bfloat16>(&ctx, &a, out, in);
    default: break; /* integers: the generic kernels */
    }
  }
  switch (in->dtype) {
  case NB_F64: return reduce_run<double>(&ctx, &a, out, in);
  case NB_F32: return reduce_run<float>(&ctx, &a, out, in);
  case NB_F16: return reduce_run<__half>(&ctx, &a, out, in);
  case NB_BF16: return reduce_run<__nv_bfloat16>(&ctx, &a, out, in);
  case NB_I64: return reduce_run<int64_t>(&ctx, &a, out, in);
  case NB_I32: return reduce_run<int32_t>(&ctx, &a, out, in);
  case NB_U8: case NB_BOOL: return reduce_run<uint8_t>(&ctx, &a, out, in);
  default: return nb_error_set(NB_ERR_DTYPE, "cuda reduce: dtype %s", nb_dtype_name(in->dtype));
  }
}
