/* The kernel of nabla's own GEMM for Hopper (sm_90a): C (M x N, row-major) =
 * epilogue(alpha A (M x K) B (K x N)) with f32 accumulation, for bf16 and f16
 * operands (C in their dtype or f32; gemm_sm90.cu) and for FP8 ones, e4m3 or
 * e5m2 in any mix (C bf16, f16 or f32; nb_scaled_mm, gemm_sm90_fp8.cu). One
 * template, sm90_gemm_kernel<T, TO, TA, TB>: T the operand format
 * (__nv_bfloat16, __half, or sm90_f8<EA, EB>), TO the output's, TA/TB the
 * layouts.
 *
 * Structure (a persistent grid of one CTA per SM, each taking 128 x 256
 * output tiles in turn in a grouped raster order; 384 threads):
 *   - warpgroup 0 is the producer: one thread issues TMA bulk tensor copies
 *     (cp.async.bulk.tensor) of the A tile (128 rows) and B tile (256 rows),
 *     one k-tile deep, into a 4-stage shared-memory ring; each stage has a "full" mbarrier
 *     (the copy engine completes its transaction bytes there) and an "empty"
 *     mbarrier (each consumer warpgroup arrives once it has finished reading).
 *   - warpgroups 1 and 2 are consumers: each owns 64 rows of the tile and
 *     issues wgmma.mma_async m64n256k16 (bf16/f16) or m64n256k32 (FP8)
 *     reading both operands from shared memory, four per k-tile, keeping one
 *     k-tile of wgmma in flight before releasing a stage.
 *   - A k-tile is 128 bytes of every operand row in both families: 64 bf16
 *     or f16, 128 e4m3 or e5m2. The stage layout, the TMA boxes (in bytes)
 *     and the wgmma descriptors are byte for byte the same; each of the four
 *     wgmma of a k-tile starts 32 bytes further along the K-major rows. Only
 *     the k coordinate of the loads (64 or 128 elements a k-tile) and the
 *     instruction differ. FP8 wgmma reads K-major operands only (it has no
 *     transpose bits), so FP8 instantiates the NT layout alone.
 *   - setmaxnreg moves registers from the producer (40) to the consumers
 *     (232): 128 f32 accumulators per consumer thread.
 *   - Tiles are stored with the 128-byte swizzle (TMA writes it, the wgmma
 *     descriptors read it), so neither side has bank conflicts.
 *   - Operands may be K-major (row-major A, B given as (N, K)) or MN-major
 *     (transposed views): an MN-major operand is loaded as 64-wide column
 *     blocks and fed to wgmma with its transpose bit set, so NT, NN, TN and
 *     TT all run without copies.
 *   - Out-of-bounds rows/columns/k are zero-filled by TMA.
 *   - Epilogue: FP8 first multiplies the accumulators by the per-tensor
 *     scales s_a s_b (p.scale_a, p.scale_b: device pointers, read once per
 *     consumer), after a split tile's partials are added: the scales apply
 *     exactly once, to the full sum (partials are unscaled). Then the
 *     accumulators get alpha, beta * C_in, bias and GELU in
 *     registers, then go out through shared memory: each consumer writes
 *     64 x 64 (16-bit) or 64 x 32 (f32) chunks into one of its two 8 KB
 *     staging buffers (stmatrix / st.shared in the 128-byte swizzle, no bank
 *     conflicts) and one thread issues a TMA store of the chunk. The stores
 *     drain while the consumers run the next tile's main loop; a buffer is
 *     rewritten only after the store two chunks back has read it
 *     (cp.async.bulk.wait_group.read 1). TMA clips rows and columns past the
 *     edges. An output TMA cannot describe is stored directly instead.
 *   - Split-K: when the tiles fill at most half of the SMs and K is long
 *     (weight gradients), each tile's k range is cut into S equal parts,
 *     one CTA each (S * tiles <= SMs, one wave). CTA u takes part u / tiles
 *     of tile u % tiles, so all CTAs of a part read the same k columns at
 *     the same time and share them in L2. A part other than the last
 *     writes its partial tile (f32) to a workspace slot of its own and
 *     raises a flag; the last part's CTA (the highest-numbered: it waits
 *     only on CTAs launched before it) adds the others in part order and
 *     stores the tile: deterministic, no atomics on data. Stream-K (an
 *     even split of the k-iterations over the CTAs, a tuning candidate)
 *     uses the same partial tiles; dpsk (data-parallel + stream-K tail, a
 *     tuning candidate) runs the full waves of tiles data-parallel and
 *     splits only the last partial wave's tiles so (gemm_sm90_plan.cu).
 *   - Ping-pong (a tuning candidate, p.pingpong): a second kernel,
 *     gemm_sm90_pingpong.cuh (included below), whose consumer warpgroups
 *     each own a 128 x 128 tile in turn, so one's epilogue overlaps the
 *     other's main loop; same maps, epilogue and stores.
 *   - Clusters of 2 (a tuning candidate): the two CTAs take vertically
 *     adjacent tiles in step; each producer loads its own A tile and one
 *     half of the shared B tile, multicast into both CTAs' rings (one TMA
 *     with a CTA mask), so each full barrier receives half of B from each
 *     producer; a stage is refilled only when the consumers of both CTAs
 *     have released it (each arrives on its own and the other's empty
 *     barrier).
 *   - Schedules: the raster group, split-K, stream-K, clusters and the grid size are
 *     launch parameters, not template ones; a few candidate schedules are
 *     timed per problem class with NABLA_AUTOTUNE=1 and the fastest cached
 *     (backend/autotune.h); candidate 0, the heuristic above, otherwise.
 * The device code exists only in the sm_90a pass; other passes compile an
 * empty kernel, and the host never launches it off a 9.0 device.
 * This file holds the kernel and its launch (included by gemm_sm90.cu for
 * the bf16/f16 instantiations, by gemm_sm90_fp8.cu for the FP8 ones); the
 * runs, schedule choice and autotuning are in gemm_sm90.cu; the host-side
 * planning (TMA maps, which products fit, the split-K model and workspace,
 * the schedule candidates) in gemm_sm90_plan.cu. */
#ifndef NB_GEMM_SM90_KERNEL_CUH
#define NB_GEMM_SM90_KERNEL_CUH

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_sm90.cuh"
#include "backend/cuda/gemm_sm90_plan.h"
#include "backend/cuda/gemm_sm90_store.cuh"

/* Everything but the tensor maps; passed by value. */
struct nb_sm90_params {
  int M, N, K, tiles_m, tiles_n, ktiles;
  int group;       /* tile raster: this many tile rows walk N together */
  int sk;          /* stream-K schedule */
  int64_t work;    /* stream-K: the k-iterations it splits: dp_first * ktiles; with heads,
                      the rests' sk_heads * (ktiles - head_k) */
  int64_t dp_first; /* stream-K: tiles from dp_first on run data-parallel after it (dpsk; else tiles) */
  int sk_ctas;     /* stream-K: CTAs 0 .. sk_ctas - 1 share the work */
  int sk_heads;    /* stream-K with heads: CTA t < sk_heads runs tile t's k-tiles [0, head_k) */
  int head_k;      /* ... and the other CTAs split the tiles' k-tiles [head_k, ktiles) (work) */
  int splits;      /* split-K: k parts per tile, one CTA each (1: no split-K) */
  nb_sm90_sync sy; /* split-sync (sy.q > 0; gemm_sm90_plan.h) */
  int cluster;     /* CTAs per cluster (1, or 2: pairs of tile rows share B by multicast) */
  float alpha, beta;
  int gelu;
  int tma_c, tma_aux;     /* store through TMA (maps valid) */
  int pairs_c, pairs_aux; /* direct stores: 2 elements at a time */
  void *c; int64_t ldc;
  void *aux; int64_t ldaux;      /* NULL: no pre-activation output */
  const void *cin; int64_t ldcin; /* read when beta != 0 */
  const void *bias;               /* NULL: none */
  float *ws;                      /* split partial tiles, 2 slots per SM (sm90_slot) */
  unsigned *flags;                /* split tiles: per (CTA, consumer) epoch */
  unsigned epoch;
  const float *scale_a, *scale_b; /* FP8: the per-tensor scales (one f32 each, on the device) */
  int pingpong;    /* the ping-pong kernel (gemm_sm90_pingpong.cuh; tiles_n of 128 columns) */
};

/* Launches the FP8 instantiation for operand formats fa, fb (NB_F8E4M3 or
 * NB_F8E5M2) and output dtype out (gemm_sm90_fp8.cu; NT layout only). */
nb_status nb_sm90_go_f8(const nb_cuda_ctx *ctx, nb_dtype fa, nb_dtype fb, nb_dtype out,
                        const nb_sm90_maps &m, const nb_sm90_params &p, int64_t grid);

namespace {

constexpr int kBM = NB_SM90_BM, kBN = NB_SM90_BN, kBK = NB_SM90_BK, kStages = 4, kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2; /* 128 bytes per row and k-tile */
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kOutBuf = NB_SM90_OUT_BUF; /* one staging chunk (gemm_sm90_store.cuh) */
constexpr int kOutBytes = kConsumers * 2 * kOutBuf;
constexpr size_t kSmem = (size_t)kStages * kStageBytes + kOutBytes + 1024 + 2 * kStages * sizeof(uint64_t);

/* The FP8 operand format pair: EA, EB 1 for e4m3, 0 for e5m2. */
template <int EA, int EB> struct sm90_f8 {};
/* Per operand format: elements per k-tile (128 bytes of a row) and whether
 * it is FP8 (scaled by s_a s_b in the epilogue). */
template <typename T> struct sm90_in {
  static constexpr int bk = kBK, f8 = 0;
};
template <int EA, int EB> struct sm90_in<sm90_f8<EA, EB>> {
  static constexpr int bk = 2 * kBK, f8 = 1;
};

/* ---- schedule: the (tile, k range) segments of this CTA -------------------
 * Data-parallel: whole tiles blockIdx.x, + gridDim.x, ...; with clusters,
 * units blockIdx.x / 2, + gridDim.x / 2, ... (both CTAs of a cluster walk
 * the same units, so their rings stay in step). Stream-K: CTA c < P
 * (p.sk_ctas) owns k-iterations [c W / P, (c + 1) W / P) of the W
 * iterations of tiles 0 .. dp_first - 1 laid end to end, cut into
 * segments at tile boundaries; with dp_first < tiles (dpsk) every CTA then
 * takes whole tiles dp_first + blockIdx.x, + gridDim.x, ... Only a CTA's
 * first segment can start inside a tile (kb > 0), so it puts at most one
 * partial. Stream-K with heads (sk_heads = T tiles, fewer than the CTAs):
 * the iterations are laid out as every tile's first head_k k-tiles, then
 * every tile's rest; CTA t < T owns tile t's first part whole (the head:
 * all T heads read the same k-tiles at the same time, as a data-parallel
 * wave does), the other P - T CTAs split the rests evenly, W = T (ktiles -
 * head_k) iterations, and may put several partials. Split-K: one
 * segment, part blockIdx.x / tiles of tile blockIdx.x % tiles.
 * A segment's role: store a whole tile, put a partial tile, or be the
 * tile's head, which adds the other parts' partials and stores it.
 * The segment arithmetic is __host__ too: gemm_sm90.cu enumerates every
 * CTA's segments for the schedule tests (nb_sm90_walk). */
enum { SM90_WHOLE, SM90_PUT, SM90_HEAD };
/* x / f.d for 0 <= x < 2^31 (a multiply and a shift on the device) */
__host__ __device__ __forceinline__ int sm90_div(const nb_fastdiv &f, int x) {
#ifdef __CUDA_ARCH__
  return (int)nb_fastdiv_div(f, (uint32_t)x);
#else
  return (int)((uint32_t)x / f.d);
#endif
}
/* Where CTA c's stream-K range begins (c = sk_ctas: where the last ends). */
__host__ __device__ __forceinline__ int64_t sm90_sk_begin(const nb_sm90_params &p, int c) {
  if (c < p.sk_heads) return (int64_t)c * p.head_k;
  uint32_t r = (uint32_t)(c - p.sk_heads), n = (uint32_t)(p.sk_ctas - p.sk_heads);
  return (int64_t)p.sk_heads * p.head_k + (int64_t)((uint64_t)r * (uint64_t)p.work / n); /* all >= 0 */
}
/* The workspace slot of CTA c's partial of tile t: the CTA's own; with
 * heads t + c - T (a CTA's tiles and the CTAs on a tile both ascend, so no
 * two partials share it; below T + P - T = P slots); split-sync: a whole
 * rest's E + q T + t (below 2 P), any other the CTA's. */
__host__ __device__ __forceinline__ int sm90_slot(const nb_sm90_params &p, int t, int c) {
  if (p.sy.q) { /* split-sync, per unit: a whole rest's slot follows the grid's (E + q T), others
                  the unit CTA's; times the cluster size, plus the rank */
    int cu = c / p.cluster;
    return (cu < p.sy.spares && t < p.sy.whole ? p.sy.mains + p.sy.spares + t : cu) * p.cluster + c % p.cluster;
  }
  return p.sk_heads ? t + c - p.sk_heads : c;
}
/* (it, end): whole tiles (units) it, + grid, ... below end; or in a
 * stream-K range [b, e) at k-iteration e + it, it running from b - e < 0 up
 * to 0. At 0 the range is done, and dpsk goes on with whole tiles from
 * dp_first (> 0). The sign of it is the phase: no register of its own (the
 * producer has 40). cta, grid: blockIdx.x and gridDim.x on the device. */
struct sm90_walk {
  int64_t it, end;
  __host__ __device__ __forceinline__ sm90_walk(const nb_sm90_params &p, int cta) {
    if (p.sy.q) { /* split-sync: segments 0 .. end - 1 (sync_next), per unit CTA */
      int cu = cta / p.cluster;
      it = 0;
      end = cu >= p.sy.spares ? 1 : p.sy.a + (cu < p.sy.n * p.sy.left);
      return;
    }
    int sk = p.sk && cta < p.sk_ctas;
    end = sk ? sm90_sk_begin(p, cta + 1)
          : p.splits > 1 ? cta / p.cluster + 1 : (int64_t)((p.tiles_m + p.cluster - 1) / p.cluster) * p.tiles_n;
    it = sk ? sm90_sk_begin(p, cta) - end : p.sk ? 0 : cta / p.cluster;
  }
  /* The next segment: tile, k-tiles [kb, ke), role. false when done. */
  __host__ __device__ __forceinline__ bool next(const nb_sm90_params &p, int cta, int grid, int *tile, int *kb,
                                                int *ke, int *role) {
    if (p.sk && it == 0) { /* the range done: whole tiles from dp_first on (dpsk; none for stream-K) */
      it = p.dp_first + cta;
      end = (int64_t)p.tiles_m * p.tiles_n;
    }
    if (it >= end) return false;
    if (p.sy.q) return sync_next(p, cta / p.cluster, tile, kb, ke, role);
    if (p.splits > 1) {
      /* the last part is the head: a CTA waits only on lower-numbered ones */
      int tiles = p.tiles_m * p.tiles_n, part = (int)it / tiles;
      *tile = (int)it % tiles;
      *kb = (int)((int64_t)part * p.ktiles / p.splits);
      *ke = (int)((int64_t)(part + 1) * p.ktiles / p.splits);
      *role = part == p.splits - 1 ? SM90_HEAD : SM90_PUT;
      it = end;
      return true;
    }
    if (it >= 0) {
      *tile = (int)it;
      *kb = 0;
      *ke = p.ktiles;
      *role = SM90_WHOLE;
      it += grid / p.cluster;
      return true;
    }
    uint64_t at = (uint64_t)(end + it), heads = (uint64_t)p.sk_heads * (uint32_t)p.head_k; /* >= 0 */
    uint32_t span = (uint32_t)p.ktiles, k0 = 0; /* the k-tiles of a tile's part here: [k0, k0 + span) */
    if (at < heads) {
      span = (uint32_t)p.head_k;
    } else {
      at -= heads;
      k0 = (uint32_t)p.head_k;
      span -= k0;
    }
    *tile = (int)(at / span);
    *kb = (int)(k0 + at % span);
    int64_t left = -it;
    *ke = left < (int64_t)(k0 + span) - *kb ? *kb + (int)left : (int)(k0 + span);
    *role = *kb > 0 ? SM90_PUT : *ke < p.ktiles ? SM90_HEAD : SM90_WHOLE;
    it += *ke - *kb;
    return true;
  }
  /* Split-sync (gemm_sm90_plan.cu), over units (tiles, or with clusters of
   * 2 the pairs of tiles whose two CTAs run the same k ranges, cta here the
   * cluster's index): spare CTA s < E runs first piece s % n
   * of leftover tile a E + s / n, if s < n left, then the whole rests
   * [q L, ktiles) of tiles s, s + E, ... (a of them); CTA E + u runs main
   * part j = u / T of tile u % T, k-tiles [j L, (j + 1) L) (L2 for the
   * leftover tiles), the last part the tile's head. The spares come first,
   * so a head waits only on lower-numbered CTAs (launched before it: a
   * grid that does not fit on the GPU at once still finishes). The pieces
   * cut the leftover rest's r k-tiles into n parts of r / n, the first
   * r % n one more. */
  __host__ __device__ __forceinline__ bool sync_next(const nb_sm90_params &p, int cta, int *tile, int *kb,
                                                     int *ke, int *role) {
    const nb_sm90_sync &y = p.sy;
    int i = (int)it++;
    *role = SM90_PUT;
    if (cta >= y.spares) {
      int u = cta - y.spares, j = sm90_div(y.dtiles, u), t = u - j * y.tiles, L = t < y.whole ? y.L : y.L2;
      *tile = t;
      *kb = j * L;
      *ke = *kb + L;
      if (j == y.q - 1) *role = SM90_HEAD;
      return true;
    }
    int s = cta;
    if (s < y.n * y.left) {
      if (i == 0) {
        int u = sm90_div(y.dn, s), j = s - u * y.n;
        *tile = y.whole + u;
        *kb = y.k_piece + j * y.step + min(j, y.rem);
        *ke = *kb + y.step + (j < y.rem);
        return true;
      }
      i--;
    }
    *tile = s + i * y.spares;
    *kb = y.k_rest;
    *ke = p.ktiles;
    return true;
  }
};

/* The CTAs after `cta` that put partials of tile (this CTA its head) are,
 * in k order, those from sm90_sk_first on whose ranges are not empty and
 * begin before *end: stream-K, the CTAs whose ranges start inside the tile;
 * with heads, the other CTAs whose ranges meet the tile's rest [tile span,
 * + span) of W (the first: the last range to start at or before it).
 * Split-K does not come here. */
__host__ __device__ __forceinline__ int sm90_sk_first(const nb_sm90_params &p, int cta, int tile, int64_t *end) {
  if (!p.sk_heads) {
    *end = (int64_t)(tile + 1) * p.ktiles;
    return cta + 1;
  }
  uint64_t span = (uint64_t)(p.ktiles - p.head_k), x = (uint64_t)tile * span;
  uint64_t n = (uint64_t)(p.sk_ctas - p.sk_heads);
  *end = (int64_t)p.sk_heads * p.head_k + (int64_t)(x + span);
  return p.sk_heads + (int)(((x + 1) * n - 1) / (uint64_t)p.work);
}
__host__ __device__ __forceinline__ bool sm90_sk_puts(const nb_sm90_params &p, int o) {
  return sm90_sk_begin(p, o + 1) != sm90_sk_begin(p, o);
}
/* The slots of the partials that the head of tile (CTA cta) adds, in
 * that fixed order, so the sum does not depend on which CTA finished
 * first: f(slot) for each. Split-K: parts 0 .. S-2 (CTAs tile + s * tiles)
 * onto the last part's; stream-K: as sm90_sk_first says. */
template <class F>
__host__ __device__ __forceinline__ void sm90_takes(const nb_sm90_params &p, int cta, int tile, F f) {
  if (p.splits > 1 || p.sy.q) {
    /* two runs of slots: split-K's parts tile + s T; split-sync's other main
     * parts E + j T + tile, then its whole rest's slot or its n pieces' (in
     * units: times the cluster size, plus this CTA's rank) */
    int tiles = p.tiles_m * p.tiles_n, a0 = tile, an = p.splits - 1, b0 = 0, bn = 0;
    if (p.sy.q) {
      tiles = p.sy.tiles;
      a0 = p.sy.spares + tile;
      an = p.sy.q - 1;
      int whole = tile < p.sy.whole;
      b0 = whole ? p.sy.mains + p.sy.spares + tile : (tile - p.sy.whole) * p.sy.n;
      bn = whole ? 1 : p.sy.n;
    }
    for (int s = 0; s < an + bn; s++) f((s < an ? a0 + s * tiles : b0 + s - an) * p.cluster + cta % p.cluster);
    return;
  }
  int64_t end;
  for (int o = sm90_sk_first(p, cta, tile, &end); o < p.sk_ctas && sm90_sk_begin(p, o) < end; o++)
    if (sm90_sk_puts(p, o)) f(sm90_slot(p, tile, o));
}

/* Unit t of the grid in the raster order: p.group unit rows walk N together
 * so that their A rows and B columns stay in L2. A unit is a tile, or with
 * clusters of 2 a pair of vertically adjacent tiles sharing their B tile,
 * of which cluster rank r takes the r-th (past the last tile row when
 * tiles_m is odd: that tile loads zeros and stores nothing). */
template <int BN = kBN>
__host__ __device__ __forceinline__ void sm90_tile(int t, const nb_sm90_params &p, uint32_t rank, int *m0, int *n0) {
  int rows = (p.tiles_m + p.cluster - 1) / p.cluster;
  int per_group = p.group * p.tiles_n;
  int first_m = (t / per_group) * p.group;
  int gsize = rows - first_m < p.group ? rows - first_m : p.group;
  *m0 = ((first_m + (t % per_group) % gsize) * p.cluster + (int)rank) * kBM;
  *n0 = ((t % per_group) / gsize) * BN;
}

#ifdef NB_SM90A_DEVICE
constexpr int kBlock64 = 64 * 64 * 2; /* one 64 x 64 swizzled block */
__device__ __forceinline__ uint32_t sm90_rank(const nb_sm90_params &p) {
  uint32_t r = 0;
  if (p.cluster > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
#define NB_SM90_WGMMA_256(TY)                                                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                 \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " "   \
               NB_SM90_ACC128 ", %128, %129, p, 1, 1, %131, %132;\n}\n"      \
               : NB_SM90_OUT128 : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB))

/* FP8: d (+)= A * B over k32, formats FA, FB; no transpose immediates (both
 * operands K-major); imm-scale-a/b 1 (no negation). */
#define NB_SM90_WGMMA_F8(FA, FB)                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                   \
               "wgmma.mma_async.sync.aligned.m64n256k32.f32." FA "." FB " "     \
               NB_SM90_ACC128 ", %128, %129, p, 1, 1;\n}\n"                     \
               : NB_SM90_OUT128 : "l"(da), "l"(db), "r"(scale_d))

/* One wgmma over 32 bytes of k (m64n256k16 for 16-bit operands, k32 for
 * FP8): d += A(desc da) * B(desc db), scale_d 0 overwrites d; TA/TB:
 * transpose bits (1 = the operand is MN-major in shared memory). */
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
template <int EA, int EB> struct sm90_mma<sm90_f8<EA, EB>, 0, 0> {
  static __device__ __forceinline__ void run(float *d, uint64_t da, uint64_t db, uint32_t scale_d) {
    if (EA && EB) NB_SM90_WGMMA_F8("e4m3", "e4m3");
    else if (EA) NB_SM90_WGMMA_F8("e4m3", "e5m2");
    else if (EB) NB_SM90_WGMMA_F8("e5m2", "e4m3");
    else NB_SM90_WGMMA_F8("e5m2", "e5m2");
  }
};


/* The A tile of one k-tile (kBM rows from m0, k from k0) into stage sa:
 * K-major one box; transposed (TA) kBM / 64 blocks of 64 rows. */
template <int TA>
__device__ __forceinline__ void sm90_load_a(uint32_t sa, const CUtensorMap *ma, uint32_t fb, int m0, int k0) {
  if (TA) {
    for (int j = 0; j < kBM / 64; j++) sm90_tma_load(sa + j * kBlock64, ma, fb, m0 + 64 * j, k0);
  } else {
    sm90_tma_load(sa, ma, fb, k0, m0);
  }
}

/* Producer: one thread streams the k-tiles of this CTA's segments into the
 * ring; it runs ahead into the next tile while the consumers store. The B
 * tile goes in two halves of 128 rows; in a cluster of 2, rank r loads
 * half r and multicasts it to both CTAs, so each CTA's full barrier counts
 * the whole stage, half of B from each producer. The k coordinate of a
 * k-tile is in T's elements (64 or 128: 128 bytes either way). */
template <typename T, int TA, int TB>
__device__ __forceinline__ void sm90_produce(const CUtensorMap *ma, const CUtensorMap *mb,
                                             const nb_sm90_params &p, uint32_t ring, uint32_t full,
                                             uint32_t empty) {
  int it = 0; /* k-tiles issued so far: selects stage and phase */
  uint32_t rank = sm90_rank(p);
  int h0 = p.cluster > 1 ? (int)rank : 0, h1 = p.cluster > 1 ? h0 + 1 : 2; /* B halves to load */
  sm90_walk w(p, blockIdx.x);
  int tile, kb, ke, role;
  while (w.next(p, blockIdx.x, gridDim.x, &tile, &kb, &ke, &role)) {
    int m0, n0;
    sm90_tile(tile, p, rank, &m0, &n0);
    for (int kt = kb; kt < ke; kt++, it++) {
      int s = it % kStages;
      uint32_t parity = (uint32_t)((it / kStages) & 1);
      sm90_bar_wait(empty + 8 * s, parity ^ 1); /* fresh barriers pass parity 1 */
      uint32_t fb = full + 8 * s, sa = ring + s * kStageBytes, sb = sa + kABytes;
      sm90_bar_expect(fb, kStageBytes);
      int k0 = kt * sm90_in<T>::bk;
      sm90_load_a<TA>(sa, ma, fb, m0, k0);
      if (TB) { /* half h: 64-column blocks 2h, 2h + 1 */
        for (int j = 2 * h0; j < 2 * h1; j++) {
          if (p.cluster > 1) sm90_tma_load_mc(sb + j * kBlock64, mb, fb, n0 + 64 * j, k0, 3);
          else sm90_tma_load(sb + j * kBlock64, mb, fb, n0 + 64 * j, k0);
        }
      } else {
        for (int h = h0; h < h1; h++) {
          if (p.cluster > 1) sm90_tma_load_mc(sb + h * (kBBytes / 2), mb, fb, k0, n0 + h * (kBN / 2), 3);
          else sm90_tma_load(sb + h * (kBBytes / 2), mb, fb, k0, n0 + h * (kBN / 2));
        }
      }
    }
  }
}

/* Frees stage s: arrives on its empty barrier in this CTA and, in a
 * cluster, in the other CTA, whose producer multicasts into this one.
 * (The rank is read here, not kept: the consumers have no register to
 * spare.) */
__device__ __forceinline__ void sm90_release(const nb_sm90_params &p, uint32_t empty, int s) {
  sm90_bar_arrive(empty + 8 * s);
  if (p.cluster > 1) sm90_bar_arrive_remote(sm90_mapa(empty + 8 * s, sm90_rank(p) ^ 1));
}

/* Consumer c: rows [64c, 64c + 64) of one tile, all 256 columns, over
 * k-tiles it0 .. it0 + ktiles - 1 of the ring. */
template <typename T, int TA, int TB>
__device__ __forceinline__ void sm90_consume(float *d, int c, uint32_t ring, uint32_t full,
                                             uint32_t empty, const nb_sm90_params &p, int it0,
                                             int ktiles, int lead) {
  const uint32_t a_lbo = TA ? kBlock64 : 16, b_lbo = TB ? kBlock64 : 16;
  for (int kt = 0; kt < ktiles; kt++) {
    int it = it0 + kt, s = it % kStages;
    sm90_bar_wait(full + 8 * s, (uint32_t)((it / kStages) & 1));
    uint32_t sa = ring + s * kStageBytes + c * (64 * kBK * 2), sb = ring + s * kStageBytes + kABytes;
    sm90_fence_acc(d);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int k = 0; k < kBK / 16; k++) {
      /* next 32 bytes along a K-major row (16 k of bf16/f16, 32 of FP8), 16
       * rows (2048 B) down an MN-major block (16-bit only) */
      uint32_t oa = TA ? k * 2048 : k * 32, ob = TB ? k * 2048 : k * 32;
      sm90_mma<T, TA, TB>::run(d, sm90_desc(sa + oa, a_lbo), sm90_desc(sb + ob, b_lbo), kt > 0 || k > 0);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    sm90_fence_acc(d);
    /* the group of k-tile kt-1 has finished reading its stage */
    if (kt > 0 && lead) sm90_release(p, empty, (it - 1) % kStages);
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  sm90_fence_acc(d);
  if (lead) sm90_release(p, empty, (it0 + ktiles - 1) % kStages);
}

/* ---- split partial tiles (split-K, stream-K) ------------------------------
 * A slot holds one partial 128 x 256 f32 tile in fragment order: float4 q
 * of consumer c's thread t at (c * 32 + q) * 128 + t, so both the write and
 * the read are 16-byte accesses contiguous across the warpgroup. Split-K and
 * stream-K: slot = the CTA; stream-K with heads: sm90_slot. */
__device__ __forceinline__ void sm90_partial_put(const float *d, const nb_sm90_params &p, int c, int slot) {
  int t = threadIdx.x % 128;
  float4 *dst = (float4 *)(p.ws + (size_t)slot * kBM * kBN) + c * 32 * 128;
#pragma unroll
  for (int q = 0; q < 32; q++)
    __stcg(dst + q * 128 + t, make_float4(d[4 * q], d[4 * q + 1], d[4 * q + 2], d[4 * q + 3]));
  __threadfence();
  sm90_wg_sync(c);
  if (t == 0)
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p.flags + 2 * slot + c), "r"(p.epoch)
                 : "memory");
}

/* Adds slot's partial (consumer c's half) once its flag shows this launch. */
__device__ __forceinline__ void sm90_partial_take(float *d, const nb_sm90_params &p, int c, int slot) {
  int t = threadIdx.x % 128;
  if (t == 0) {
    const unsigned *f = p.flags + 2 * slot + c;
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(f) : "memory");
    } while (v != p.epoch);
  }
  sm90_wg_sync(c);
  const float4 *src = (const float4 *)(p.ws + (size_t)slot * kBM * kBN) + c * 32 * 128;
#pragma unroll
  for (int q = 0; q < 32; q++) {
    float4 v = __ldcg(src + q * 128 + t);
    d[4 * q] += v.x; d[4 * q + 1] += v.y; d[4 * q + 2] += v.z; d[4 * q + 3] += v.w;
  }
}

/* The head of a split tile adds the other parts' partials (sm90_takes). */
__device__ __forceinline__ void sm90_partial_add(float *d, const nb_sm90_params &p, int c, int tile) {
  sm90_takes(p, blockIdx.x, tile, [&](int slot) { sm90_partial_take(d, p, c, slot); });
}

/* ---- epilogue -------------------------------------------------------------
 * Accumulator fragment of m64nN: register i of thread (warp w, lane l) is
 * row 16w + l/4 + 8*((i/2)%2), column 8*(i/4) + 2*(l%4) + i%2. */
template <typename TO> __device__ __forceinline__ float sm90_gelu(float x) {
  /* tanh form through 0.5 (1 + tanh(u)) = 1 / (1 + e^(-2u)), as the
   * elementwise kernel computes it; f32 outputs with the standard expf and
   * an exact division, 16-bit ones with the hardware's ex2 and rcp (ftz:
   * without it each adds a subnormal rescale, 0.7% of the fused GEMM on the
   * H100), whose error (under 1e-5 relative for |x| < 10; beyond, the
   * result is x to 2^-24, or under 1e-36 in size, or -0 for results under
   * 2^-126) is far below the 16-bit rounding of the result */
  float u = 0.79788456080286535588f * fmaf(0.044715f * x, x * x, x);
  if (sizeof(TO) == 4) return x / (1.0f + expf(-2.0f * u));
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(u * -2.8853900817779268f)); /* e^(-2u) */
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return x * r;
}

/* d = alpha * d + beta * cin + bias, in place (row0/col0: this consumer's
 * first row and the tile's first column; d: 64 x BN, BN / 2 registers). */
template <typename TO, int BN = kBN>
__device__ __forceinline__ void sm90_affine(float *d, const nb_sm90_params &p, int row0, int col0) {
  int t = threadIdx.x % 128, w = t / 32, l = t % 32;
  const TO *bias = (const TO *)p.bias, *cin = (const TO *)p.cin;
  int use_c = p.beta != 0.0f;
#pragma unroll
  for (int j = 0; j < BN / 8; j++) {
    int col = col0 + 8 * j + 2 * (l % 4);
    float b0 = 0.0f, b1 = 0.0f;
    if (bias) {
      if (col < p.N) b0 = nb_to_f(bias[col]);
      if (col + 1 < p.N) b1 = nb_to_f(bias[col + 1]);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int r = row0 + 16 * w + l / 4 + 8 * h;
      float c0 = 0.0f, c1 = 0.0f;
      if (use_c && r < p.M) {
        const TO *crow = cin + (int64_t)r * p.ldcin;
        if (col < p.N) c0 = nb_to_f(crow[col]);
        if (col + 1 < p.N) c1 = nb_to_f(crow[col + 1]);
      }
      float *v = d + 4 * j + 2 * h;
      v[0] = fmaf(p.alpha, v[0], fmaf(p.beta, c0, b0));
      v[1] = fmaf(p.alpha, v[1], fmaf(p.beta, c1, b1));
    }
  }
}

template <typename TO, int BN = kBN>
__device__ __forceinline__ void sm90_store(const float *d, const nb_sm90_params &p, const CUtensorMap *map,
                                           int use_tma, TO *C, int64_t ld, int pairs, uint32_t stage,
                                           int c, int *nbuf, int row0, int col0) {
  if (use_tma) sm90_store_tma<TO, BN>(d, map, stage, c, nbuf, p, row0, col0);
  else sm90_store_direct<TO, BN>(d, C, ld, pairs, p.M, p.N, row0, col0);
}

template <typename TO, int BN = kBN>
__device__ __forceinline__ void sm90_epilogue(float *d, const nb_sm90_params &p, const CUtensorMap *mc,
                                              const CUtensorMap *maux, uint32_t stage, int c,
                                              int *nbuf, int row0, int col0) {
  if (p.alpha != 1.0f || p.beta != 0.0f || p.bias) sm90_affine<TO, BN>(d, p, row0, col0);
  if (p.aux)
    sm90_store<TO, BN>(d, p, maux, p.tma_aux, (TO *)p.aux, p.ldaux, p.pairs_aux, stage, c, nbuf, row0, col0);
  if (p.gelu) {
#pragma unroll
    for (int i = 0; i < BN / 2; i++) d[i] = sm90_gelu<TO>(d[i]);
  }
  sm90_store<TO, BN>(d, p, mc, p.tma_c, (TO *)p.c, p.ldc, p.pairs_c, stage, c, nbuf, row0, col0);
}
#endif /* NB_SM90A_DEVICE */

template <typename T, typename TO, int TA, int TB>
__global__ void __launch_bounds__(kThreads, 1)
    sm90_gemm_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                     const __grid_constant__ CUtensorMap mc, const __grid_constant__ CUtensorMap maux,
                     const __grid_constant__ nb_sm90_params p) {
#ifdef NB_SM90A_DEVICE
  extern __shared__ uint8_t sm90_raw[];
  /* the 128-byte swizzle repeats every 1024 B: align the ring to it */
  uint32_t base = sm90_smem(sm90_raw);
  uint32_t ring = (base + 1023) & ~1023u;
  uint32_t stage = ring + kStages * kStageBytes;
  uint32_t full = stage + kOutBytes, empty = full + 8 * kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; s++) {
      sm90_bar_init(full + 8 * s, 1);
      sm90_bar_init(empty + 8 * s, kConsumers * p.cluster);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  /* the other CTA's barriers must exist before anything lands in them */
  if (p.cluster > 1) sm90_cluster_sync();
  int wg = threadIdx.x / 128;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) sm90_produce<T, TA, TB>(&ma, &mb, p, ring, full, empty);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; i++) d[i] = 0.0f;
    int c = wg - 1, it0 = 0, nbuf = 0, lead = threadIdx.x % 128 == 0;
    /* FP8: the per-tensor scales, read once (no host wait) */
    const float scale = sm90_in<T>::f8 ? __ldg(p.scale_a) * __ldg(p.scale_b) : 1.0f;
    sm90_walk w(p, blockIdx.x);
    int tile, kb, ke, role;
    /* the first wgmma of each segment (scale-d 0) overwrites the accumulators */
    while (w.next(p, blockIdx.x, gridDim.x, &tile, &kb, &ke, &role)) {
      int m0, n0;
      sm90_tile(tile, p, sm90_rank(p), &m0, &n0);
      sm90_consume<T, TA, TB>(d, c, ring, full, empty, p, it0, ke - kb, lead);
      it0 += ke - kb;
      if (role == SM90_PUT) { /* one part of a split tile: its head stores it */
        sm90_partial_put(d, p, c, sm90_slot(p, tile, blockIdx.x));
        continue;
      }
      if (role == SM90_HEAD) sm90_partial_add(d, p, c, tile);
      if (sm90_in<T>::f8) { /* the scales, once, on the full sum */
#pragma unroll
        for (int i = 0; i < 128; i++) d[i] *= scale;
      }
      sm90_epilogue<TO>(d, p, &mc, &maux, stage, c, &nbuf, m0 + 64 * c, n0);
    }
    /* the staging buffers must stay until the last stores have read them */
    if (lead) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
  /* a CTA leaves only after the other one's last arrivals on its barriers */
  __syncwarp();
  if (p.cluster > 1) sm90_cluster_sync();
#else
  (void)ma; (void)mb; (void)mc; (void)maux; (void)p;
#endif
}

#include "backend/cuda/gemm_sm90_pingpong.cuh"

/* ---- launch -----------------------------------------------------------------
 * Launches instantiation <T, TO, TA, TB> (of the ping-pong kernel with
 * p.pingpong) on grid CTAs (capped, with clusters, at the clusters that
 * fit) and counts it in *count (atomic). */
template <typename T, typename TO, int TA, int TB>
nb_status sm90_launch(const nb_cuda_ctx *ctx, const nb_sm90_maps &m, const nb_sm90_params &p,
                      int64_t grid, int64_t *count) {
  auto kern = p.pingpong ? sm90_pp_kernel<T, TO, TA, TB> : sm90_gemm_kernel<T, TO, TA, TB>;
  size_t smem = p.pingpong ? kPPSmem : kSmem;
  NB_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
              "matmul sm90: shared memory attribute");
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cudaLaunchAttribute at[1];
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ctx->stream;
  if (p.cluster > 1) {
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)p.cluster;
    at[0].val.clusterDim.y = at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    cfg.gridDim = dim3((unsigned)grid);
    /* a persistent grid: no more clusters than can be resident together */
    int64_t most = (int64_t)p.cluster * nb_sm90_max_clusters(ctx, (const void *)kern, &cfg);
    if (grid > most) grid = most;
  }
  nb_sm90_params q = p;
  if (q.sy.q && grid < (int64_t)q.cluster * (q.sy.mains + q.sy.spares))
    q.sy = nb_sm90_sync(); /* split-sync needs its whole grid at once: data-parallel instead */
  cfg.gridDim = dim3((unsigned)grid);
  cudaError_t e = cudaLaunchKernelEx(&cfg, kern, m.a, m.b, m.c, m.aux, q);
  __atomic_add_fetch(count, 1, __ATOMIC_RELAXED);
  if (e != cudaSuccess) return nb_cuda_status(e, "sm90_gemm_kernel launch");
  return nb_cuda_launch_check("sm90_gemm_kernel");
}

} /* namespace */

#endif /* NB_GEMM_SM90_KERNEL_CUH */
