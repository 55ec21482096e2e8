/* Hopper (sm_90a) building blocks shared by the own GEMM (gemm_sm90.cu) and
 * the flash attention forward (cuda_attention_sm90.cu): shared-memory
 * addresses, mbarriers (init, expect-tx, arrive, parity wait), TMA bulk
 * tensor copies (2-D load, multicast load, store), cluster barriers and
 * addresses, the per-warpgroup named barrier, and the wgmma shared-memory
 * descriptor for the 128-byte swizzle, the m64n256 accumulator operands
 * and their fence. NB_SM90A_DEVICE is defined in the sm_90a device pass
 * only, where these exist; other passes see none of them (their kernels
 * compile empty). */
#ifndef NB_CUDA_SM90_CUH
#define NB_CUDA_SM90_CUH

#include <cuda.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NB_SM90A_DEVICE 1
#endif

#ifdef NB_SM90A_DEVICE
static __device__ __forceinline__ uint32_t sm90_smem(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void sm90_bar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void sm90_bar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
static __device__ __forceinline__ void sm90_bar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* Waits until the barrier's phase with this parity has completed. Each
 * try_wait suspends the thread until the phase completes or up to 1 ms
 * (the suspend-time hint): without the hint it returned after a short
 * system-defined time, and the loop spun (the attention forward issued ~18
 * try_wait per wait, 5% of its instructions). */
static __device__ __forceinline__ void sm90_bar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, 1000000;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
}
/* 2-D TMA load of the box at (c0 inner, c1 outer) into dst, completing on bar. */
static __device__ __forceinline__ void sm90_tma_load(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                              int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4}], [%2];"
               ::"r"(dst), "l"((uint64_t)map), "r"(bar), "r"(c0), "r"(c1) : "memory");
}
/* The same load delivered to the CTAs of the cluster in mask (the same
 * shared offset and barrier offset in each). */
static __device__ __forceinline__ void sm90_tma_load_mc(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                                 int c0, int c1, uint16_t mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;"
               ::"r"(dst), "l"((uint64_t)map), "r"(bar), "r"(c0), "r"(c1), "h"(mask) : "memory");
}
/* Every thread of every CTA of the cluster: shared memory and barriers
 * written before are visible to the other CTAs after. */
static __device__ __forceinline__ void sm90_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
/* The shared::cluster address of offset a in the cluster's CTA rank. */
static __device__ __forceinline__ uint32_t sm90_mapa(uint32_t a, uint32_t rank) {
  uint32_t r;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
/* Arrives on a barrier of another CTA of the cluster (address from
 * sm90_mapa). CTA-scope release, as for the local arrivals: the wgmma
 * reads it publishes have completed (wait_group), and a cluster-scope
 * release, a fence on every k-tile, made the clustered kernel 1.6x slower
 * on the H100. */
static __device__ __forceinline__ void sm90_bar_arrive_remote(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* 2-D TMA store of the staged box src to (c0 inner, c1 outer), in a bulk group. */
static __device__ __forceinline__ void sm90_tma_store(const CUtensorMap *map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               ::"l"((uint64_t)map), "r"(src), "r"(c0), "r"(c1) : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
/* Named barrier of one consumer warpgroup (ids 1, 2; 0 is __syncthreads). */
static __device__ __forceinline__ void sm90_wg_sync(int c) {
  asm volatile("bar.sync %0, 128;" ::"r"(c + 1) : "memory");
}
/* wgmma shared-memory descriptor, 128-byte swizzle. K-major: 8-row groups
 * 1024 B apart (SBO), LBO unused. MN-major: 64-element column blocks
 * kBlock64 bytes apart (LBO), 8-row k groups 1024 B apart (SBO). */
static __device__ __forceinline__ uint64_t sm90_desc(uint32_t addr, uint32_t lbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
         ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
/* The f32 accumulator registers a thread holds for an m64nN wgmma (N = 64,
 * 128, 256: 32, 64, 128 of them, d[0..]): the register list of the asm
 * text, operands %0 on, and the matching read-write outputs. The own GEMMs
 * (gemm_sm90_kernel.cuh: m64n256; gemm_sm90_pingpong.cuh: m64n128) and the
 * attention kernels (cuda_attention_sm90.cuh: m64n64, m64n128) use them. */
#define NB_SM90_REGS32                                                              \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define NB_SM90_REGS64                                                                \
  NB_SM90_REGS32 ", "                                                                 \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define NB_SM90_ACC32 "{" NB_SM90_REGS32 "}"
#define NB_SM90_ACC64 "{" NB_SM90_REGS64 "}"
#define NB_SM90_ACC128                                                                              \
  "{" NB_SM90_REGS64 ", "                                                                           \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "    \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"  \
  "}"
#define NB_SM90_OUT32                                                                                      \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define NB_SM90_OUT64                                                                                      \
  NB_SM90_OUT32,                                                                                           \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define NB_SM90_OUT128                                                                                             \
  NB_SM90_OUT64,                                                                                                   \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),          \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),          \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),          \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),          \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),      \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),  \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),  \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
/* Keeps the compiler from moving accumulator reads or writes across the
 * asynchronous wgmma (before its wait_group, after its fence). */
static __device__ __forceinline__ void sm90_fence_acc(float *d) {
#pragma unroll
  for (int i = 0; i < 128; i++) asm volatile("" : "+f"(d[i])::"memory");
}
#endif /* NB_SM90A_DEVICE */

#endif /* NB_CUDA_SM90_CUH */
