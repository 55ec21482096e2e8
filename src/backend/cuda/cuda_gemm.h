/* GEMM with a fused epilogue, the CUDA backend's gemm_ex entry (C
 * linkage), and the own sm_90a kernel's introspection for tests and
 * benchmarks. Only meaningful when built with NABLA_HAVE_CUDA. */
#ifndef NB_CUDA_GEMM_H
#define NB_CUDA_GEMM_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out (M, N) = epilogue(a (M, K) @ b (K, N)) on the device holding out
 * (nb_gemm_epilogue, backend.h): the CUDA backend's gemm_ex entry.
 * a and b: f16, bf16, f32 or f64, the same dtype; out: a's dtype, or f32
 * for f16 and bf16 operands. Any strides. Runs nabla's own sm_90a kernel
 * with the epilogue fused where it applies (unless the GEMM backend was set to
 * cuBLASLt: NABLA_GEMM=cublaslt or nb_cuda_set_gemm_backend(0)); otherwise a
 * cuBLASLt product followed by one epilogue kernel. NULL ep = plain product. */
nb_status nb_cuda_gemm_ex(const nb_kview *out, const nb_kview *a, const nb_kview *b,
                          const nb_gemm_epilogue *ep);

/* How many times nabla's own sm_90a GEMM kernel has been launched in this
 * process; -1 when CUDA device `device` cannot run it (not compute
 * capability 9.0). Lets tests check that a case reached the kernel rather
 * than the cuBLASLt fallback. */
int64_t nb_cuda_gemm_own_launches(int device);
/* Launches of the sm_90a FP8 kernel of nb_scaled_mm (gemm_sm90_fp8.cu) on
 * CUDA device `device` so far; -1 when it cannot run there (not 9.0). */
int64_t nb_cuda_scaled_mm_own_launches(int device);

/* The name of candidate i among the own sm_90a GEMM's schedules that
 * autotuning chooses from (NABLA_AUTOTUNE=1; nb_tune_force(i) in tests),
 * NULL past the last. Candidate 0 is the choice when tuning is off. */
const char *nb_cuda_gemm_own_candidate(int i);

/* The launch that the own sm_90a GEMM's candidate i makes for a product of
 * rows x N x K on a device with n_sm SMs (host arithmetic only, no device
 * needed): for tests of the schedule model. tiles: 128 x 256 output tiles;
 * splits: split-K parts per tile (1: none); group: unit rows per raster
 * group; grid: CTAs (a clustered grid is further capped at launch by the
 * clusters that fit). 0 when i is out of range or a size is below 1. */
typedef struct {
  int64_t tiles, grid;
  int splits, stream_k, cluster, group;
  int64_t dp_tiles; /* stream-K after this many data-parallel tiles (dpsk) */
  int sk_ctas;      /* stream-K: CTAs sharing the split k-iterations */
  int tile_n;       /* tile width: 256, or 128 for the ping-pong kernel (128 x 128 tiles) */
  int sk_heads;     /* stream-K with heads: CTAs 0 .. sk_heads - 1 run one tile's first head_k k-tiles */
  int head_k;
  int sync_q;       /* split-sync: main parts per tile (0: not split-sync), of sync_l k-tiles */
  int sync_l, sync_l2; /* (sync_l2 for the tiles whose rests are cut into pieces) */
} nb_gemm_own_schedule;
int nb_cuda_gemm_own_schedule(int i, int64_t rows, int64_t N, int64_t K, int n_sm,
                              nb_gemm_own_schedule *out);
/* One segment of a CTA's walk over the own kernel's (tile, k range) work:
 * k-tiles [kb, ke) of tile `tile` (in the raster order), role 0 (the whole
 * tile: stored), 1 (a partial: put into workspace slot `slot`) or 2 (the
 * tile's head: adds ntakes partials, of slots takes[0], takes[1], ... (the
 * first NB_GEMM_OWN_TAKES stored) in that order, then stores). */
enum { NB_GEMM_OWN_TAKES = 16 };
typedef struct {
  int tile, kb, ke, role, slot;
  int ntakes, takes[NB_GEMM_OWN_TAKES];
} nb_gemm_own_segment;
/* CTA cta's segments under candidate i for rows x N x K on n_sm SMs, as the
 * cooperative kernel walks them (host arithmetic only): the count (the
 * first cap stored in seg), 0 for a CTA past the grid, -1 for a bad
 * argument or a candidate that runs the ping-pong kernel. For tests. */
int nb_cuda_gemm_own_walk(int i, int64_t rows, int64_t N, int64_t K, int n_sm, int cta,
                          nb_gemm_own_segment *seg, int cap);
/* The same for nb_scaled_mm's FP8 product of rows x N x K (its k-tiles are
 * 128 elements deep, not 64): the same candidates and rules. */
int nb_cuda_scaled_mm_own_schedule(int i, int64_t rows, int64_t N, int64_t K, int n_sm,
                                   nb_gemm_own_schedule *out);

#ifdef __cplusplus
}
#endif
#endif /* NB_CUDA_GEMM_H */
