/* Philox-4x32-10 on the device, the rounds of src/core/philox.c: the four
 * words of block (seed, counter). cuda_random.cu's draws and the attention
 * kernels' dropout masks (cuda_attention_extra.cuh) use it, so that both
 * equal the CPU's bit for bit. */
#ifndef NB_CUDA_PHILOX_CUH
#define NB_CUDA_PHILOX_CUH

#include <stdint.h>

__device__ __forceinline__ void nb_philox_dev(uint64_t seed, uint64_t counter, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; r++) {
    uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

#endif /* NB_CUDA_PHILOX_CUH */
