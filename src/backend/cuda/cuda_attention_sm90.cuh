/* What the Hopper (sm_90a) flash attention forward (cuda_attention_sm90.cu)
 * and backward (cuda_attention_sm90_bwd.cu) share. Device (sm_90a pass
 * only, NB_SM90A_DEVICE): the TMA load of a box of a rank 2 + nbk map (a
 * (.., L, D) view with up to FA3_MAXK batch axes), the batch coordinates of
 * a flat batch index, the wgmma products they issue (ss: both operands by
 * descriptor, K-major; rs: A from registers, B by descriptor, MN-major), the
 * wgmma fence, commit and wait, the register fences around asynchronous
 * wgmma, and the packing of an accumulator into register A fragments. Host:
 * the tensor map of a (.., L, D) view. The fragment layouts are described in
 * cuda_attention_sm90.cu. */
#ifndef NB_CUDA_ATTENTION_SM90_CUH
#define NB_CUDA_ATTENTION_SM90_CUH

#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_sm90.cuh"

#define FA3_MAXK 3 /* batch axes of size > 1 (tensor maps of rank 5 at most) */

/* The tensor map of a (.., L, D) bf16 or f16 view: dims {D, L, the batch
 * axes axes[0..nbk) (innermost first; -1: a size-1 stand-in)}, boxes of
 * 64 x rows in the 128-byte swizzle, zero fill out of bounds. 0 when TMA
 * cannot take it (alignment, strides, sizes). */
int nb_fa3_map(CUtensorMap *m, const nb_kview *v, int64_t L, int64_t D, const int *axes, int nbk, int rows);

/* The section of the kernels' work order (fa3_section): how many of the B
 * batch indices have their streamed operands, per_b bytes each, in an
 * eighth of the L2 of the context's device (NABLA_ATTENTION_SM90_SECTION=n:
 * n, for the tests); 1 to B. An eighth: the H100's L2 is two halves that
 * each may hold a copy of what SMs on both sides read, and the CTAs' Q, O
 * (forward) or dQ, dK, dV (backward) tiles stream through it too; at B4
 * H16 N4096 D128 sections of 2 to 6 batch indices read 204-230 MB from
 * DRAM in the forward against 517 MB with 12 (half the L2). */
int nb_fa3_section(const nb_cuda_ctx *ctx, int64_t B, int64_t per_b);

/* The last section's size (fa3_set_order) for B batch indices of nblk
 * blocks in sections of hg on the device's SMs: B - (B - 1) / hg hg (1 to
 * hg) when not causal; causal, where a batch index's blocks take 1 to nblk
 * tiles, nblk (nblk + 1) / 2 in all, at least f 2 SMs / (nblk + 1) batch
 * indices, so that the last section's work is f times what it takes to
 * give every SM a heaviest block (NABLA_ATTENTION_SM90_TAIL=f, 0 off;
 * default 2: a simulation of the ticket order put the SMs' idle end at
 * B4 H16 N4096 D128 from 7% to 1%). */
int nb_fa3_tail(const nb_cuda_ctx *ctx, int B, int nblk, int hg, int causal);

/* 1 when the image of kern loaded on this (9.0) device is the 9.0 one (a
 * binary built without that target would run the sm_80 image's empty
 * kernel); the answer is kept in *cache (0: not asked yet). */
template <typename K> static int fa3_binary_ok(K kern, int *cache) {
  if (!*cache) {
    cudaFuncAttributes a;
    *cache = cudaFuncGetAttributes(&a, kern) == cudaSuccess && a.binaryVersion >= 90 ? 1 : -1;
    cudaGetLastError();
  }
  return *cache == 1;
}

/* The work order of a launch over B nblk items (p.B set) in sections of
 * hg batch indices (nb_fa3_section, whose streamed operands take per_b
 * bytes each; fa3_section): p's nblk, items, hg, nfull and the divisors of
 * the sections, nfull of hg batch indices, hg nblk items each, then the
 * last one of the rest. Causal (the blocks' work falls from nblk tiles to
 * 1 in each section), the last section is made large enough (nb_fa3_tail)
 * that its work can even out the CTAs' ends: sections of hg (3 at B4 H16
 * N4096 D128) left the heaviest blocks of the last one to start when the
 * other CTAs had little left (ncu: the SMs idle 10.7% of the causal
 * forward's cycles). The kernels divide by these and by the batch axes'
 * sizes (fa3_coords) with a multiply and a shift (nb_fastdiv), not the
 * hardware's division: ~30 dependent instructions, several of them on the
 * consumers' path from one item to the next. */
template <typename P>
static void fa3_set_order(P &p, const nb_cuda_ctx *ctx, int nblk, int64_t per_b, int causal) {
  const int hg = nb_fa3_section(ctx, p.B, per_b), hl = nb_fa3_tail(ctx, p.B, nblk, hg, causal);
  p.nblk = nblk;
  p.items = p.B * nblk; /* the hosts keep B nblk <= INT32_MAX - NB_CUDA_WORK_CTAS (the tickets past it) */
  p.hg = hg;
  p.nfull = (p.B - hl) / hg;
  p.dsec = nb_fastdiv_make((uint32_t)(hg * nblk));
  p.dhg = nb_fastdiv_make((uint32_t)hg);
  p.dhl = nb_fastdiv_make((uint32_t)hl);
}

/* A variant's switch, read at every call: on unless the variable is "0". */
static inline int fa3_switch(const char *name) {
  const char *e = getenv(name);
  return !(e && !strcmp(e, "0"));
}

/* The launch of kern (grid CTAs of threads, smem bytes of dynamic shared
 * memory, in clusters of cluster CTAs) on the context's stream as a
 * programmatic dependent launch: its CTAs may start, set up their shared
 * memory and wait (fa3_grid_wait) while the previous kernel's last CTAs
 * finish, which signal it once they take no more work (fa3_work_done).
 * NABLA_ATTENTION_SM90_PDL=0 (read at every call): an ordinary launch.
 * at: room for the attributes cfg points to. */
struct fa3_launch_cfg {
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute at[2];
  fa3_launch_cfg(unsigned grid, unsigned threads, size_t smem, unsigned cluster, const nb_cuda_ctx *ctx) {
    memset(this, 0, sizeof *this);
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ctx->stream;
    cfg.attrs = at;
    if (cluster > 1) {
      at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
      at[cfg.numAttrs].val.clusterDim.x = cluster;
      at[cfg.numAttrs].val.clusterDim.y = at[cfg.numAttrs].val.clusterDim.z = 1;
      cfg.numAttrs++;
    }
    if (fa3_switch("NABLA_ATTENTION_SM90_PDL")) {
      at[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
      cfg.numAttrs++;
    }
  }
  fa3_launch_cfg(const fa3_launch_cfg &) = delete; /* cfg.attrs points into it */
};
template <typename... E, typename... A>
static cudaError_t fa3_launch_ex(void (*kern)(E...), unsigned grid, unsigned threads, size_t smem,
                                 const nb_cuda_ctx *ctx, A &&...args) {
  fa3_launch_cfg l(grid, threads, smem, 1, ctx);
  return cudaLaunchKernelEx(&l.cfg, kern, static_cast<A &&>(args)...);
}

#ifdef NB_SM90A_DEVICE
namespace {

/* The persistent kernels' work tickets (fa3_put/fa3_take below hand them
 * over; the forward's fa3_produce describes the order):
 * with as many CTAs as items each CTA takes its own item alone; else a
 * CTA's next item is gridDim.x + a ticket from the counter p.work[0], and
 * the CTA that ends last (p.work[1] counts them) returns both counters to
 * zero for the next launch. P: a kernel's parameters (work, items). */
template <typename P> __device__ __forceinline__ int fa3_one_each(const P &p) { return (int)gridDim.x >= p.items; }
template <typename P> __device__ __forceinline__ int fa3_next(const P &p) {
  return fa3_one_each(p) ? p.items : (int)gridDim.x + (int)atomicAdd(p.work, 1u);
}
template <typename P> __device__ __forceinline__ void fa3_work_done(const P &p) {
  /* this CTA takes no more items: the stream's next kernel, launched as a
   * programmatic dependent (fa3_launch_ex), may start on the SMs that
   * this grid's CTAs leave (its CTAs wait in fa3_grid_wait) */
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (fa3_one_each(p)) return;
  __threadfence();
  if (atomicAdd(p.work + 1, 1u) == gridDim.x - 1) { /* every CTA has taken its last ticket */
    atomicExch(p.work, 0u);
    atomicExch(p.work + 1, 0u);
  }
}

/* The handover of the CTA's n-th item from its producer to its consumers
 * (the forward's fa3_produce / fa3_consume, the backward's kernels):
 * through slot n % 2, a word of global memory after the counters (p.work
 * + 2 + 2 blockIdx.x: in shared memory the race checker would not see the
 * mbarriers order it), with a full mbarrier (the producer's release
 * arrival) and an empty one (the consumers' 8 warps' arrivals) per slot:
 * bar.itf(s), bar.ite(s) of the kernel's barriers. With as many CTAs as
 * items (fa3_one_each) CTA c takes item c alone: no slots. */
template <typename P, typename Bars>
__device__ __forceinline__ void fa3_put(const P &p, Bars bar, int n, int x) {
  if (fa3_one_each(p)) return;
  sm90_bar_wait(bar.ite(n & 1), ((uint32_t)(n >> 1) & 1) ^ 1); /* fresh barriers pass parity 1 */
  ((volatile int *)p.work)[2 + 2 * blockIdx.x + (n & 1)] = x;
  sm90_bar_arrive(bar.itf(n & 1)); /* release: the consumers' wait acquires the word */
}
template <typename P, typename Bars> __device__ __forceinline__ int fa3_take(const P &p, Bars bar, int n) {
  if (fa3_one_each(p)) return n == 0 ? (int)blockIdx.x : p.items;
  sm90_bar_wait(bar.itf(n & 1), (uint32_t)(n >> 1) & 1);
  const int x = ((volatile int *)p.work)[2 + 2 * blockIdx.x + (n & 1)];
  __syncwarp();
  if (threadIdx.x % 32 == 0) sm90_bar_arrive(bar.ite(n & 1));
  return x;
}

/* Where a kernel launched by fa3_launch_ex starts reading global memory:
 * it waits until the stream's previous kernel has completed and its
 * writes are visible (at once when that kernel was not a programmatic
 * primary); only shared memory is touched before. */
__device__ __forceinline__ void fa3_grid_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/* TMA load of the box at (d0, row, batch coordinates c) of a map of rank
 * 2 + nbk into dst, completing on bar; mc != 0: delivered to the CTAs of
 * the cluster in the mask mc, at the same shared offsets (dst, bar) in
 * each. */
__device__ __forceinline__ void fa3_tma(uint32_t dst, const CUtensorMap *m, uint32_t bar, int d0, int row,
                                        const int *c, int nbk, uint16_t mc = 0) {
  const uint64_t mp = (uint64_t)m;
#define FA3_TMA(N, CO, CM, ...)                                                                               \
  if (mc)                                                                                                     \
    asm volatile("cp.async.bulk.tensor." N "d.shared::cluster.global.mbarrier::complete_tx::bytes"            \
                 ".multicast::cluster [%0], [%1, {" CM "}], [%2], %3;"                                        \
                 ::"r"(dst), "l"(mp), "r"(bar), "h"(mc), __VA_ARGS__ : "memory");                             \
  else /* no mask operand: it would hold a register */                                                       \
    asm volatile("cp.async.bulk.tensor." N "d.shared::cluster.global.mbarrier::complete_tx::bytes"            \
                 " [%0], [%1, {" CO "}], [%2];"                                                               \
                 ::"r"(dst), "l"(mp), "r"(bar), __VA_ARGS__ : "memory");
  if (nbk == 1) {
    FA3_TMA("3", "%3, %4, %5", "%4, %5, %6", "r"(d0), "r"(row), "r"(c[0]))
  } else if (nbk == 2) {
    FA3_TMA("4", "%3, %4, %5, %6", "%4, %5, %6, %7", "r"(d0), "r"(row), "r"(c[0]), "r"(c[1]))
  } else {
    FA3_TMA("5", "%3, %4, %5, %6, %7", "%4, %5, %6, %7, %8", "r"(d0), "r"(row), "r"(c[0]), "r"(c[1]), "r"(c[2]))
  }
#undef FA3_TMA
}

/* Work item x of B nblk (batch index, block) items in sections of hg batch
 * indices (p.nfull of them, then the last of the rest, which may have
 * fewer or more: nb_fa3_section, nb_fa3_tail): its batch index *b and its
 * block's rank *blk in the section, 0 first. Inside a section rank 0 of
 * every batch index comes first, then rank 1, ..., so the blocks at work at
 * one time share the operands of a section's batch indices, which L2
 * holds. P: a kernel's parameters (B, hg and their divisors,
 * fa3_set_order). */
template <typename P> __device__ __forceinline__ void fa3_section(const P &p, int x, int *b, int *blk) {
  const uint32_t sec = min(nb_fastdiv_div(p.dsec, (uint32_t)x), (uint32_t)p.nfull);
  const uint32_t y = (uint32_t)x - sec * p.dsec.d;
  const nb_fastdiv &dh = sec == (uint32_t)p.nfull ? p.dhl : p.dhg; /* the last section's size, or hg */
  const uint32_t r = nb_fastdiv_div(dh, y);
  *b = (int)(sec * (uint32_t)p.hg + (y - r * dh.d));
  *blk = (int)r;
}

/* The batch coordinates c[0..FA3_MAXK) of the flat batch index b over the
 * p.nbk batch axes of sizes p.bdim (their divisors), innermost first (0
 * past nbk). */
template <typename P> __device__ __forceinline__ void fa3_coords(const P &p, int b, int *c) {
  uint32_t u = (uint32_t)b;
#pragma unroll
  for (int i = 0; i < FA3_MAXK; i++) {
    c[i] = 0;
    if (i < p.nbk) {
      const uint32_t q = nb_fastdiv_div(p.bdim[i], u);
      c[i] = (int)(u - q * p.bdim[i].d);
      u = q;
    }
  }
}

/* A wgmma descriptor (sm90_desc) as a tile's base and byte offsets in it:
 * the low word (start address / 16, LBO) is computed once per tile and
 * each k step adds its offset / 16, a constant, to it; the high word (SBO
 * 1024 bytes, the 128-byte swizzle) is a constant. The sum never carries
 * out of the 14-bit address field: shared addresses are below 256 KB. */
struct fa3_desc {
  uint32_t lo;
  __device__ __forceinline__ fa3_desc(uint32_t addr, uint32_t lbo) : lo(((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16)) {}
  __device__ __forceinline__ uint64_t at(uint32_t off) const {
    return ((uint64_t)((1024u >> 4) | (1u << 30)) << 32) | (lo + (off >> 4));
  }
};

/* ---- wgmma ------------------------------------------------------------- */
/* ss128 / ss64: d (64 x 128 / 64 x 64) = (acc ? d : 0) + A B^T, A and B by
 * descriptor, both K-major (ss64<1, 1>: both MN-major, the transpose bits). rs128 / rs64: d (64 x 128 / 64 x 64) = (acc ? d : 0) + A B, A
 * from registers (4 per thread, mma.sync's A fragment), B by descriptor,
 * MN-major (transpose bit 1). */
#define FA3_MMA_BODY(TY)                                                                    \
  static __device__ __forceinline__ void ss128(float *d, uint64_t da, uint64_t db, uint32_t acc) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " NB_SM90_ACC64        \
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                          \
                 : NB_SM90_OUT64 : "l"(da), "l"(db), "r"(acc));                                 \
  }                                                                                         \
  template <int TA = 0, int TB = 0>                                                         \
  static __device__ __forceinline__ void ss64(float *d, uint64_t da, uint64_t db, uint32_t acc) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " NB_SM90_ACC32         \
                 ", %32, %33, p, 1, 1, %35, %36;\n}\n"                                      \
                 : NB_SM90_OUT32 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));               \
  }                                                                                         \
  static __device__ __forceinline__ void rs128(float *d, const uint32_t *a, uint64_t db, uint32_t acc = 1) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " NB_SM90_ACC64        \
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                             \
                 : NB_SM90_OUT64                                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));          \
  }                                                                                         \
  static __device__ __forceinline__ void rs64(float *d, const uint32_t *a, uint64_t db, uint32_t acc = 1) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " NB_SM90_ACC32         \
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                             \
                 : NB_SM90_OUT32                                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));          \
  }
template <typename T> struct fa3_mma;
template <> struct fa3_mma<__nv_bfloat16> { FA3_MMA_BODY("bf16") };
template <> struct fa3_mma<__half> { FA3_MMA_BODY("f16") };

__device__ __forceinline__ void fa3_wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void fa3_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void fa3_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving accesses of registers an asynchronous
 * wgmma reads or writes across the wait that completes it. */
template <int N> __device__ __forceinline__ void fa3_fence(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> __device__ __forceinline__ void fa3_fence(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; i++)
#pragma unroll
    for (int r = 0; r < 4; r++) asm volatile("" : "+r"(a[i][r])::"memory");
}

/* A fragments (N k-steps of 16) of a 64 x 16 N accumulator, rounded to T:
 * a[kk][r] = (s[8 kk + 2 r], s[8 kk + 2 r + 1]). */
template <typename T, int N>
__device__ __forceinline__ void fa3_pack(uint32_t (&a)[N][4], const float (&s)[8 * N]) {
#pragma unroll
  for (int kk = 0; kk < N; kk++)
#pragma unroll
    for (int r = 0; r < 4; r++) a[kk][r] = nb_mma<T>::pack(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

} /* namespace */
#endif /* NB_SM90A_DEVICE */

#endif /* NB_CUDA_ATTENTION_SM90_CUH */
