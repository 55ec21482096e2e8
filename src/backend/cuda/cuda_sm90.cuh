/* Hopper (sm_90a) building blocks shared by the own GEMM (gemm_sm90.cu) and
 * the flash attention forward (cuda_attention_sm90.cu): shared-memory
 * addresses, mbarriers (init, expect-tx, arrive, parity wait), TMA bulk
 * tensor copies (2-D load, multicast load, store), cluster barriers and
 * addresses, the per-warpgroup named barrier, and the wgmma shared-memory
 * descriptor for the 128-byte swizzle. NB_SM90A_DEVICE is defined in the
 * sm_90a device pass only, where these exist; other passes see none of
 * them (their kernels compile empty). */
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
/* Spins until the barrier's phase with this parity has completed. */
static __device__ __forceinline__ void sm90_bar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
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
#endif /* NB_SM90A_DEVICE */

#endif /* NB_CUDA_SM90_CUH */
