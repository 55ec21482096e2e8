/* Elementwise kernels: fill, arange, copy (with dtype conversion), unary,
 * binary, where. Each has a contiguous fast path (16-byte vector loads and
 * stores when every operand is aligned) and a general strided path over a
 * coalesced iteration space (nb_iter). The unary and binary ops are the rows
 * of backend/ew_list.h. The contiguous float kernels are instantiated per op
 * (the op a template parameter, the host switching once per launch), so the
 * elements of a thread's unrolled iteration are computed as straight-line
 * code that interleaves and keeps its loads in flight; a runtime switch per
 * element (a jump table for each) serialised them, 9% slower than the copy
 * rate on an f32 GELU. A binary op with a row (bias) or column broadcast
 * operand has a kernel of the same shape (nb_binary_bcast_kernel) instead of
 * the strided one. The integer and strided kernels keep a runtime switch on
 * the op (uniform across the grid), which keeps their instantiations few. */
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

/* 16 bytes of T, for vector loads and stores. */
template <typename T> struct alignas(16) nb_pack {
  T v[16 / sizeof(T)];
};

#define NB_GRID_LOOP(i, n)                                                          \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);         \
       i += (int64_t)gridDim.x * blockDim.x)

/* ---- fill ------------------------------------------------------------------ */
/* E is an unsigned type of the element's size: fill needs only the bits. */
template <typename E>
__global__ void nb_fill_vec_kernel(E *out, int64_t n, E v) {
  const int per = 16 / sizeof(E);
  nb_pack<E> pk;
#pragma unroll
  for (int k = 0; k < per; k++) pk.v[k] = v;
  int64_t nv = n / per;
  NB_GRID_LOOP(i, nv) ((nb_pack<E> *)out)[i] = pk;
  NB_GRID_LOOP(i, n - nv * per) out[nv * per + i] = v;
}

template <typename E>
__global__ void nb_fill_strided_kernel(E *out, nb_iter it, int64_t n, E v) {
  NB_GRID_LOOP(i, n) {
    int64_t off[1];
    nb_iter_offsets<1>(it, i, off);
    out[off[0]] = v;
  }
}

template <typename E>
static nb_status fill_run(const nb_cuda_ctx *ctx, const nb_kview *out, const void *bits) {
  E v;
  memcpy(&v, bits, sizeof v);
  nb_iter it;
  nb_iter_views(&it, 1, &out);
  int64_t n = nb_kview_numel(out);
  unsigned g = nb_cuda_blocks(ctx, n, NB_CUDA_THREADS);
  if (nb_iter_contiguous(&it, 1) && nb_cuda_aligned16(out->data))
    nb_fill_vec_kernel<E><<<g, NB_CUDA_THREADS, 0, ctx->stream>>>((E *)out->data, n, v);
  else
    nb_fill_strided_kernel<E><<<g, NB_CUDA_THREADS, 0, ctx->stream>>>((E *)out->data, it, n, v);
  return nb_cuda_launch_check("fill");
}

extern "C" nb_status nb_cuda_fill(const nb_kview *out, double value) {
  int64_t n = nb_kview_numel(out);
  if (n == 0) return NB_OK;
  NB_CUDA_ENTER(ctx, st, out->data, "fill");
  unsigned char bits[8] = {0};
  nb_store_f64(bits, out->dtype, value); /* the CPU's conversion, once */
  NB_CUDA_SIZE_SWITCH(nb_dtype_size(out->dtype), E, return fill_run<E>(&ctx, out, bits));
  return NB_OK;
}

/* ---- arange ----------------------------------------------------------------- */
__global__ void nb_arange_kernel(char *out, int dt, int64_t es, int64_t stride, int64_t n,
                                 double start, double step) {
  NB_GRID_LOOP(i, n) {
    double v = __dadd_rn(start, __dmul_rn((double)i, step)); /* no FMA: match the CPU */
    nb_store_any(out + i * stride * es, dt, v);
  }
}

extern "C" nb_status nb_cuda_arange(const nb_kview *out, double start, double step) {
  int64_t n = nb_kview_numel(out);
  if (n == 0) return NB_OK;
  NB_CUDA_ENTER(ctx, st, out->data, "arange");
  int64_t stride = out->ndim ? out->strides[0] : 1;
  nb_arange_kernel<<<nb_cuda_blocks(&ctx, n, NB_CUDA_THREADS), NB_CUDA_THREADS, 0, ctx.stream>>>(
      (char *)out->data, out->dtype, (int64_t)nb_dtype_size(out->dtype), stride, n, start, step);
  return nb_cuda_launch_check("arange");
}

/* ---- copy ----------------------------------------------------------------------- */
template <typename E>
__global__ void nb_copy_strided_kernel(E *out, const E *in, nb_iter it, int64_t n) {
  NB_GRID_LOOP(i, n) {
    int64_t off[2];
    nb_iter_offsets<2>(it, i, off);
    out[off[0]] = in[off[1]];
  }
}

template <typename TO, typename TI>
__global__ void nb_convert_contig_kernel(TO *out, const TI *in, int64_t n) {
  NB_GRID_LOOP(i, n) out[i] = nb_from_d<TO>(nb_to_f(in[i]));
}

/* Any dtype pair, any strides: integers convert exactly (saturating), floats
 * through double with the CPU's rounding. */
__global__ void nb_convert_any_kernel(char *out, int dto, int64_t eso, const char *in, int dti,
                                      int64_t esi, nb_iter it, int64_t n, int ints) {
  NB_GRID_LOOP(i, n) {
    int64_t off[2];
    nb_iter_offsets<2>(it, i, off);
    if (ints) nb_store_int(out + off[0] * eso, dto, nb_load_int(in + off[1] * esi, dti));
    else nb_store_any(out + off[0] * eso, dto, nb_load_any(in + off[1] * esi, dti));
  }
}

/* Contiguous casts to and from fp8 (E4: e4m3, else e5m2): the value
 * rounded once (through the exact double), or decoded exactly. */
template <int E4, typename TI>
__global__ void nb_to_f8_kernel(uint8_t *out, const TI *in, int64_t n) {
  NB_GRID_LOOP(i, n) out[i] = nb_f8_from_d<E4>((double)nb_to_f(in[i]));
}
template <int E4, typename TO>
__global__ void nb_from_f8_kernel(TO *out, const uint8_t *in, int64_t n) {
  NB_GRID_LOOP(i, n) out[i] = nb_from_d<TO>(nb_f8_to_f<E4>(in[i]));
}

/* A contiguous cast between a float dtype and an fp8 one (other pairs:
 * the generic kernel). */
static nb_status convert_fp8(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *in,
                             int64_t n) {
  unsigned g = nb_cuda_blocks(ctx, n, NB_CUDA_THREADS);
  if (nb_dtype_is_fp8(out->dtype)) {
    uint8_t *o = (uint8_t *)out->data;
    if (out->dtype == NB_F8E4M3) {
      NB_CUDA_FLOAT_SWITCH(in->dtype, TI, nb_to_f8_kernel<1, TI><<<g, NB_CUDA_THREADS, 0, ctx->stream>>>(
          o, (const TI *)in->data, n));
    } else {
      NB_CUDA_FLOAT_SWITCH(in->dtype, TI, nb_to_f8_kernel<0, TI><<<g, NB_CUDA_THREADS, 0, ctx->stream>>>(
          o, (const TI *)in->data, n));
    }
  } else {
    const uint8_t *x = (const uint8_t *)in->data;
    if (in->dtype == NB_F8E4M3) {
      NB_CUDA_FLOAT_SWITCH(out->dtype, TO, nb_from_f8_kernel<1, TO><<<g, NB_CUDA_THREADS, 0, ctx->stream>>>(
          (TO *)out->data, x, n));
    } else {
      NB_CUDA_FLOAT_SWITCH(out->dtype, TO, nb_from_f8_kernel<0, TO><<<g, NB_CUDA_THREADS, 0, ctx->stream>>>(
          (TO *)out->data, x, n));
    }
  }
  return nb_cuda_launch_check("copy (fp8 convert)");
}

static int is_int_dtype(nb_dtype d) { return d == NB_I64 || d == NB_I32 || d == NB_U8 || d == NB_BOOL; }

template <typename TO>
static nb_status convert_contig_from(const nb_cuda_ctx *ctx, const nb_kview *out,
                                     const nb_kview *in, int64_t n) {
  unsigned g = nb_cuda_blocks(ctx, n, NB_CUDA_THREADS);
  NB_CUDA_FLOAT_SWITCH(in->dtype, TI,
    nb_convert_contig_kernel<TO, TI><<<g, NB_CUDA_THREADS, 0, ctx->stream>>>(
        (TO *)out->data, (const TI *)in->data, n));
  return nb_cuda_launch_check("copy (convert)");
}

extern "C" nb_status nb_cuda_copy(const nb_kview *out, const nb_kview *in) {
  int64_t n = nb_kview_numel(out);
  if (n == 0) return NB_OK;
  NB_CUDA_ENTER(ctx, st, out->data, "copy");
  const nb_kview *vs[2] = {out, in};
  nb_iter it;
  nb_iter_views(&it, 2, vs);
  int contig = nb_iter_contiguous(&it, 2) && it.stride[1][0] == 1;
  unsigned g = nb_cuda_blocks(&ctx, n, NB_CUDA_THREADS);
  size_t es = nb_dtype_size(out->dtype);
  if (out->dtype == in->dtype) {
    if (contig) {
      NB_CUDA_TRY(cudaMemcpyAsync(out->data, in->data, (size_t)n * es, cudaMemcpyDeviceToDevice,
                                  ctx.stream), "copy (cudaMemcpyAsync)");
      return NB_OK;
    }
    NB_CUDA_SIZE_SWITCH(es, E,
      nb_copy_strided_kernel<E><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>((E *)out->data,
                                                                      (const E *)in->data, it, n));
    return nb_cuda_launch_check("copy (strided)");
  }
  if (contig && nb_dtype_is_float(out->dtype) && nb_dtype_is_float(in->dtype)) {
    NB_CUDA_FLOAT_SWITCH(out->dtype, TO, return convert_contig_from<TO>(&ctx, out, in, n));
  }
  if (contig && ((nb_dtype_is_fp8(out->dtype) && nb_dtype_is_float(in->dtype)) ||
                 (nb_dtype_is_fp8(in->dtype) && nb_dtype_is_float(out->dtype))))
    return convert_fp8(&ctx, out, in, n);
  nb_convert_any_kernel<<<g, NB_CUDA_THREADS, 0, ctx.stream>>>(
      (char *)out->data, out->dtype, (int64_t)es, (const char *)in->data, in->dtype,
      (int64_t)nb_dtype_size(in->dtype), it, n, is_int_dtype(out->dtype) && is_int_dtype(in->dtype));
  return nb_cuda_launch_check("copy (convert strided)");
}

/* ---- contiguous vector paths: shared launch shape ------------------------ */
#define NB_EW_UNROLL 4
#define NB_EW_BLOCK_PACKS (NB_CUDA_THREADS * NB_EW_UNROLL)

/* Blocks for n elements of size es in 16-byte packs: one per
 * NB_EW_BLOCK_PACKS packs (at least one, for the scalar tail), capped at
 * what gridDim.x holds; the kernels loop if the cap is reached. */
static unsigned nb_ew_grid(int64_t n, size_t es, int unroll = NB_EW_UNROLL) {
  int64_t nv = n / (int64_t)(16 / es), bp = (int64_t)NB_CUDA_THREADS * unroll;
  int64_t b = (nv + bp - 1) / bp;
  if (b < 1) b = 1;
  if (b > 0x7fffffff) b = 0x7fffffff;
  return (unsigned)b;
}

/* Outputs larger than L2 (50 MB on an H100) cannot be read back from it by
 * the next op, so their stores bypass it (evict-first); smaller ones stay. */
static int nb_ew_stream_out(int64_t n, size_t es) { return (double)n * (double)es > 64e6; }

template <typename T> __device__ __forceinline__ nb_pack<T> nb_ew_load(const nb_pack<T> *p) {
  return *p; /* plain ld.global.v4: in-place ops (out == in) rule out .nc */
}
template <typename T> __device__ __forceinline__ void nb_ew_store(nb_pack<T> *p, const nb_pack<T> &v, int cs) {
  if (cs) __stcs((int4 *)p, *(const int4 *)&v);
  else *(int4 *)p = *(const int4 *)&v;
}

/* ---- unary ------------------------------------------------------------------------ */
__device__ __forceinline__ float nb_rsqrt_(float x) { return rsqrtf(x); }
__device__ __forceinline__ double nb_rsqrt_(double x) { return rsqrt(x); }

/* GELU, tanh form: 0.5 x (1 + tanh(u)) = x s, u = k (x + 0.044715 x^3),
 * s = 0.5 (1 + tanh(u)) = sigmoid(2u). s and 1 - s are both taken from
 * t = e^(-2|u|) in (0, 1]: sigmoid(2|u|) = 1 / (1 + t) and sigmoid(-2|u|) =
 * t / (1 + t), so neither 1 + tanh(u) (which loses every bit for x < 0)
 * nor an overflowing e^(-2u) (which turned the far negative tail into 0 or
 * NaN) appears: within a few ulp of the exact value over the whole range,
 * down to the subnormals (the standard exp and correctly rounded
 * divisions). */
#define NB_GELU_K 0.79788456080286535588
template <typename C> struct nb_gelu_s { C s, oms; }; /* s and 1 - s */
/* 1 / d correctly rounded for d in [1, 2] (or NaN): the fast path of the
 * compiler's IEEE division (reciprocal estimate, one Newton step), which it
 * takes for every such d, without the test for huge or tiny d and the call
 * to the slow path that fenced each element's math from the next one's. */
__device__ __forceinline__ float nb_rcp_1_2(float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return fmaf(r, -fmaf(d, r, -1.0f), r);
}
__device__ __forceinline__ double nb_rcp_1_2(double d) { return 1.0 / d; }

template <typename C> __device__ __forceinline__ nb_gelu_s<C> nb_gelu_sig(C u) {
  C t = exp((C)-2 * fabs(u)), hi = nb_rcp_1_2((C)1 + t), lo = t * hi; /* 1 + t in [1, 2] */
  nb_gelu_s<C> r;
  r.s = u >= 0 ? hi : lo;
  r.oms = u >= 0 ? lo : hi;
  return r;
}
__device__ __forceinline__ float nb_gelu_u(float x) {
  return (float)NB_GELU_K * fmaf(0.044715f * x, x * x, x);
}
__device__ __forceinline__ double nb_gelu_u(double x) {
  return NB_GELU_K * fma(0.044715 * x, x * x, x);
}
template <typename C> __device__ __forceinline__ C nb_gelu_tanh_(C x) {
  return x * nb_gelu_sig(nb_gelu_u(x)).s;
}
/* d/dx: s + 2 x s (1 - s) k (1 + 0.134145 x^2). */
template <typename C> __device__ __forceinline__ C nb_gelu_tanh_d_(C x) {
  nb_gelu_s<C> g = nb_gelu_sig(nb_gelu_u(x));
  return g.s + (C)2 * x * g.s * g.oms * (C)NB_GELU_K * ((C)0.134145 * x * x + (C)1);
}

/* The primitives of backend/ew_list.h; C is float (f32, f16 and bf16 compute
 * in float) or double. Formulas follow the CPU kernels' definitions. */
template <typename C> __device__ __forceinline__ C nb_ew_sigmoid(C x) { return (C)1 / ((C)1 + exp(-x)); }
template <typename C> __device__ __forceinline__ C nb_ew_silu_d(C x) {
  C s = nb_ew_sigmoid(x);
  return s * ((C)1 + x * ((C)1 - s));
}
/* x Phi(x) = x erfc(-x / sqrt 2) / 2: 1 + erf cancels for x < 0 */
template <typename C> __device__ __forceinline__ C nb_ew_gelu_erf(C x) {
  return (C)0.5 * x * erfc(x * (C)-0.70710678118654752440);
}
template <typename C> __device__ __forceinline__ C nb_ew_gelu_erf_d(C x) {
  C cdf = (C)0.5 * erfc(x * (C)-0.70710678118654752440);
  C pdf = (C)0.39894228040143267794 * exp(-(C)0.5 * x * x);
  return cdf + x * pdf;
}
#define E_ABS(x) fabs(x)
#define E_EXP(x) exp(x)
#define E_LOG(x) log(x)
#define E_LOG1P(x) log1p(x)
#define E_EXPM1(x) expm1(x)
#define E_SQRT(x) sqrt(x)
#define E_RSQRT(x) nb_rsqrt_(x)
#define E_SIN(x) sin(x)
#define E_COS(x) cos(x)
#define E_TANH(x) tanh(x)
#define E_FLOOR(x) floor(x)
#define E_CEIL(x) ceil(x)
#define E_ROUND(x) rint(x) /* half to even */
#define E_SIGMOID(x) nb_ew_sigmoid(x)
#define E_SILU(x) ((x) / (1 + exp(-(x))))
#define E_SILU_D(x) nb_ew_silu_d(x)
#define E_SOFTPLUS(x) (((x) > 0 ? (x) : 0) + log1p(exp(-fabs(x)))) /* no overflow */
#define E_GELU_ERF(x) nb_ew_gelu_erf(x)
#define E_GELU_ERF_D(x) nb_ew_gelu_erf_d(x)
#define E_GELU_TANH(x) nb_gelu_tanh_(x)
#define E_GELU_TANH_D(x) nb_gelu_tanh_d_(x)
#define E_POW(x, z) pow(x, z)
#define E_MAX(x, z) (((x) > (z) || (x) != (x)) ? (x) : (z)) /* NaN propagates */
#define E_MIN(x, z) (((x) < (z) || (x) != (x)) ? (x) : (z))
/* integers through double, stored with the CPU's saturation */
#define E_IPOW(x, z) nb_sat_i64(pow((double)(x), (double)(z)), -9223372036854775808.0, 9223372036854774784.0)

#define NB_UOP_APPLY(ID, KNAME, NAME, INT, SAVE, EXPR, ...) case NB_UOP_##ID: return EXPR;
#define NB_UOP_D_APPLY(ID, KNAME, NODE, EXPR) case NB_UOP_##ID: return EXPR;
template <typename C> __device__ __forceinline__ C nb_uop_apply(int op, C x) {
  switch (op) {
  NB_UOP_LIST(NB_UOP_APPLY)
  NB_UOP_DERIVATIVE_LIST(NB_UOP_D_APPLY)
  default: return x;
  }
}

/* Integers: the rows with an integer kernel (the others are float-only). */
#define NB_UOP_INT(ID, KNAME, NAME, INT, SAVE, EXPR, IEXPR, ...)                  \
  case NB_UOP_##ID:                                                               \
    if (INT == 1) return IEXPR;                                                   \
    break;
__device__ __forceinline__ int64_t nb_uop_int(int op, int64_t x) {
  switch (op) {
  NB_UOP_LIST(NB_UOP_INT)
  default: break;
  }
  return x;
}

template <typename T> __device__ __forceinline__ T nb_uop_elem(int op, T x) {
  return nb_from_d<T>(nb_uop_apply(op, nb_to_f(x)));
}
template <> __device__ __forceinline__ float nb_uop_elem<float>(int op, float x) {
  return nb_uop_apply(op, x);
}
template <> __device__ __forceinline__ __half nb_uop_elem<__half>(int op, __half x) {
  return __float2half_rn(nb_uop_apply(op, __half2float(x)));
}
template <> __device__ __forceinline__ __nv_bfloat16 nb_uop_elem<__nv_bfloat16>(int op, __nv_bfloat16 x) {
  return __float2bfloat16_rn(nb_uop_apply(op, __bfloat162float(x)));
}
template <> __device__ __forceinline__ int64_t nb_uop_elem<int64_t>(int op, int64_t x) {
  return nb_uop_int(op, x);
}
template <> __device__ __forceinline__ int32_t nb_uop_elem<int32_t>(int op, int32_t x) {
  return (int32_t)nb_uop_int(op, x);
}
template <> __device__ __forceinline__ uint8_t nb_uop_elem<uint8_t>(int op, uint8_t x) {
  return (uint8_t)nb_uop_int(op, x);
}

/* Contiguous unary: each thread handles NB_EW_UNROLL 16-byte packs per
 * iteration, all loaded before any is computed, so several loads are in
 * flight per thread (one per thread left the f32 GELU short of the copy
 * rate). One block covers NB_EW_BLOCK_PACKS packs and the grid covers the
 * whole tensor (see nb_ew_grid), so blocks finish in the hardware
 * scheduler's order without a grid-stride tail. cs streams the output past
 * the caches (st.global.cs) for tensors larger than L2. OP is the op when
 * it is fixed at compile time (float dtypes), -1 to read op at run time. */
template <typename T, int OP, int U>
__global__ void __launch_bounds__(NB_CUDA_THREADS)
nb_unary_vec_kernel(int op_rt, T *out, const T *in, int64_t n, int cs) {
  const int op = OP >= 0 ? OP : op_rt;
  const int per = 16 / sizeof(T);
  const int64_t nv = n / per;
  const nb_pack<T> *pin = (const nb_pack<T> *)in;
  nb_pack<T> *pout = (nb_pack<T> *)out;
  for (int64_t base = (int64_t)blockIdx.x * NB_CUDA_THREADS * U + threadIdx.x; base < nv;
       base += (int64_t)gridDim.x * NB_CUDA_THREADS * U) {
    nb_pack<T> p[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      int64_t i = base + u * NB_CUDA_THREADS;
      if (i < nv) p[u] = nb_ew_load(pin + i);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int64_t i = base + u * NB_CUDA_THREADS;
      if (i < nv) {
#pragma unroll
        for (int k = 0; k < per; k++) p[u].v[k] = nb_uop_elem<T>(op, p[u].v[k]);
        nb_ew_store(pout + i, p[u], cs);
      }
    }
  }
  NB_GRID_LOOP(i, n - nv * per) out[nv * per + i] = nb_uop_elem<T>(op, in[nv * per + i]);
}

/* The float dtypes get a kernel per op; the integer ones one kernel. */
template <typename T> struct nb_ew_per_op { enum { value = 0 }; };
template <> struct nb_ew_per_op<double> { enum { value = 1 }; };
template <> struct nb_ew_per_op<float> { enum { value = 1 }; };
template <> struct nb_ew_per_op<__half> { enum { value = 1 }; };
template <> struct nb_ew_per_op<__nv_bfloat16> { enum { value = 1 }; };
#define NB_EW_OP(T, OP) (nb_ew_per_op<T>::value ? (int)(OP) : -1)

/* Packs a thread loads per iteration: NB_EW_UNROLL, but 2 for sin, cos and
 * f64 rsqrt, whose inlined slow paths (the Payne-Hanek reduction, rsqrt's
 * special cases) made ptxas spill at 4 (8-12 bytes on sm_80 for every float
 * type, sm_90a f64 sin/cos, sm_80 f64 rsqrt: the thread index, kept for the
 * scalar tail, at 32 registers); at 2 none spills. */
template <typename T, int OP> struct nb_uop_unroll {
  enum { value = OP == NB_UOP_SIN || OP == NB_UOP_COS || (sizeof(T) == 8 && OP == NB_UOP_RSQRT) ? 2 : NB_EW_UNROLL };
};

template <typename T, int OP>
static void unary_vec_launch(const nb_cuda_ctx *ctx, int op, T *out, const T *in, int64_t n) {
  const int u = nb_uop_unroll<T, OP>::value;
  nb_unary_vec_kernel<T, OP, u><<<nb_ew_grid(n, sizeof(T), u), NB_CUDA_THREADS, 0, ctx->stream>>>(
      op, out, in, n, nb_ew_stream_out(n, sizeof(T)));
}

#define NB_UOP_LAUNCH(ID, ...)                                                      \
  case NB_UOP_##ID: unary_vec_launch<T, NB_EW_OP(T, NB_UOP_##ID)>(ctx, op, out, in, n); break;
template <typename T>
static void unary_vec(const nb_cuda_ctx *ctx, nb_uop op, T *out, const T *in, int64_t n) {
  switch (op) {
  NB_UOP_LIST(NB_UOP_LAUNCH)
  NB_UOP_DERIVATIVE_LIST(NB_UOP_LAUNCH)
  default: break;
  }
}

template <typename T>
__global__ void nb_unary_strided_kernel(int op, T *out, const T *in, nb_iter it, int64_t n) {
  NB_GRID_LOOP(i, n) {
    int64_t off[2];
    nb_iter_offsets<2>(it, i, off);
    out[off[0]] = nb_uop_elem<T>(op, in[off[1]]);
  }
}

template <typename T>
static nb_status unary_run(const nb_cuda_ctx *ctx, nb_uop op, const nb_kview *out,
                           const nb_kview *in) {
  const nb_kview *vs[2] = {out, in};
  nb_iter it;
  nb_iter_views(&it, 2, vs);
  int64_t n = nb_kview_numel(out);
  unsigned g = nb_cuda_blocks(ctx, n, NB_CUDA_THREADS);
  if (nb_iter_contiguous(&it, 2) && it.stride[1][0] == 1 && nb_cuda_aligned16(out->data) &&
      nb_cuda_aligned16(in->data))
    unary_vec<T>(ctx, op, (T *)out->data, (const T *)in->data, n);
  else
    nb_unary_strided_kernel<T><<<g, NB_CUDA_THREADS, 0, ctx->stream>>>(
        (int)op, (T *)out->data, (const T *)in->data, it, n);
  return nb_cuda_launch_check("unary");
}

extern "C" nb_status nb_cuda_unary(nb_uop op, const nb_kview *out, const nb_kview *in) {
  if (nb_kview_numel(out) == 0) return NB_OK;
  NB_CUDA_ENTER(ctx, st, out->data, "unary");
  switch (in->dtype) {
  case NB_F64: return unary_run<double>(&ctx, op, out, in);
  case NB_F32: return unary_run<float>(&ctx, op, out, in);
  case NB_F16: return unary_run<__half>(&ctx, op, out, in);
  case NB_BF16: return unary_run<__nv_bfloat16>(&ctx, op, out, in);
  case NB_I64: return unary_run<int64_t>(&ctx, op, out, in);
  case NB_I32: return unary_run<int32_t>(&ctx, op, out, in);
  case NB_U8: case NB_BOOL: return unary_run<uint8_t>(&ctx, op, out, in);
  default: return nb_error_set(NB_ERR_DTYPE, "cuda unary: dtype %s", nb_dtype_name(in->dtype));
  }
}

/* ---- binary --------------------------------------------------------------------------- */
#define NB_BOP_APPLY(ID, KNAME, NAME, INT, EXPR, ...) case NB_BOP_##ID: return EXPR;
#define NB_CMP_APPLY(ID, NAME, EXPR) case NB_BOP_##ID: return EXPR;
template <typename C> __device__ __forceinline__ C nb_bop_apply(int op, C x, C z) {
  switch (op) {
  NB_BOP_LIST(NB_BOP_APPLY)
  NB_BOP_DERIVATIVE_LIST(NB_BOP_APPLY)
  NB_CMP_LIST(NB_CMP_APPLY)
  default: return x;
  }
}

/* Integer binary ops in int64 (wrapping like the C operators); POW goes
 * through double with the CPU's saturating store. DIV is float-only. */
#define NB_BOP_INT(ID, KNAME, NAME, INT, EXPR, IEXPR, ...)                        \
  case NB_BOP_##ID:                                                               \
    if (INT == 1) return IEXPR;                                                   \
    break;
__device__ __forceinline__ int64_t nb_bop_int(int op, int64_t x, int64_t z) {
  switch (op) {
  NB_BOP_LIST(NB_BOP_INT)
  NB_CMP_LIST(NB_CMP_APPLY)
  default: break;
  }
  return x;
}

template <typename T> struct nb_bop_elem {
  /* floats: compute in float (double for f64), store rounded */
  __device__ static __forceinline__ T run(int op, T a, T b) {
    return nb_from_d<T>(nb_bop_apply(op, nb_to_f(a), nb_to_f(b)));
  }
  __device__ static __forceinline__ uint8_t cmp(int op, T a, T b) {
    return nb_bop_apply(op, nb_to_f(a), nb_to_f(b)) != 0;
  }
};
template <> struct nb_bop_elem<float> {
  __device__ static __forceinline__ float run(int op, float a, float b) { return nb_bop_apply(op, a, b); }
  __device__ static __forceinline__ uint8_t cmp(int op, float a, float b) { return nb_bop_apply(op, a, b) != 0; }
};
#define NB_INT_BOP(T)                                                                       \
  template <> struct nb_bop_elem<T> {                                                       \
    __device__ static __forceinline__ T run(int op, T a, T b) { return (T)nb_bop_int(op, a, b); } \
    __device__ static __forceinline__ uint8_t cmp(int op, T a, T b) { return nb_bop_int(op, a, b) != 0; } \
  };
NB_INT_BOP(int64_t)
NB_INT_BOP(int32_t)
NB_INT_BOP(uint8_t)

/* A bool result of an integer op (bool * bool, max) stays 0 or 1. */
template <typename T> __device__ __forceinline__ T nb_boolify(T r) { return r; }
__device__ __forceinline__ uint8_t nb_boolify(uint8_t r) { return r != 0; }

/* a_step/b_step are 1 for a contiguous operand, 0 for a broadcast scalar.
 * Same shape of work as the unary vector kernel: NB_EW_UNROLL packs of each
 * operand loaded per thread before any is computed. */
template <typename T>
__device__ __forceinline__ nb_pack<T> nb_binary_pack(int op, const nb_pack<T> &pa, const nb_pack<T> &pb,
                                                     int a_step, int b_step, T as, T bs, int is_bool) {
  const int per = 16 / sizeof(T);
  nb_pack<T> po;
#pragma unroll
  for (int k = 0; k < per; k++) {
    T r = nb_bop_elem<T>::run(op, a_step ? pa.v[k] : as, b_step ? pb.v[k] : bs);
    po.v[k] = is_bool ? nb_boolify(r) : r;
  }
  return po;
}

template <typename T, int OP>
__global__ void __launch_bounds__(NB_CUDA_THREADS)
nb_binary_vec_kernel(int op_rt, T *out, const T *a, const T *b, int a_step, int b_step, int64_t n,
                     int is_bool, int cs) {
  const int op = OP >= 0 ? OP : op_rt; /* as in nb_unary_vec_kernel */
  const int per = 16 / sizeof(T);
  const int64_t nv = n / per;
  const T as = a[0], bs = b[0];
  const nb_pack<T> *pa = (const nb_pack<T> *)a, *pb = (const nb_pack<T> *)b;
  for (int64_t base = (int64_t)blockIdx.x * NB_EW_BLOCK_PACKS + threadIdx.x; base < nv;
       base += (int64_t)gridDim.x * NB_EW_BLOCK_PACKS) {
    nb_pack<T> va[NB_EW_UNROLL], vb[NB_EW_UNROLL];
#pragma unroll
    for (int u = 0; u < NB_EW_UNROLL; u++) {
      int64_t i = base + u * NB_CUDA_THREADS;
      if (i < nv) {
        if (a_step) va[u] = nb_ew_load(pa + i);
        if (b_step) vb[u] = nb_ew_load(pb + i);
      }
    }
#pragma unroll
    for (int u = 0; u < NB_EW_UNROLL; u++) {
      int64_t i = base + u * NB_CUDA_THREADS;
      if (i < nv)
        nb_ew_store((nb_pack<T> *)out + i,
                    nb_binary_pack<T>(op, va[u], vb[u], a_step, b_step, as, bs, is_bool), cs);
    }
  }
  NB_GRID_LOOP(i, n - nv * per) {
    int64_t j = nv * per + i;
    T r = nb_bop_elem<T>::run(op, a[j * a_step], b[j * b_step]);
    out[j] = is_bool ? nb_boolify(r) : r;
  }
}

template <typename T, int OP>
static void binary_vec_launch(const nb_cuda_ctx *ctx, int op, T *out, const T *a, const T *b,
                              int sa, int sb, int64_t n, int is_bool) {
  nb_binary_vec_kernel<T, OP><<<nb_ew_grid(n, sizeof(T)), NB_CUDA_THREADS, 0, ctx->stream>>>(
      op, out, a, b, sa, sb, n, is_bool, nb_ew_stream_out(n, sizeof(T)));
}

#define NB_BOP_LAUNCH(ID, ...)                                                      \
  case NB_BOP_##ID:                                                                 \
    binary_vec_launch<T, NB_EW_OP(T, NB_BOP_##ID)>(ctx, op, out, a, b, sa, sb, n, is_bool); \
    break;
/* The arithmetic ops (comparisons take the strided kernel). */
template <typename T>
static void binary_vec(const nb_cuda_ctx *ctx, nb_bop op, T *out, const T *a, const T *b, int sa,
                       int sb, int64_t n, int is_bool) {
  switch (op) {
  NB_BOP_LIST(NB_BOP_LAUNCH)
  NB_BOP_DERIVATIVE_LIST(NB_BOP_LAUNCH)
  default: break;
  }
}

/* A row or column broadcast: out (M, N) = a (M, N) op r, or r op a (swap),
 * out and a contiguous, r a row (N) repeated over the rows (COL 0, the bias
 * add of a linear layer) or a column (M, 1) repeated along each row (COL 1,
 * its elements rs apart), N a multiple of the pack width so that no pack
 * straddles two rows. Pack p of a lies in row q = p / nr (nr packs a row,
 * nb_fastdiv: the pack count is below 2^32) at pack j = p - q nr of it, and
 * meets r's pack j (a 16-byte load that hits L1 or L2 after the first rows)
 * or r[q rs] (one element, splat). The shape of nb_binary_vec_kernel:
 * NB_EW_UNROLL packs of each operand loaded before any is computed, the op
 * fixed at compile time (float dtypes only). */
template <typename T, int OP, int COL>
__global__ void __launch_bounds__(NB_CUDA_THREADS)
nb_binary_bcast_kernel(T *out, const T *a, const T *r, uint32_t nv, nb_fastdiv nr, int64_t rs,
                       int swap, int cs) {
  const int per = 16 / sizeof(T);
  const nb_pack<T> *pa = (const nb_pack<T> *)a, *pr = (const nb_pack<T> *)r;
  for (int64_t base = (int64_t)blockIdx.x * NB_EW_BLOCK_PACKS + threadIdx.x; base < nv;
       base += (int64_t)gridDim.x * NB_EW_BLOCK_PACKS) {
    nb_pack<T> va[NB_EW_UNROLL], vr[NB_EW_UNROLL];
#pragma unroll
    for (int u = 0; u < NB_EW_UNROLL; u++) {
      int64_t i = base + u * NB_CUDA_THREADS;
      if (i < nv) {
        uint32_t q = nb_fastdiv_div(nr, (uint32_t)i);
        va[u] = nb_ew_load(pa + i);
        if (COL) {
          T c = r[q * rs];
#pragma unroll
          for (int k = 0; k < per; k++) vr[u].v[k] = c;
        } else {
          vr[u] = nb_ew_load(pr + ((uint32_t)i - q * nr.d));
        }
      }
    }
#pragma unroll
    for (int u = 0; u < NB_EW_UNROLL; u++) {
      int64_t i = base + u * NB_CUDA_THREADS;
      if (i < nv) {
        /* x + z and x * z are z + x and z * x to the bit (a NaN result is the
         * canonical NaN): no selects for their swap */
        const int sw = OP != NB_BOP_ADD && OP != NB_BOP_MUL && swap;
        nb_pack<T> x = sw ? vr[u] : va[u], z = sw ? va[u] : vr[u];
        nb_pack<T> po;
#pragma unroll
        for (int k = 0; k < per; k++) po.v[k] = nb_bop_elem<T>::run(OP, x.v[k], z.v[k]);
        nb_ew_store((nb_pack<T> *)out + i, po, cs);
      }
    }
  }
}

template <typename T, int OP, int COL>
static void binary_bcast_launch(const nb_cuda_ctx *ctx, T *out, const T *a, const T *r,
                                int64_t n, int64_t row, int64_t rs, int swap) {
  const int per = 16 / sizeof(T);
  nb_binary_bcast_kernel<T, OP, COL><<<nb_ew_grid(n, sizeof(T)), NB_CUDA_THREADS, 0, ctx->stream>>>(
      out, a, r, (uint32_t)(n / per), nb_fastdiv_make((uint32_t)(row / per)), rs, swap,
      nb_ew_stream_out(n, sizeof(T)));
}

/* The broadcast kernels are instantiated for the float dtypes only (the
 * integer ones take the strided kernel). */
#define NB_BOP_BCAST(ID, ...)                                                               \
  case NB_BOP_##ID:                                                                         \
    if (col) binary_bcast_launch<T, NB_BOP_##ID, 1>(ctx, out, a, r, n, row, rs, swap);      \
    else binary_bcast_launch<T, NB_BOP_##ID, 0>(ctx, out, a, r, n, row, rs, swap);          \
    return 1;
template <typename T, int PER_OP = nb_ew_per_op<T>::value> struct nb_binary_bcast {
  static int run(const nb_cuda_ctx *ctx, nb_bop op, T *out, const T *a, const T *r, int64_t n,
                 int64_t row, int col, int64_t rs, int swap) {
    switch (op) {
    NB_BOP_LIST(NB_BOP_BCAST)
    NB_BOP_DERIVATIVE_LIST(NB_BOP_BCAST)
    default: return 0;
    }
  }
};
template <typename T> struct nb_binary_bcast<T, 0> {
  static int run(const nb_cuda_ctx *, nb_bop, T *, const T *, const T *, int64_t, int64_t, int,
                 int64_t, int) {
    return 0;
  }
};

/* The row or column broadcast of a two-axis iteration, if it is one the
 * kernel above takes: 1 launched, 0 not that shape. */
template <typename T>
static int binary_bcast_try(const nb_cuda_ctx *ctx, nb_bop op, const nb_kview *out,
                            const nb_kview *a, const nb_kview *b, const nb_iter *it) {
  const int64_t per = 16 / (int64_t)sizeof(T), m = it->size[0], row = it->size[1];
  if (!nb_ew_per_op<T>::value || op >= NB_BOP_EQ || it->ndim != 2 || row % per ||
      m * row / per >= ((int64_t)1 << 32))
    return 0;
  const int64_t *so = it->stride[0], *s1 = it->stride[1], *s2 = it->stride[2];
  if (so[0] != row || so[1] != 1 || !nb_cuda_aligned16(out->data)) return 0;
  int swap = !(s1[0] == row && s1[1] == 1); /* the full operand is b */
  const int64_t *sr = swap ? s1 : s2, *sf = swap ? s2 : s1;
  const nb_kview *full = swap ? b : a, *r = swap ? a : b;
  if (sf[0] != row || sf[1] != 1 || !nb_cuda_aligned16(full->data)) return 0;
  int col;
  if (sr[0] == 0 && sr[1] == 1 && nb_cuda_aligned16(r->data)) col = 0;
  else if (sr[1] == 0) col = 1;
  else return 0;
  return nb_binary_bcast<T>::run(ctx, op, (T *)out->data, (const T *)full->data,
                                 (const T *)r->data, m * row, row, col, sr[0], swap);
}

template <typename T>
__global__ void nb_binary_strided_kernel(int op, char *out, const T *a, const T *b, nb_iter it,
                                         int64_t n, int cmp, int is_bool) {
  NB_GRID_LOOP(i, n) {
    int64_t off[3];
    nb_iter_offsets<3>(it, i, off);
    if (cmp) {
      out[off[0]] = nb_bop_elem<T>::cmp(op, a[off[1]], b[off[2]]);
    } else {
      T r = nb_bop_elem<T>::run(op, a[off[1]], b[off[2]]);
      ((T *)out)[off[0]] = is_bool ? nb_boolify(r) : r;
    }
  }
}

/* Stride of an operand in a one-axis iteration: 1 contiguous, 0 scalar, -1 other. */
static int lin_step(const nb_iter *it, int k) {
  if (it->ndim != 1) return -1;
  int64_t s = it->stride[k][0];
  return s == 0 ? 0 : s == 1 || it->size[0] == 1 ? 1 : -1;
}

template <typename T>
static nb_status binary_run(const nb_cuda_ctx *ctx, nb_bop op, const nb_kview *out,
                            const nb_kview *a, const nb_kview *b) {
  const nb_kview *vs[3] = {out, a, b};
  nb_iter it;
  nb_iter_views(&it, 3, vs);
  int64_t n = nb_kview_numel(out);
  unsigned g = nb_cuda_blocks(ctx, n, NB_CUDA_THREADS);
  int cmp = op >= NB_BOP_EQ, is_bool = out->dtype == NB_BOOL;
  int so = lin_step(&it, 0), sa = lin_step(&it, 1), sb = lin_step(&it, 2);
  int aligned = nb_cuda_aligned16(out->data) && (sa == 0 || nb_cuda_aligned16(a->data)) &&
                (sb == 0 || nb_cuda_aligned16(b->data));
  if (!cmp && so == 1 && sa >= 0 && sb >= 0 && aligned)
    binary_vec<T>(ctx, op, (T *)out->data, (const T *)a->data, (const T *)b->data, sa, sb, n,
                  is_bool);
  else if (binary_bcast_try<T>(ctx, op, out, a, b, &it))
    ;
  else
    nb_binary_strided_kernel<T><<<g, NB_CUDA_THREADS, 0, ctx->stream>>>(
        (int)op, (char *)out->data, (const T *)a->data, (const T *)b->data, it, n, cmp, is_bool);
  return nb_cuda_launch_check("binary");
}

extern "C" nb_status nb_cuda_binary(nb_bop op, const nb_kview *out, const nb_kview *a,
                                    const nb_kview *b) {
  if (nb_kview_numel(out) == 0) return NB_OK;
  NB_CUDA_ENTER(ctx, st, out->data, "binary");
  if (op == NB_BOP_DIV && !nb_dtype_is_float(a->dtype))
    return nb_error_set(NB_ERR_DTYPE, "cuda binary: div on dtype %s (expected a float dtype)",
                        nb_dtype_name(a->dtype));
  switch (a->dtype) {
  case NB_F64: return binary_run<double>(&ctx, op, out, a, b);
  case NB_F32: return binary_run<float>(&ctx, op, out, a, b);
  case NB_F16: return binary_run<__half>(&ctx, op, out, a, b);
  case NB_BF16: return binary_run<__nv_bfloat16>(&ctx, op, out, a, b);
  case NB_I64: return binary_run<int64_t>(&ctx, op, out, a, b);
  case NB_I32: return binary_run<int32_t>(&ctx, op, out, a, b);
  case NB_U8: case NB_BOOL: return binary_run<uint8_t>(&ctx, op, out, a, b);
  default: return nb_error_set(NB_ERR_DTYPE, "cuda binary: dtype %s", nb_dtype_name(a->dtype));
  }
}

/* ---- where ------------------------------------------------------------------------------ */
template <typename E>
__global__ void nb_where_kernel(E *out, const uint8_t *cond, const E *a, const E *b, nb_iter it,
                                int64_t n) {
  NB_GRID_LOOP(i, n) {
    int64_t off[4];
    nb_iter_offsets<4>(it, i, off);
    out[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]];
  }
}

extern "C" nb_status nb_cuda_where(const nb_kview *out, const nb_kview *cond, const nb_kview *a,
                                   const nb_kview *b) {
  int64_t n = nb_kview_numel(out);
  if (n == 0) return NB_OK;
  NB_CUDA_ENTER(ctx, st, out->data, "where");
  const nb_kview *vs[4] = {out, cond, a, b};
  nb_iter it;
  nb_iter_views(&it, 4, vs);
  unsigned g = nb_cuda_blocks(&ctx, n, NB_CUDA_THREADS);
  NB_CUDA_SIZE_SWITCH(nb_dtype_size(out->dtype), E,
    nb_where_kernel<E><<<g, NB_CUDA_THREADS, 0, ctx.stream>>>(
        (E *)out->data, (const uint8_t *)cond->data, (const E *)a->data, (const E *)b->data, it, n));
  return nb_cuda_launch_check("where");
}
