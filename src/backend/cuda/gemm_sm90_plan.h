/* The own sm_90a GEMM's host-side planning (gemm_sm90_plan.cu), used by its
 * kernel and launch (gemm_sm90.cu): the tile shape both sides agree on, the
 * schedule candidates and their heuristic, the split-K workspace, and the
 * checks that turn a product's views into TMA maps; the tensor-map encoding
 * and device check every sm_90a kernel uses. CUDA C++ only. */
#ifndef NB_GEMM_SM90_PLAN_H
#define NB_GEMM_SM90_PLAN_H

#include <cuda.h>
#include <cudaTypedefs.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm.h"

/* One output tile is NB_SM90_BM x NB_SM90_BN, its k-tiles NB_SM90_BK deep
 * for 16-bit operands and 2 NB_SM90_BK for FP8 ones (128 bytes either way);
 * the heuristic's raster walks N with NB_SM90_GROUP_M tile rows together. */
enum { NB_SM90_BM = 128, NB_SM90_BN = 256, NB_SM90_BK = 64, NB_SM90_GROUP_M = 8 };

/* Split-sync's layout (gemm_sm90_plan.cu; q = 0: not this schedule): every
 * tile's k-tiles [0, q L) in q main parts of L, one CTA each, the last the
 * tile's head; spares = grid - q T CTAs, each running a whole rests
 * [q L, ktiles) of tiles s, s + spares, ...; the left = T - a spares tiles
 * after those have mains of L2 and their rests cut into n pieces, one for
 * each of the first n left spares, which run it first. */
struct nb_sm90_sync {
  int q, spares, a, left, n, L, L2;
  /* derived, so the kernel's walk needs no more registers: T, q T, a spares,
   * the rests' first k-tile q L, the pieces' q L2, and r / n, r % n for the
   * pieces' r = ktiles - q L2 k-tiles */
  int tiles, mains, whole, k_rest, k_piece, step, rem;
  nb_fastdiv dtiles, dn; /* division by T and by n */
};

/* What schedule candidate i launches for a problem (nb_sm90_resolve). Two
 * candidates with the same schedule run the same kernel the same way. */
struct nb_sm90_sched {
  int group, sk, splits, cluster;
  int64_t grid;
  int64_t dp_tiles; /* stream-K: tiles run data-parallel first (dpsk), 0 otherwise */
  int sk_ctas;      /* stream-K: CTAs that share the split tiles' k-iterations */
  int sk_heads;     /* stream-K with heads: one CTA per tile runs its first head_k k-tiles */
  int head_k;
  int pingpong;     /* the ping-pong kernel (128 x 128 tiles, one per consumer warpgroup) */
  int tiles_n;      /* tile columns: of NB_SM90_BN, or of NB_SM90_BN / 2 with pingpong */
  nb_sm90_sync sy;  /* split-sync (sy.q > 0) */
};

/* The number of schedule candidates (nb_sm90_candidate names them). */
int nb_sm90_cand_count(void);
/* The name table nb_tune_pick takes: nb_sm90_cand_count() names. */
const char *const *nb_sm90_cand_names(void);
/* Candidate i (0 <= i < nb_sm90_cand_count()) for tiles_m tile rows, N
 * columns and ktiles k-tiles per tile on n_sm SMs. Candidate 0, the
 * heuristic, resolves to pingpong's launch at most 12 k-tiles deep with at
 * least n_sm tiles of 128 x 128 (gemm_sm90_plan.cu). */
nb_sm90_sched nb_sm90_resolve(int i, int tiles_m, int64_t N, int ktiles, int n_sm);
int nb_sm90_same(const nb_sm90_sched &a, const nb_sm90_sched &b);

/* Whether candidate i, a rows x N x K product, k-tiles of bk elements and
 * n_sm SMs are arguments the schedule functions take (sizes up to INT32_MAX). */
int nb_sm90_args_ok(int i, int64_t rows, int64_t N, int64_t K, int bk, int n_sm);
/* nb_sm90_schedule for k-tiles of bk elements (NB_SM90_BK: bf16/f16,
 * 2 NB_SM90_BK: FP8). */
int nb_sm90_schedule_bk(int i, int64_t rows, int64_t N, int64_t K, int bk, int n_sm,
                        nb_gemm_own_schedule *out);

/* How many clusters of cfg's cluster size of the kernel kern can be
 * resident at once on the context's device; cached per device, so kern
 * must be one of the kernels that take a whole SM per CTA and clusters of
 * two, whose answer is the same: the own GEMM's instantiations and the
 * attention forward (cuda_attention_sm90.cu). */
int nb_sm90_max_clusters(const nb_cuda_ctx *ctx, const void *kern, const cudaLaunchConfig_t *cfg);

/* The device's split-K/stream-K workspace and the next launch epoch; 0
 * when it cannot be had (the caller then runs data-parallel). */
int nb_sm90_ws_get(const nb_cuda_ctx *ctx, float **ws, unsigned **flags, unsigned *epoch);

/* cuTensorMapEncodeTiled through the runtime's driver entry point, so the
 * library needs no -lcuda (looked up once). NULL when the driver lacks it. */
PFN_cuTensorMapEncodeTiled_v12000 nb_sm90_encode_fn(void);
/* enc's tiled map of p (rank dims, rank - 1 byte strides, boxes box) as the
 * sm_90a kernels read and write them: unit element strides, no interleave,
 * the 128-byte swizzle, 256-byte L2 promotion, zero fill out of bounds. 1
 * when the driver accepted it. */
int nb_sm90_encode(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap *m, CUtensorMapDataType type,
                   cuuint32_t rank, void *p, const cuuint64_t *dims, const cuuint64_t *strides,
                   const cuuint32_t *box);
/* 1 if the device is compute capability 9.0 (the sm_90a code runs there). */
int nb_sm90_device_ok(int dev);
/* "NAME-132sm" for the context's device into buf (the autotuning key). */
void nb_sm90_device_label(const nb_cuda_ctx *ctx, char *buf, size_t cap);

/* An output (rows x N, rows ld apart): its TMA store map when TMA can
 * describe it (*tma), and whether direct stores may go two elements at a
 * time (*pairs). */
void nb_sm90_out_map(CUtensorMap *m, int *tma, int *pairs, nb_dtype dt, void *p, int64_t rows,
                     int64_t N, int64_t ld);
/* The row stride *ld of an (M, N) matrix view whose columns are contiguous:
 * 0 when they are not. */
int nb_sm90_ld(const nb_kview *v, int64_t M, int64_t N, int64_t *ld);

struct nb_sm90_maps {
  CUtensorMap a, b, c, aux;
};

/* The problem after folding batches into rows, with its operand maps. in,
 * in_b: A's and B's dtypes (the same for bf16/f16; FP8 formats may mix);
 * scale_a, scale_b: FP8's per-tensor scales on the device (NULL otherwise). */
struct nb_sm90_problem {
  nb_dtype in, in_b;
  int ta, tb;
  int64_t rows, N, K, ldc;
  const float *scale_a, *scale_b;
  nb_sm90_maps m;
};

/* Checks that the own kernel takes out = a @ b and builds the operand maps:
 * 1 when it does. */
int nb_sm90_plan(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a, const nb_kview *b,
                 nb_sm90_problem *pr);

/* Runs a planned problem (gemm_sm90.cu): out = epilogue(A B) (ep NULL: the
 * plain product; ldaux, ldcin: the row strides of ep's aux and c), FP8 ones
 * times s_a s_b, under the schedule candidate that is cached, forced, tuned
 * (NABLA_AUTOTUNE=1) or the heuristic. Sets pr's output maps. */
nb_status nb_sm90_run(const nb_cuda_ctx *ctx, nb_sm90_problem *pr, const nb_kview *out,
                      const nb_gemm_epilogue *ep, int64_t ldaux, int64_t ldcin);

#endif /* NB_GEMM_SM90_PLAN_H */
