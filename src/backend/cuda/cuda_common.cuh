/* Shared pieces of the CUDA backend: the runtime context every kernel entry
 * enters, error helpers, dtype loads/stores, fast index math for strided
 * views, and warp/block reductions. Included by every cuda_*.cu file. */
#ifndef NB_CUDA_COMMON_CUH
#define NB_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_api.h"
#include "core/core.h"

/* ---- runtime (cuda_runtime.cu) ------------------------------------------ */
/* What a kernel entry needs: the device holding its data and its stream,
 * its SM count and L2 size in bytes (0 where the driver did not say). */
typedef struct {
  int dev;
  cudaStream_t stream;
  int n_sm;
  int l2_bytes;
} nb_cuda_ctx;

/* Finds the device of a device pointer, makes it current and returns its
 * stream. NB_OK or a backend error naming op. */
nb_status nb_cuda_enter(const void *ptr, const char *op, nb_cuda_ctx *ctx);
/* Turns a CUDA error into a nabla error naming what failed; NB_OK on success. */
nb_status nb_cuda_status(cudaError_t e, const char *what);
/* Checks the last launch (cudaGetLastError); name is the kernel. */
nb_status nb_cuda_launch_check(const char *name);
/* Stream-ordered scratch memory from the caching allocator. A block freed
 * after enqueueing the kernels that use it is safe to reuse: the single
 * stream orders every later use after them. */
void *nb_cuda_scratch(const nb_cuda_ctx *ctx, size_t nbytes);
void nb_cuda_scratch_free(const nb_cuda_ctx *ctx, void *p, size_t nbytes);
/* Device-side error flag for index checks: a device int64[2] {set, value}.
 * nb_cuda_flag_check reads it (one small copy and a stream sync), clears it
 * and reports NB_ERR_INDEX naming op when set. */
int64_t *nb_cuda_flag(const nb_cuda_ctx *ctx);
nb_status nb_cuda_flag_check(const nb_cuda_ctx *ctx, const char *op, int64_t limit);
/* The device's work counters (NB_CUDA_WORK_WORDS unsigned): words 0 and
 * 1, zero between kernels, for a persistent kernel whose CTAs take their
 * work items from a ticket counter (atomicAdd) and count themselves done,
 * the last one returning both to zero before the kernel ends; then two
 * words per CTA (at most NB_CUDA_WORK_CTAS) for handing a ticket from a
 * CTA's producer to its consumers; then, from word NB_CUDA_WORK_SPLIT,
 * NB_CUDA_WORK_SPLITS words, zero between kernels, where the parts of one
 * output computed by different CTAs count themselves in (the last returns
 * its word to zero). The device's one stream runs one such kernel at a
 * time. */
enum {
  NB_CUDA_WORK_CTAS = 1024,
  NB_CUDA_WORK_SPLIT = 2 + 2 * NB_CUDA_WORK_CTAS,
  NB_CUDA_WORK_SPLITS = 8 * NB_CUDA_WORK_CTAS,
  NB_CUDA_WORK_WORDS = NB_CUDA_WORK_SPLIT + NB_CUDA_WORK_SPLITS
};
unsigned *nb_cuda_work_counters(const nb_cuda_ctx *ctx);
/* The device's cuBLASLt handle and workspace (cuda_gemm.cu uses them). */
void *nb_cuda_lt_handle(const nb_cuda_ctx *ctx, void **workspace, size_t *ws_bytes);

#define NB_CUDA_TRY(expr, what)                              \
  do {                                                       \
    nb_status nb__st = nb_cuda_status((expr), (what));       \
    if (nb__st != NB_OK) return nb__st;                      \
  } while (0)

/* A launcher's entry: declares ctx (the device of ptr, made current, and
 * its stream) and st, and returns the error naming op from the enclosing
 * function when nb_cuda_enter fails. */
#define NB_CUDA_ENTER(ctx, st, ptr, op)             \
  nb_cuda_ctx ctx;                                  \
  nb_status st = nb_cuda_enter((ptr), (op), &ctx); \
  if (st) return st

#define NB_CUDA_THREADS 256

/* Runs the body (__VA_ARGS__) with E bound to the unsigned integer type of
 * size sz: a kernel that moves elements as bits instantiates once per size. */
#define NB_CUDA_SIZE_SWITCH(sz, E, ...)                       \
  switch (sz) {                                               \
  case 1: { typedef uint8_t E; __VA_ARGS__; } break;          \
  case 2: { typedef uint16_t E; __VA_ARGS__; } break;         \
  case 4: { typedef uint32_t E; __VA_ARGS__; } break;         \
  default: { typedef uint64_t E; __VA_ARGS__; } break;        \
  }

/* Grid size for a grid-stride loop over n items with NB_CUDA_THREADS
 * threads per block: enough blocks to fill the device several times. */
static inline unsigned nb_cuda_blocks(const nb_cuda_ctx *ctx, int64_t n, int threads) {
  int64_t want = (n + threads - 1) / threads;
  int64_t cap = (int64_t)ctx->n_sm * 32;
  if (want > cap) want = cap;
  return (unsigned)(want < 1 ? 1 : want);
}

/* ---- dtypes ------------------------------------------------------------- */
/* Storage types per dtype; f16 and bf16 are stored as their CUDA types. */
typedef __half nb_f16_t;
typedef __nv_bfloat16 nb_bf16_t;

/* Compute type: f64 in double, every other float in float. */
template <typename T> struct nb_acc { typedef float type; };
template <> struct nb_acc<double> { typedef double type; };
template <> struct nb_acc<int64_t> { typedef int64_t type; };
template <> struct nb_acc<int32_t> { typedef int64_t type; };
template <> struct nb_acc<uint8_t> { typedef int64_t type; };

__device__ __forceinline__ float nb_to_f(float x) { return x; }
__device__ __forceinline__ double nb_to_f(double x) { return x; }
__device__ __forceinline__ float nb_to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float nb_to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ int64_t nb_to_f(int64_t x) { return x; }
__device__ __forceinline__ int64_t nb_to_f(int32_t x) { return x; }
__device__ __forceinline__ int64_t nb_to_f(uint8_t x) { return x; }

/* Round-to-nearest-even stores, the same rounding as the CPU conversions. */
template <typename T> __device__ __forceinline__ T nb_from_f(float x);
template <> __device__ __forceinline__ double nb_from_f<double>(float x) { return x; }
template <> __device__ __forceinline__ float nb_from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half nb_from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 nb_from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
/* Stores a compute value (nb_acc: float or double) as T. A double goes to
 * f16/bf16 in one rounding, the CPU's bits (core/half.h): one cvt.rn.f16.f64
 * or cvt.rn.bf16.f64 (before sm_90 the header rounds bf16 to odd in f32
 * first). Through f32, a double just off a tie of the 16-bit type rounds
 * onto the tie and then to even, the wrong way (1 + 2^-11 + 2^-40 became f16
 * 1.0). A float is stored directly: no slower trip through double. */
template <typename T> __device__ __forceinline__ T nb_from_d(float x) { return nb_from_f<T>(x); }
template <typename T> __device__ __forceinline__ T nb_from_d(double x);
template <> __device__ __forceinline__ double nb_from_d<double>(double x) { return x; }
template <> __device__ __forceinline__ float nb_from_d<float>(double x) { return (float)x; }
template <> __device__ __forceinline__ __half nb_from_d<__half>(double x) { return __double2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 nb_from_d<__nv_bfloat16>(double x) {
  return __double2bfloat16(x);
}

/* Runs body with T bound to the storage type of a float dtype. */
#define NB_CUDA_FLOAT_SWITCH(dt, T, ...)                                       \
  switch (dt) {                                                               \
  case NB_F64: { typedef double T; __VA_ARGS__; } break;                      \
  case NB_F32: { typedef float T; __VA_ARGS__; } break;                       \
  case NB_F16: { typedef __half T; __VA_ARGS__; } break;                      \
  case NB_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; } break;              \
  default: return nb_error_set(NB_ERR_DTYPE, "cuda: dtype %s not supported here", \
                               nb_dtype_name(dt));                            \
  }

/* fp8 (storage only): to f32 exactly through f16 (cvt.rn.f16x2.e4m3x2 /
 * .e5m2x2 on sm_89+); from f32 or f64 with cuda_fp8.h's non-saturating
 * conversion, rounding the value once to nearest even: the CPU's and
 * PyTorch's rule (e4m3: past 448 after rounding, infinities and NaN give
 * NaN; e5m2: past 57344 gives an infinity). The float form converts
 * through the exact double, so both forms round once. NaN's sign may
 * differ from the CPU's (the f32 form makes every NaN positive). */
template <int E4> __device__ __forceinline__ float nb_f8_to_f(uint8_t b) {
  __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, E4 ? __NV_E4M3 : __NV_E5M2);
  return __half2float(__half(h));
}
template <int E4> __device__ __forceinline__ uint8_t nb_f8_from_d(double v) {
  return (uint8_t)__nv_cvt_double_to_fp8(v, __NV_NOSAT, E4 ? __NV_E4M3 : __NV_E5M2);
}

/* Generic element access by runtime dtype (conversion paths, rare views). */
__device__ __forceinline__ double nb_load_any(const void *p, int dt) {
  switch (dt) {
  case NB_F64: return *(const double *)p;
  case NB_F32: return *(const float *)p;
  case NB_F16: return __half2float(*(const __half *)p);
  case NB_BF16: return __bfloat162float(*(const __nv_bfloat16 *)p);
  case NB_I64: return (double)*(const int64_t *)p;
  case NB_I32: return *(const int32_t *)p;
  case NB_U8: return *(const uint8_t *)p;
  case NB_F8E4M3: return nb_f8_to_f<1>(*(const uint8_t *)p);
  case NB_F8E5M2: return nb_f8_to_f<0>(*(const uint8_t *)p);
  default: return *(const uint8_t *)p != 0;
  }
}
__device__ __forceinline__ int64_t nb_load_int(const void *p, int dt) {
  switch (dt) {
  case NB_I64: return *(const int64_t *)p;
  case NB_I32: return *(const int32_t *)p;
  case NB_U8: return *(const uint8_t *)p;
  case NB_BOOL: return *(const uint8_t *)p != 0;
  default: return (int64_t)nb_load_any(p, dt);
  }
}
/* Saturating float-to-int conversion, truncating toward zero, NaN to 0: the
 * CPU's nb_store_f64 rule. */
__device__ __forceinline__ int64_t nb_sat_i64(double v, double lo, double hi) {
  if (v != v) return 0;
  if (v <= lo) return (int64_t)lo;
  if (v >= hi) return (int64_t)hi;
  return (int64_t)v;
}
__device__ __forceinline__ void nb_store_any(void *p, int dt, double v) {
  switch (dt) {
  case NB_F64: *(double *)p = v; break;
  case NB_F32: *(float *)p = (float)v; break;
  case NB_F16: *(__half *)p = nb_from_d<__half>(v); break;
  case NB_BF16: *(__nv_bfloat16 *)p = nb_from_d<__nv_bfloat16>(v); break;
  case NB_I64: *(int64_t *)p = nb_sat_i64(v, -9223372036854775808.0, 9223372036854774784.0); break;
  case NB_I32: *(int32_t *)p = (int32_t)nb_sat_i64(v, -2147483648.0, 2147483647.0); break;
  case NB_U8: *(uint8_t *)p = (uint8_t)nb_sat_i64(v, 0.0, 255.0); break;
  case NB_F8E4M3: *(uint8_t *)p = nb_f8_from_d<1>(v); break;
  case NB_F8E5M2: *(uint8_t *)p = nb_f8_from_d<0>(v); break;
  default: *(uint8_t *)p = v != 0; break;
  }
}
/* Integer to integer: wraps (two's complement), as the CPU backend does. */
__device__ __forceinline__ void nb_store_int(void *p, int dt, int64_t v) {
  switch (dt) {
  case NB_I64: *(int64_t *)p = v; break;
  case NB_I32: *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)v; break;
  case NB_U8: *(uint8_t *)p = (uint8_t)(uint64_t)v; break;
  case NB_BOOL: *(uint8_t *)p = v != 0; break;
  default: nb_store_any(p, dt, (double)v); break;
  }
}

/* ---- index math ----------------------------------------------------------
 * A strided iteration space of up to NB_MAX_DIMS dims shared by up to four
 * operands. Division by each size uses a precomputed multiplier (32-bit
 * Granlund-Montgomery) when the element count fits in 32 bits. */
struct nb_fastdiv {
  uint32_t d, mul, shift;
};

static inline nb_fastdiv nb_fastdiv_make(uint32_t d) {
  nb_fastdiv f;
  f.d = d ? d : 1;
  uint32_t l = 0;
  while (l < 32 && ((uint64_t)1 << l) < f.d) l++;
  f.shift = l;
  f.mul = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << l) - f.d)) / f.d + 1);
  return f;
}

__device__ __forceinline__ uint32_t nb_fastdiv_div(const nb_fastdiv &f, uint32_t n) {
  return (uint32_t)(((uint64_t)__umulhi(n, f.mul) + n) >> f.shift);
}

#define NB_CUDA_MAX_OPS 4
struct nb_iter {
  int ndim;
  int small; /* total < 2^32: use nb_fastdiv */
  int64_t size[NB_MAX_DIMS];
  nb_fastdiv div[NB_MAX_DIMS];
  int64_t stride[NB_CUDA_MAX_OPS][NB_MAX_DIMS];
};

/* Builds the iteration space of shape over nops views' strides, dropping
 * size-1 axes and merging axes that are contiguous for every operand. */
void nb_iter_make(nb_iter *it, int ndim, const int64_t *shape, int nops,
                  const int64_t *const *strides);
/* Same, from kernel views (all of view[0]'s shape). */
void nb_iter_views(nb_iter *it, int nops, const nb_kview *const *views);
/* 1 when every operand is contiguous in the (coalesced) iteration space. */
int nb_iter_contiguous(const nb_iter *it, int nops);

/* Element offsets (in elements) of linear index i for the first NOPS
 * operands. */
template <int NOPS>
__device__ __forceinline__ void nb_iter_offsets(const nb_iter &it, int64_t i, int64_t *off) {
#pragma unroll
  for (int k = 0; k < NOPS; k++) off[k] = 0;
  if (it.small) {
    uint32_t r = (uint32_t)i;
    for (int d = it.ndim - 1; d > 0; d--) {
      uint32_t q = nb_fastdiv_div(it.div[d], r);
      uint32_t c = r - q * it.div[d].d;
#pragma unroll
      for (int k = 0; k < NOPS; k++) off[k] += (int64_t)c * it.stride[k][d];
      r = q;
    }
#pragma unroll
    for (int k = 0; k < NOPS; k++) off[k] += (int64_t)r * it.stride[k][0];
  } else {
    int64_t r = i;
    for (int d = it.ndim - 1; d > 0; d--) {
      int64_t q = r / it.size[d];
      int64_t c = r - q * it.size[d];
#pragma unroll
      for (int k = 0; k < NOPS; k++) off[k] += c * it.stride[k][d];
      r = q;
    }
#pragma unroll
    for (int k = 0; k < NOPS; k++) off[k] += r * it.stride[k][0];
  }
}

/* Multi-index of linear index i over a plain shape (no merging); used by
 * kernels that need coordinates (index ops). */
struct nb_shape_t {
  int ndim;
  int64_t size[NB_MAX_DIMS];
};

/* ---- reductions ---------------------------------------------------------- */
template <typename T> __device__ __forceinline__ T nb_warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename T> __device__ __forceinline__ T nb_warp_max(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    T w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

/* Block-wide sum (blockDim.x a multiple of 32, at most 1024); every thread
 * gets the result. smem holds 32 values. */
template <typename T> __device__ T nb_block_sum(T v, T *smem) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = nb_warp_sum(v);
  __syncthreads(); /* smem may still be read by a previous call */
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nw ? smem[lane] : (T)0;
  return nb_warp_sum(v);
}
template <typename T> __device__ T nb_block_max(T v, T *smem) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = nb_warp_max(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nw ? smem[lane] : smem[0];
  return nb_warp_max(v);
}

/* Threads per row for row kernels: a power of two in [32, 1024] near n/4. */
static inline int nb_cuda_row_threads(int64_t n) {
  int t = 32;
  while (t < 1024 && (int64_t)t * 4 < n) t <<= 1;
  return t;
}

/* Largest power of two (<= 16) dividing the address: for 16-byte vector paths. */
static inline int nb_cuda_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

#endif /* NB_CUDA_COMMON_CUH */
