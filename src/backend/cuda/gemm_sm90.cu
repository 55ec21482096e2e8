/* nabla's own GEMM for Hopper (sm_90a): C (M x N, row-major) = A (M x K) B (K x N)
 * for bf16 and f16 with f32 accumulation.
 *
 * Structure (a persistent grid of one CTA per SM, each taking 128 x 256
 * output tiles in turn in a grouped raster order; 384 threads):
 *   - warpgroup 0 is the producer: one thread issues TMA bulk tensor copies
 *     (cp.async.bulk.tensor) of the A tile (128 x 64) and B tile (256 x 64)
 *     into a 4-stage shared-memory ring; each stage has a "full" mbarrier
 *     (the copy engine completes its transaction bytes there) and an "empty"
 *     mbarrier (each consumer warpgroup arrives once it has finished reading).
 *   - warpgroups 1 and 2 are consumers: each owns 64 rows of the tile and
 *     issues wgmma.mma_async m64n256k16 reading both operands from shared
 *     memory, keeping one k-tile of wgmma in flight before releasing a stage.
 *   - setmaxnreg moves registers from the producer (40) to the consumers
 *     (232): 128 f32 accumulators per consumer thread.
 *   - Tiles are stored with the 128-byte swizzle (TMA writes it, the wgmma
 *     descriptors read it), so neither side has bank conflicts.
 *   - Operands may be K-major (row-major A, B given as (N, K)) or MN-major
 *     (transposed views): an MN-major operand is loaded as 64-wide column
 *     blocks and fed to wgmma with its transpose bit set, so NT, NN, TN and
 *     TT all run without copies.
 *   - Out-of-bounds rows/columns/k are zero-filled by TMA; the epilogue
 *     converts the f32 accumulators and stores straight to global memory
 *     with bounds checks.
 * The device code exists only in the sm_90a pass; other passes compile an
 * empty kernel, and the host never launches it off a 9.0 device. */
#include <cuda.h>
#include <cudaTypedefs.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemm_sm90.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NB_SM90A_DEVICE 1
#endif

namespace {

constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4, kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2;
constexpr int kStageBytes = kABytes + kBBytes;
constexpr size_t kSmem = (size_t)kStages * kStageBytes + 1024 + 2 * kStages * sizeof(uint64_t);

#ifdef NB_SM90A_DEVICE
constexpr int kBlock64 = 64 * 64 * 2; /* one 64 x 64 swizzled block */
constexpr int kGroupM = 8; /* tile raster: 8 tile rows walk N together (L2 reuse) */
__device__ __forceinline__ uint32_t sm90_smem(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void sm90_bar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void sm90_bar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void sm90_bar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* Spins until the barrier's phase with this parity has completed. */
__device__ __forceinline__ void sm90_bar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
}
/* 2-D TMA load of the box at (c0 inner, c1 outer) into dst, completing on bar. */
__device__ __forceinline__ void sm90_tma_load(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                              int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4}], [%2];"
               ::"r"(dst), "l"((uint64_t)map), "r"(bar), "r"(c0), "r"(c1) : "memory");
}
/* wgmma shared-memory descriptor, 128-byte swizzle. K-major: 8-row groups
 * 1024 B apart (SBO), LBO unused. MN-major: 64-element column blocks
 * kBlock64 bytes apart (LBO), 8-row k groups 1024 B apart (SBO). */
__device__ __forceinline__ uint64_t sm90_desc(uint32_t addr, uint32_t lbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
         ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void sm90_fence_acc(float *d) {
#pragma unroll
  for (int i = 0; i < 128; i++) asm volatile("" : "+f"(d[i])::"memory");
}
#define NB_SM90_WGMMA_256(TY)                                                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                 \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " "   \
               "{"                                                        \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "  \
               "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "  \
               "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "  \
               "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "  \
               "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"  \
               "}, %128, %129, p, 1, 1, %131, %132;\n}\n"                     \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
                 "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
                 "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
                 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),  \
                 "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),  \
                 "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),  \
                 "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),  \
                 "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),  \
                 "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),  \
                 "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),  \
                 "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),  \
                 "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])  \
               : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB))

/* One m64n256k16 wgmma: d += A(desc da) * B(desc db); TA/TB: transpose bits
 * (1 = the operand is MN-major in shared memory). */
template <typename T, int TA, int TB> struct sm90_mma;
template <int TA, int TB> struct sm90_mma<__nv_bfloat16, TA, TB> {
  static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db, uint32_t scale_d) {
    NB_SM90_WGMMA_256("bf16");
  }
};
template <int TA, int TB> struct sm90_mma<__half, TA, TB> {
  static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db, uint32_t scale_d) {
    NB_SM90_WGMMA_256("f16");
  }
};

__device__ __forceinline__ void sm90_store2(__nv_bfloat16 *p, float a, float b) {
  *(__nv_bfloat162 *)p = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void sm90_store2(__half *p, float a, float b) {
  *(__half2 *)p = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void sm90_store1(__nv_bfloat16 *p, float a) { *p = __float2bfloat16_rn(a); }
__device__ __forceinline__ void sm90_store1(__half *p, float a) { *p = __float2half_rn(a); }

/* Tile t of the grid in the raster order: kGroupM tile rows walk N together
 * so that their A rows and B columns stay in L2. */
__device__ __forceinline__ void sm90_tile(int t, int tiles_m, int tiles_n, int *m0, int *n0) {
  int per_group = kGroupM * tiles_n;
  int first_m = (t / per_group) * kGroupM;
  int gsize = min(tiles_m - first_m, kGroupM);
  *m0 = (first_m + (t % per_group) % gsize) * kBM;
  *n0 = ((t % per_group) / gsize) * kBN;
}

/* Producer: one thread streams the k-tiles of this CTA's output tiles into
 * the ring; it runs ahead into the next tile while the consumers store. */
template <int TA, int TB>
__device__ __forceinline__ void sm90_produce(const CUtensorMap *ma, const CUtensorMap *mb,
                                             uint32_t ring, uint32_t full, uint32_t empty,
                                             int tiles_m, int tiles_n, int ktiles) {
  int it = 0; /* k-tiles issued so far: selects stage and phase */
  for (int t = blockIdx.x; t < tiles_m * tiles_n; t += gridDim.x) {
    int m0, n0;
    sm90_tile(t, tiles_m, tiles_n, &m0, &n0);
    for (int kt = 0; kt < ktiles; kt++, it++) {
      int s = it % kStages;
      uint32_t parity = (uint32_t)((it / kStages) & 1);
      sm90_bar_wait(empty + 8 * s, parity ^ 1); /* fresh barriers pass parity 1 */
      uint32_t fb = full + 8 * s, sa = ring + s * kStageBytes, sb = sa + kABytes;
      sm90_bar_expect(fb, kStageBytes);
      int k0 = kt * kBK;
      if (TA) {
        for (int j = 0; j < kBM / 64; j++) sm90_tma_load(sa + j * kBlock64, ma, fb, m0 + 64 * j, k0);
      } else {
        sm90_tma_load(sa, ma, fb, k0, m0);
      }
      if (TB) {
        for (int j = 0; j < kBN / 64; j++) sm90_tma_load(sb + j * kBlock64, mb, fb, n0 + 64 * j, k0);
      } else {
        sm90_tma_load(sb, mb, fb, k0, n0);
      }
    }
  }
}

/* Consumer c: rows [64c, 64c + 64) of one tile, all 256 columns, over
 * k-tiles it0 .. it0 + ktiles - 1 of the ring. */
template <typename T, int TA, int TB>
__device__ __forceinline__ void sm90_consume(float *d, int c, uint32_t ring, uint32_t full,
                                             uint32_t empty, int it0, int ktiles, int lead) {
  const uint32_t a_lbo = TA ? kBlock64 : 16, b_lbo = TB ? kBlock64 : 16;
  for (int kt = 0; kt < ktiles; kt++) {
    int it = it0 + kt, s = it % kStages;
    sm90_bar_wait(full + 8 * s, (uint32_t)((it / kStages) & 1));
    uint32_t sa = ring + s * kStageBytes + c * (64 * kBK * 2), sb = ring + s * kStageBytes + kABytes;
    sm90_fence_acc(d);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int k = 0; k < kBK / 16; k++) {
      /* next 16 k: 32 bytes along a K-major row, 16 rows (2048 B) down an MN-major block */
      uint32_t oa = TA ? k * 2048 : k * 32, ob = TB ? k * 2048 : k * 32;
      sm90_mma<T, TA, TB>::run(d, sm90_desc(sa + oa, a_lbo), sm90_desc(sb + ob, b_lbo), kt > 0 || k > 0);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    sm90_fence_acc(d);
    /* the group of k-tile kt-1 has finished reading its stage */
    if (kt > 0 && lead) sm90_bar_arrive(empty + 8 * ((it - 1) % kStages));
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  sm90_fence_acc(d);
  if (lead) sm90_bar_arrive(empty + 8 * ((it0 + ktiles - 1) % kStages));
}

/* Accumulator fragment of m64nN: register i of thread (warp w, lane l) is
 * row 16w + l/4 + 8*((i/2)%2), column 8*(i/4) + 2*(l%4) + i%2. */
template <typename T>
__device__ __forceinline__ void sm90_epilogue(const float *d, T *C, int M, int N, int64_t ldc,
                                              int row0, int col0, int pairs) {
  int t = threadIdx.x % 128, w = t / 32, l = t % 32;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    int r = row0 + 16 * w + l / 4 + 8 * h;
    if (r >= M) continue;
    T *crow = C + (int64_t)r * ldc;
#pragma unroll
    for (int j = 0; j < kBN / 8; j++) {
      int col = col0 + 8 * j + 2 * (l % 4);
      float v0 = d[4 * j + 2 * h], v1 = d[4 * j + 2 * h + 1];
      if (pairs && col + 1 < N) {
        sm90_store2(crow + col, v0, v1);
      } else {
        if (col < N) sm90_store1(crow + col, v0);
        if (col + 1 < N) sm90_store1(crow + col + 1, v1);
      }
    }
  }
}
#endif /* NB_SM90A_DEVICE */

template <typename T, int TA, int TB>
__global__ void __launch_bounds__(kThreads, 1)
    sm90_gemm_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                     T *C, int M, int N, int K, int64_t ldc, int pairs) {
#ifdef NB_SM90A_DEVICE
  extern __shared__ uint8_t sm90_raw[];
  /* the 128-byte swizzle repeats every 1024 B: align the ring to it */
  uint32_t base = sm90_smem(sm90_raw);
  uint32_t ring = (base + 1023) & ~1023u;
  uint32_t full = ring + kStages * kStageBytes, empty = full + 8 * kStages;
  int tiles_m = (M + kBM - 1) / kBM, tiles_n = (N + kBN - 1) / kBN, ktiles = (K + kBK - 1) / kBK;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; s++) {
      sm90_bar_init(full + 8 * s, 1);
      sm90_bar_init(empty + 8 * s, kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  int wg = threadIdx.x / 128;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) sm90_produce<TA, TB>(&ma, &mb, ring, full, empty, tiles_m, tiles_n, ktiles);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; i++) d[i] = 0.0f;
    int c = wg - 1, it0 = 0;
    /* persistent: this CTA's tiles in turn; the first wgmma of each tile
     * (scale-d 0) overwrites the accumulators */
    for (int t = blockIdx.x; t < tiles_m * tiles_n; t += gridDim.x, it0 += ktiles) {
      int m0, n0;
      sm90_tile(t, tiles_m, tiles_n, &m0, &n0);
      sm90_consume<T, TA, TB>(d, c, ring, full, empty, it0, ktiles, threadIdx.x % 128 == 0);
      sm90_epilogue<T>(d, C, M, N, ldc, m0 + 64 * c, n0, pairs);
    }
  }
#else
  (void)ma; (void)mb; (void)C; (void)M; (void)N; (void)K; (void)ldc; (void)pairs;
#endif
}

} /* namespace */

/* ---- host --------------------------------------------------------------- */
/* cuTensorMapEncodeTiled through the runtime's driver entry point, so the
 * library needs no -lcuda. NULL when the driver lacks it. */
static PFN_cuTensorMapEncodeTiled_v12000 sm90_encode_fn(void) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
  static int tried = 0;
  if (!tried) {
    void *p = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
            cudaSuccess && q == cudaDriverEntryPointSuccess)
      fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    cudaGetLastError();
    tried = 1;
  }
  return fn;
}

/* 1 if the device is compute capability 9.0 (the sm_90a code runs there). */
static int sm90_device_ok(int dev) {
  static signed char cache[64];
  if (dev < 0 || dev >= 64) return 0;
  if (!cache[dev]) {
    int ma = 0, mi = 0;
    cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev);
    cudaGetLastError();
    cache[dev] = (ma == 9 && mi == 0) ? 1 : -1;
  }
  return cache[dev] == 1;
}

/* A 2-D 16-bit tensor map: inner x outer elements, rows stride_el apart,
 * box box_in x box_out, 128-byte swizzle, zero fill out of bounds. 0 when
 * TMA cannot take it (alignment, sizes). */
static int sm90_map(CUtensorMap *m, CUtensorMapDataType dt, const void *p, int64_t inner,
                    int64_t outer, int64_t stride_el, uint32_t box_in, uint32_t box_out) {
  PFN_cuTensorMapEncodeTiled_v12000 enc = sm90_encode_fn();
  if (!enc || ((uintptr_t)p & 15)) return 0;
  int64_t sb = outer == 1 ? ((inner * 2 + 15) & ~(int64_t)15) : stride_el * 2;
  if (sb % 16 || sb < inner * 2 || sb >= ((int64_t)1 << 40)) return 0;
  if (inner >= ((int64_t)1 << 32) || outer >= ((int64_t)1 << 32)) return 0;
  cuuint64_t dims[2] = {(cuuint64_t)inner, (cuuint64_t)outer}, strides[1] = {(cuuint64_t)sb};
  cuuint32_t box[2] = {box_in, box_out}, es[2] = {1, 1};
  return enc(m, dt, 2, (void *)p, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename T, int TA, int TB>
static nb_status sm90_launch(const nb_cuda_ctx *ctx, const CUtensorMap &ma, const CUtensorMap &mb,
                             void *c, int M, int N, int K, int64_t ldc, int pairs) {
  auto kern = sm90_gemm_kernel<T, TA, TB>;
  NB_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmem),
              "matmul sm90: shared memory attribute");
  int64_t tiles = (int64_t)((M + kBM - 1) / kBM) * ((N + kBN - 1) / kBN);
  if (tiles > ctx->n_sm) tiles = ctx->n_sm; /* persistent: one CTA per SM */
  kern<<<(unsigned)tiles, kThreads, kSmem, ctx->stream>>>(ma, mb, (T *)c, M, N, K, ldc, pairs);
  return nb_cuda_launch_check("sm90_gemm_kernel");
}

template <typename T>
static nb_status sm90_dispatch(const nb_cuda_ctx *ctx, int ta, int tb, const CUtensorMap &ma,
                               const CUtensorMap &mb, void *c, int M, int N, int K, int64_t ldc,
                               int pairs) {
  if (!ta && !tb) return sm90_launch<T, 0, 0>(ctx, ma, mb, c, M, N, K, ldc, pairs);
  if (!ta && tb) return sm90_launch<T, 0, 1>(ctx, ma, mb, c, M, N, K, ldc, pairs);
  if (ta && !tb) return sm90_launch<T, 1, 0>(ctx, ma, mb, c, M, N, K, ldc, pairs);
  return sm90_launch<T, 1, 1>(ctx, ma, mb, c, M, N, K, ldc, pairs);
}

/* Folds the batch axes of v (the first nbd) into its row axis: 1 with the
 * total row count when every batch axis of size > 1 continues the rows. */
static int sm90_fold_rows(const nb_kview *v, const int64_t *shape, int nbd, int64_t rows,
                          int64_t row_stride, int64_t *total) {
  int64_t expect = row_stride * rows, n = rows;
  for (int d = nbd - 1; d >= 0; d--) {
    if (shape[d] == 1) continue;
    if (v->strides[d] != expect || rows == 0) return 0;
    expect *= shape[d];
    n *= shape[d];
  }
  *total = n;
  return 1;
}

int nb_sm90_matmul(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a,
                                const nb_kview *b, nb_status *st) {
  *st = NB_OK;
  nb_dtype dt = out->dtype;
  if ((dt != NB_F16 && dt != NB_BF16) || a->dtype != dt || b->dtype != dt) return 0;
  int od = out->ndim, nbd = od - 2;
  if (od < 2 || a->ndim != od || b->ndim != od || !sm90_device_ok(ctx->dev)) return 0;
  int64_t M = out->shape[od - 2], N = out->shape[od - 1], K = a->shape[od - 1];
  int64_t som = out->strides[od - 2], son = out->strides[od - 1];
  int64_t sam = a->strides[od - 2], sak = a->strides[od - 1];
  int64_t sbk = b->strides[od - 2], sbn = b->strides[od - 1];
  for (int d = 0; d < nbd; d++) /* one B for every batch */
    if (out->shape[d] != 1 && b->strides[d] != 0) return 0;
  int ta = !(sak == 1 || K == 1);
  if (ta && sam != 1 && M != 1) return 0;
  int tb = !(sbk == 1 || K == 1);
  if (tb && sbn != 1 && N != 1) return 0;
  if (!(son == 1 || N == 1)) return 0;
  int64_t ldc = N == 1 ? 1 : som, rows = M, rows_a = M;
  if (M == 1) som = ldc = N; /* a single row: any row stride works */
  if (nbd > 0) {
    if (ta) { /* an MN-major A cannot absorb batches */
      for (int d = 0; d < nbd; d++)
        if (out->shape[d] != 1) return 0;
    } else if (!sm90_fold_rows(a, out->shape, nbd, M, M == 1 ? K : sam, &rows_a) ||
               !sm90_fold_rows(out, out->shape, nbd, M, som, &rows)) {
      return 0;
    }
  }
  if (rows != rows_a || rows > INT32_MAX || N > INT32_MAX || K > INT32_MAX) return 0;
  CUtensorMapDataType tdt = dt == NB_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap ma, mb;
  int ok = ta ? sm90_map(&ma, tdt, a->data, rows, K, sak, 64, 64)
              : sm90_map(&ma, tdt, a->data, K, rows, M == 1 ? K : sam, kBK, kBM);
  ok = ok && (tb ? sm90_map(&mb, tdt, b->data, N, K, sbk, 64, 64)
                 : sm90_map(&mb, tdt, b->data, K, N, N == 1 ? K : sbn, kBK, kBN));
  if (!ok) return 0;
  int pairs = ldc % 2 == 0 && ((uintptr_t)out->data & 3) == 0;
  *st = dt == NB_BF16 ? sm90_dispatch<__nv_bfloat16>(ctx, ta, tb, ma, mb, out->data, (int)rows, (int)N,
                                                     (int)K, ldc, pairs)
                      : sm90_dispatch<__half>(ctx, ta, tb, ma, mb, out->data, (int)rows, (int)N,
                                              (int)K, ldc, pairs);
  return 1;
}
