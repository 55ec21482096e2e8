/* The own sm_90a GEMM's ping-pong kernel (schedule candidate "pingpong"):
 * the same operands, TMA maps, ring, epilogue and stores as the cooperative
 * kernel of gemm_sm90_kernel.cuh, which includes this file inside its
 * namespace, after its helpers and before the launch.
 *
 * In the cooperative kernel both consumer warpgroups work on one 128 x 256
 * tile and both stop for its epilogue (conversion, bias/GELU/residual,
 * staging, TMA store) while the tensor cores idle: about 10% of a tile's
 * time at K = 768 (12 k-tiles). Here each consumer warpgroup owns a whole
 * 128 x 128 tile (two m64n128 wgmma per 32 bytes of k: rows 0-63 into
 * d[0..63], rows 64-127 into d[64..127]; 128 f32 accumulators per thread,
 * as before), and the two take the CTA's tiles in turn: consumer 0 tiles
 * 0, 2, 4, ... of this CTA, consumer 1 tiles 1, 3, 5, ... Their main loops
 * alternate through two named barriers (ids 3 and 4, 256 threads: one
 * warpgroup waits, the other arrives), so one warpgroup's epilogue runs
 * while the other's main loop keeps the tensor cores busy. A warpgroup hands
 * the tensor cores over once its last k-tile's wgmma are issued, before
 * waiting for them.
 *
 * The producer fills a 6-stage ring of 32 KB stages (A 128 x 128 bytes, B
 * 128 x 128 bytes) with the tiles' k-tiles in the order the consumers take
 * them: tile j of the CTA occupies ring slots j ktiles .. (j + 1) ktiles - 1,
 * so consumer j % 2 knows where its tile starts. Each stage is released by
 * the one warpgroup that read it (empty barriers count 1). The A and B TMA
 * maps are the cooperative kernel's (A boxes of 128 rows, B boxes of 128
 * rows: one half of its B tile, now the whole B tile). Data-parallel only
 * (a persistent grid of min(tiles, SMs) CTAs, tile t of the CTA
 * blockIdx.x + t gridDim.x in the grouped raster of 128 x 128 tiles):
 * p.tiles_n counts 128-wide tile columns, p.pingpong is 1. */
#ifndef NB_GEMM_SM90_PINGPONG_CUH
#define NB_GEMM_SM90_PINGPONG_CUH

constexpr int kPPBN = 128, kPPStages = 6;
constexpr int kPPBBytes = kPPBN * kBK * 2, kPPStageBytes = kABytes + kPPBBytes;
constexpr size_t kPPSmem =
    (size_t)kPPStages * kPPStageBytes + kOutBytes + 1024 + 2 * kPPStages * sizeof(uint64_t);
static_assert(kPPSmem <= 227 * 1024, "ping-pong shared memory");

#ifdef NB_SM90A_DEVICE
#define NB_SM90_WGMMA_128(TY)                                                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                  \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " "   \
               NB_SM90_ACC64 ", %64, %65, p, 1, 1, %67, %68;\n}\n"           \
               : NB_SM90_OUT64 : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB))
#define NB_SM90_WGMMA_F8_128(FA, FB)                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                  \
               "wgmma.mma_async.sync.aligned.m64n128k32.f32." FA "." FB " "   \
               NB_SM90_ACC64 ", %64, %65, p, 1, 1;\n}\n"                     \
               : NB_SM90_OUT64 : "l"(da), "l"(db), "r"(scale_d))

/* One m64n128 wgmma over 32 bytes of k into d[0..63] (as sm90_mma). */
template <typename T, int TA, int TB> struct sm90_mma128;
template <int TA, int TB> struct sm90_mma128<__nv_bfloat16, TA, TB> {
  static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db, uint32_t scale_d) {
    NB_SM90_WGMMA_128("bf16");
  }
};
template <int TA, int TB> struct sm90_mma128<__half, TA, TB> {
  static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db, uint32_t scale_d) {
    NB_SM90_WGMMA_128("f16");
  }
};
template <int EA, int EB> struct sm90_mma128<sm90_f8<EA, EB>, 0, 0> {
  static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db, uint32_t scale_d) {
    if (EA && EB) NB_SM90_WGMMA_F8_128("e4m3", "e4m3");
    else if (EA) NB_SM90_WGMMA_F8_128("e4m3", "e5m2");
    else if (EB) NB_SM90_WGMMA_F8_128("e5m2", "e4m3");
    else NB_SM90_WGMMA_F8_128("e5m2", "e5m2");
  }
};

/* The ordering barriers: warpgroup c waits on 3 + c for its turn at the
 * tensor cores and hands them over by arriving on 3 + (c ^ 1). */
__device__ __forceinline__ void sm90_pp_wait(int c) {
  asm volatile("bar.sync %0, 256;" ::"r"(3 + c) : "memory");
}
__device__ __forceinline__ void sm90_pp_pass(int c) {
  asm volatile("bar.arrive %0, 256;" ::"r"(3 + (c ^ 1)) : "memory");
}

/* Producer: the k-tiles of the CTA's tiles in order into the ring. */
template <typename T, int TA, int TB>
__device__ __forceinline__ void sm90_pp_produce(const CUtensorMap *ma, const CUtensorMap *mb,
                                                const nb_sm90_params &p, uint32_t ring, uint32_t full,
                                                uint32_t empty) {
  int it = 0, tiles = p.tiles_m * p.tiles_n;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    int m0, n0;
    sm90_tile<kPPBN>(t, p, 0, &m0, &n0);
    for (int kt = 0; kt < p.ktiles; kt++, it++) {
      int s = it % kPPStages;
      sm90_bar_wait(empty + 8 * s, ((it / kPPStages) & 1) ^ 1); /* fresh barriers pass parity 1 */
      uint32_t fb = full + 8 * s, sa = ring + s * kPPStageBytes, sb = sa + kABytes;
      sm90_bar_expect(fb, kPPStageBytes);
      int k0 = kt * sm90_in<T>::bk;
      sm90_load_a<TA>(sa, ma, fb, m0, k0);
      if (TB) {
        for (int j = 0; j < kPPBN / 64; j++) sm90_tma_load(sb + j * kBlock64, mb, fb, n0 + 64 * j, k0);
      } else {
        sm90_tma_load(sb, mb, fb, k0, n0);
      }
    }
  }
}

/* Consumer c's main loop over one 128 x 128 tile whose k-tiles start at
 * ring slot it0; passes the tensor cores to the other warpgroup (pass)
 * once the last k-tile's wgmma are issued. */
template <typename T, int TA, int TB>
__device__ __forceinline__ void sm90_pp_consume(float *d, int c, uint32_t ring, uint32_t full,
                                                uint32_t empty, const nb_sm90_params &p, int it0,
                                                int lead, int pass) {
  const uint32_t a_lbo = TA ? kBlock64 : 16, b_lbo = TB ? kBlock64 : 16;
  for (int kt = 0; kt < p.ktiles; kt++) {
    int it = it0 + kt, s = it % kPPStages;
    sm90_bar_wait(full + 8 * s, (uint32_t)((it / kPPStages) & 1));
    uint32_t sa = ring + s * kPPStageBytes, sb = sa + kABytes;
    sm90_fence_acc(d);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int k = 0; k < kBK / 16; k++) {
      uint32_t oa = TA ? k * 2048 : k * 32, ob = TB ? k * 2048 : k * 32;
      uint64_t db = sm90_desc(sb + ob, b_lbo);
      /* rows 64-127: 64 K-major rows (8 KB) on, or the second 64-row block */
      sm90_mma128<T, TA, TB>::run(d, sm90_desc(sa + oa, a_lbo), db, kt > 0 || k > 0);
      sm90_mma128<T, TA, TB>::run(d + 64, sm90_desc(sa + 8192 + oa, a_lbo), db, kt > 0 || k > 0);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    sm90_fence_acc(d);
    if (kt > 0 && lead) sm90_bar_arrive(empty + 8 * ((it - 1) % kPPStages));
  }
  if (pass) sm90_pp_pass(c);
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  sm90_fence_acc(d);
  if (lead) sm90_bar_arrive(empty + 8 * ((it0 + p.ktiles - 1) % kPPStages));
}
#endif /* NB_SM90A_DEVICE */

template <typename T, typename TO, int TA, int TB>
__global__ void __launch_bounds__(kThreads, 1)
    sm90_pp_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                   const __grid_constant__ CUtensorMap mc, const __grid_constant__ CUtensorMap maux,
                   const __grid_constant__ nb_sm90_params p) {
#ifdef NB_SM90A_DEVICE
  extern __shared__ uint8_t sm90_raw[];
  uint32_t base = sm90_smem(sm90_raw);
  uint32_t ring = (base + 1023) & ~1023u;
  uint32_t stage = ring + kPPStages * kPPStageBytes;
  uint32_t full = stage + kOutBytes, empty = full + 8 * kPPStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kPPStages; s++) {
      sm90_bar_init(full + 8 * s, 1);
      sm90_bar_init(empty + 8 * s, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  int wg = threadIdx.x / 128;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) sm90_pp_produce<T, TA, TB>(&ma, &mb, p, ring, full, empty);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; i++) d[i] = 0.0f;
    int c = wg - 1, nbuf = 0, lead = threadIdx.x % 128 == 0;
    const float scale = sm90_in<T>::f8 ? __ldg(p.scale_a) * __ldg(p.scale_b) : 1.0f;
    int tiles = p.tiles_m * p.tiles_n, n = ((tiles - (int)blockIdx.x) + (int)gridDim.x - 1) / (int)gridDim.x;
    /* consumer 1 lets consumer 0 take the first turn */
    if (c == 1) sm90_pp_pass(c);
    for (int j = c; j < n; j += 2) {
      int m0, n0;
      sm90_tile<kPPBN>((int)blockIdx.x + j * (int)gridDim.x, p, 0, &m0, &n0);
      sm90_pp_wait(c);
      sm90_pp_consume<T, TA, TB>(d, c, ring, full, empty, p, j * p.ktiles, lead, j + 1 < n);
      if (sm90_in<T>::f8) { /* the scales, once, on the full sum */
#pragma unroll
        for (int i = 0; i < 128; i++) d[i] *= scale;
      }
      sm90_epilogue<TO, kPPBN>(d, p, &mc, &maux, stage, c, &nbuf, m0, n0);
      sm90_epilogue<TO, kPPBN>(d + 64, p, &mc, &maux, stage, c, &nbuf, m0 + 64, n0);
    }
    if (lead) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
#else
  (void)ma; (void)mb; (void)mc; (void)maux; (void)p;
#endif
}

#endif /* NB_GEMM_SM90_PINGPONG_CUH */
