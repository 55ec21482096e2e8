/* nabla's own GEMM for Hopper (sm_90a), host side: C (M x N, row-major) =
 * epilogue(A (M x K) B (K x N)) for bf16 and f16 operands (nb_sm90_matmul,
 * nb_sm90_gemm_ex), and the run of any planned problem (nb_sm90_run, also
 * for the FP8 products of gemm_sm90_fp8.cu): parameters, the schedule
 * candidate (heuristic, cached, forced or tuned), the launch of the
 * bf16/f16 instantiations and the autotuning runs.
 * The kernel, its structure and its schedules: gemm_sm90_kernel.cuh. The
 * host-side planning (TMA maps, which products fit, the split-K model and
 * workspace, the schedule candidates): gemm_sm90_plan.cu. */
#include <stdio.h>
#include <string.h>

#include "backend/autotune.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemm_sm90.h"
#include "backend/cuda/gemm_sm90_kernel.cuh"
#include "backend/cuda/gemm_sm90_plan.h"

/* ---- host: parameters and launch ------------------------------------------ */
/* Zeroed parameters for a rows x N x K product with bk-element k-tiles:
 * sizes and tile counts (each at most INT32_MAX: the planners check). */
static void sm90_shape(nb_sm90_params *p, int64_t rows, int64_t N, int64_t K, int bk) {
  memset(p, 0, sizeof *p);
  p->M = (int)rows;
  p->N = (int)N;
  p->K = (int)K;
  p->tiles_m = (int)((rows + kBM - 1) / kBM);
  p->tiles_n = (int)((N + kBN - 1) / kBN);
  p->ktiles = (int)((K + bk - 1) / bk);
}

/* p's split fields for schedule s (tiles: p's tile count). */
static void sm90_split_params(nb_sm90_params *p, const nb_sm90_sched &s, int64_t tiles) {
  p->sk = s.sk;
  p->splits = s.splits;
  p->sy = s.sy;
  p->dp_first = tiles - s.dp_tiles;
  p->sk_ctas = s.sk_ctas;
  p->sk_heads = s.sk_heads;
  p->head_k = s.head_k;
  p->work = s.sk_heads ? (int64_t)s.sk_heads * (p->ktiles - s.head_k) : (tiles - s.dp_tiles) * p->ktiles;
}

/* p's kernel, tiles and raster for schedule s, unsplit (sm90_split_params
 * adds the split). */
static void sm90_unsplit_params(nb_sm90_params *p, const nb_sm90_sched &s) {
  p->pingpong = s.pingpong;
  p->tiles_n = s.tiles_n; /* 128-wide tile columns with pingpong */
  p->group = s.group;
  p->cluster = s.cluster;
  p->sk = 0;
  p->splits = 1;
  p->sy = nb_sm90_sync();
}

/* Sets p's schedule to s and returns the grid; a split schedule without its
 * workspace falls back to the persistent data-parallel grid. */
static int64_t sm90_apply(const nb_cuda_ctx *ctx, nb_sm90_params *p, const nb_sm90_sched &s) {
  sm90_unsplit_params(p, s);
  int split = s.sk || s.splits > 1 || s.sy.q;
  if (split && nb_sm90_ws_get(ctx, &p->ws, &p->flags, &p->epoch)) {
    sm90_split_params(p, s, (int64_t)p->tiles_m * p->tiles_n);
    return s.grid;
  }
  if (!split) return s.grid;
  /* one unit (a tile, or with clusters a pair of tile rows' tiles) per cluster */
  int64_t units = (int64_t)((p->tiles_m + p->cluster - 1) / p->cluster) * p->tiles_n, clusters = ctx->n_sm / p->cluster;
  return p->cluster * (units < clusters ? units : clusters);
}

/* Counts a head's takes into its segment (the first NB_GEMM_OWN_TAKES stored). */
struct sm90_take_rec {
  nb_gemm_own_segment *g;
  __host__ __device__ void operator()(int slot) const {
    if (g->ntakes < NB_GEMM_OWN_TAKES) g->takes[g->ntakes] = slot;
    g->ntakes++;
  }
};

int nb_sm90_walk(int i, int64_t rows, int64_t N, int64_t K, int n_sm, int cta, nb_gemm_own_segment *seg,
                 int cap) {
  if (!nb_sm90_args_ok(i, rows, N, K, kBK, n_sm) || cta < 0) return -1;
  nb_sm90_params p;
  sm90_shape(&p, rows, N, K, kBK);
  nb_sm90_sched s = nb_sm90_resolve(i, p.tiles_m, N, p.ktiles, n_sm);
  sm90_unsplit_params(&p, s);
  sm90_split_params(&p, s, (int64_t)p.tiles_m * p.tiles_n);
  if (s.pingpong || cta >= s.grid) return s.pingpong ? -1 : 0; /* the ping-pong kernel has its own walk */
  sm90_walk w(p, cta);
  int n = 0, unit, kb, ke, role;
  while (w.next(p, cta, (int)s.grid, &unit, &kb, &ke, &role)) {
    /* with clusters the walk is over units: this CTA's tile of the unit, in the unclustered
     * numbering (none past the last tile row) */
    int tile = unit;
    if (p.cluster > 1) {
      int m0, n0;
      sm90_tile(unit, p, (uint32_t)(cta % p.cluster), &m0, &n0);
      if (m0 / kBM >= p.tiles_m) continue;
      tile = (m0 / kBM) * p.tiles_n + n0 / kBN;
    }
    if (n < cap) {
      nb_gemm_own_segment *g = &seg[n];
      g->tile = tile;
      g->kb = kb;
      g->ke = ke;
      g->role = role;
      g->slot = role == SM90_PUT ? sm90_slot(p, unit, cta) : -1;
      g->ntakes = 0;
      if (role == SM90_HEAD) sm90_takes(p, cta, unit, sm90_take_rec{g}); /* as sm90_partial_add */
    }
    n++;
  }
  return n;
}

/* ---- launch ----------------------------------------------------------------- */
/* Launches of the own kernel's bf16/f16 instantiations, for tests that must
 * know it ran (the FP8 ones count in gemm_sm90_fp8.cu). */
static int64_t sm90_launches;

int64_t nb_sm90_launches(int dev) {
  return nb_sm90_device_ok(dev) ? __atomic_load_n(&sm90_launches, __ATOMIC_RELAXED) : -1;
}

template <typename T, typename TO>
static nb_status sm90_dispatch(const nb_cuda_ctx *ctx, int ta, int tb, const nb_sm90_maps &m,
                               const nb_sm90_params &p, int64_t grid) {
  if (!ta && !tb) return sm90_launch<T, TO, 0, 0>(ctx, m, p, grid, &sm90_launches);
  if (!ta && tb) return sm90_launch<T, TO, 0, 1>(ctx, m, p, grid, &sm90_launches);
  if (ta && !tb) return sm90_launch<T, TO, 1, 0>(ctx, m, p, grid, &sm90_launches);
  return sm90_launch<T, TO, 1, 1>(ctx, m, p, grid, &sm90_launches);
}

/* Launches the kernel for problem pr's operands and output dtype out on grid
 * CTAs (maps m: pr's, or with a scratch output). */
static nb_status sm90_go(const nb_cuda_ctx *ctx, const nb_sm90_problem *pr, nb_dtype out,
                         const nb_sm90_maps &m, const nb_sm90_params &p, int64_t grid) {
  nb_dtype in = pr->in;
  int ta = pr->ta, tb = pr->tb;
  if (nb_dtype_is_fp8(in)) return nb_sm90_go_f8(ctx, in, pr->in_b, out, m, p, grid);
  if (in == NB_BF16)
    return out == NB_F32 ? sm90_dispatch<__nv_bfloat16, float>(ctx, ta, tb, m, p, grid)
                         : sm90_dispatch<__nv_bfloat16, __nv_bfloat16>(ctx, ta, tb, m, p, grid);
  return out == NB_F32 ? sm90_dispatch<__half, float>(ctx, ta, tb, m, p, grid)
                       : sm90_dispatch<__half, __half>(ctx, ta, tb, m, p, grid);
}

/* ---- autotuning ------------------------------------------------------------
 * The key: device name and SM count, "gemm_sm90", operand dtype (A's and
 * B's when an FP8 product mixes formats; with the output's when it
 * differs: an f32 output doubles the stores), layout as
 * in BLAS for row-major matrices (N: a as stored, T: a transposed view; A
 * then B) and the rows (batches folded in) x N x K class. No epilogue in
 * the key: fused calls (nb_sm90_gemm_ex) share the plain product's choice.
 * The candidates differ only in the schedule, and the epilogue is the same
 * work per tile under each of them, so the product alone ranks them; and
 * a fused call cannot be timed as itself into its own output, since its c
 * may be that output (an in-place residual: each run would add c again).
 * So a fused call that finds the key new times the plain product into
 * scratch, and a plain call times itself into its output (every run
 * overwrites it; the chosen run writes it last). */

/* One candidate's timing: the plain product (p, maps m) into out (the
 * caller's output, or scratch allocated on the first timing when scratch
 * is set). Events on the context's stream. */
struct sm90_tune {
  const nb_cuda_ctx *ctx;
  const nb_sm90_problem *pr;
  nb_sm90_params p;
  nb_sm90_maps m;
  nb_dtype out;
  int scratch;
  void *buf;
  size_t bytes;
  cudaEvent_t e0, e1;
};

/* Scratch output and events for the timings; 0 when they cannot be had. */
static int sm90_tune_setup(sm90_tune *t) {
  if (t->scratch && !t->buf) {
    size_t bytes = (size_t)(t->pr->rows * t->pr->N) * nb_dtype_size(t->out);
    if (!(t->buf = nb_cuda_scratch(t->ctx, bytes))) return 0;
    t->bytes = bytes;
    t->p.c = t->buf;
    t->p.ldc = t->pr->N;
    nb_sm90_out_map(&t->m.c, &t->p.tma_c, &t->p.pairs_c, t->out, t->buf, t->pr->rows, t->pr->N, t->pr->N);
    t->m.aux = t->m.c;
  }
  if (!t->e0 && cudaEventCreate(&t->e0) != cudaSuccess) t->e0 = NULL;
  if (!t->e1 && cudaEventCreate(&t->e1) != cudaSuccess) t->e1 = NULL;
  return t->e0 && t->e1;
}

/* Launches per timing sample (at most 64): nb_tune_sample_seconds() of work
 * at 500 TFLOP/s (1 ms by default), so that a small product's sample is not
 * one launch's jitter. */
static int sm90_time_reps(const nb_sm90_problem *pr) {
  double s = 2.0 * (double)pr->rows * (double)pr->N * (double)pr->K / 5e14, want = nb_tune_sample_seconds();
  return s >= want ? 1 : s * 64 <= want ? 64 : (int)(want / s) + 1;
}

/* nb_tune_time_fn: seconds of one run of candidate i (the mean over
 * sm90_time_reps launches); -1 when it would launch what an earlier
 * candidate launched (timed there) or fails. One warm-up and the median of
 * three samples come from nb_tune_pick. Each launch takes its own epoch. */
static double sm90_time(void *arg, int i) {
  sm90_tune *t = (sm90_tune *)arg;
  const nb_sm90_params &q = t->p;
  nb_sm90_sched s = nb_sm90_resolve(i, q.tiles_m, q.N, q.ktiles, t->ctx->n_sm);
  for (int j = 0; j < i; j++)
    if (nb_sm90_same(nb_sm90_resolve(j, q.tiles_m, q.N, q.ktiles, t->ctx->n_sm), s)) return -1;
  int had = nb_error_pending();
  float ms = -1;
  int reps = sm90_time_reps(t->pr);
  if (sm90_tune_setup(t)) {
    cudaStream_t st = t->ctx->stream;
    int ok = cudaEventRecord(t->e0, st) == cudaSuccess;
    for (int r = 0; ok && r < reps; r++) {
      nb_sm90_params p = t->p;
      int64_t grid = sm90_apply(t->ctx, &p, s);
      ok = sm90_go(t->ctx, t->pr, t->out, t->m, p, grid) == NB_OK;
    }
    if (!ok || cudaEventRecord(t->e1, st) != cudaSuccess || cudaEventSynchronize(t->e1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, t->e0, t->e1) != cudaSuccess)
      ms = -1;
  }
  if (ms < 0) { /* leave no error behind: the chosen run reports its own */
    cudaGetLastError();
    if (!had) nb_clear_error();
    return -1;
  }
  return ms * 1e-3 / reps;
}

/* The candidate for a planned problem whose parameters (schedule unset)
 * are p: cached, tuned (NABLA_AUTOTUNE=1) or 0. With tuning off and nothing
 * cached, no key is built. ep: a fused call (times into scratch). */
static int sm90_pick(const nb_cuda_ctx *ctx, const nb_sm90_problem *pr, const nb_sm90_params &p,
                     nb_dtype out, int ep) {
  if (!nb_tune_active()) return 0;
  char dev[112], dtype[32], key[192];
  const char layout[3] = {pr->ta ? 'T' : 'N', pr->tb ? 'N' : 'T', 0};
  nb_sm90_device_label(ctx, dev, sizeof dev);
  if (pr->in_b != pr->in) /* FP8 mixes: both formats, then the output */
    snprintf(dtype, sizeof dtype, "%sx%s-%s", nb_dtype_name(pr->in), nb_dtype_name(pr->in_b), nb_dtype_name(out));
  else if (out == pr->in) snprintf(dtype, sizeof dtype, "%s", nb_dtype_name(pr->in));
  else snprintf(dtype, sizeof dtype, "%s-%s", nb_dtype_name(pr->in), nb_dtype_name(out));
  const int64_t dims[3] = {pr->rows, pr->N, pr->K};
  if (!nb_tune_key(key, sizeof key, dev, "gemm_sm90", dtype, layout, 3, dims)) return 0;
  sm90_tune t;
  memset(&t, 0, sizeof t);
  t.ctx = ctx;
  t.pr = pr;
  t.p = p; /* the plain product: no epilogue */
  t.p.alpha = 1.0f;
  t.p.beta = 0.0f;
  t.p.gelu = 0;
  t.p.aux = NULL;
  t.p.tma_aux = 0;
  t.p.cin = NULL;
  t.p.bias = NULL;
  t.m = pr->m;
  t.out = out;
  t.scratch = ep;
  /* a stream being captured into a graph must not be synchronised: no timing */
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  int capturing = cudaStreamIsCapturing(ctx->stream, &cap) != cudaSuccess ||
                  cap != cudaStreamCaptureStatusNone;
  cudaGetLastError();
  int i = nb_tune_pick(key, nb_sm90_cand_count(), nb_sm90_cand_names(), capturing ? NULL : sm90_time, &t, 0);
  if (t.e0) cudaEventDestroy(t.e0);
  if (t.e1) cudaEventDestroy(t.e1);
  nb_cuda_scratch_free(ctx, t.buf, t.bytes);
  return i;
}

/* Runs a planned problem: out (and the epilogue's views, NULL ep = none). */
nb_status nb_sm90_run(const nb_cuda_ctx *ctx, nb_sm90_problem *pr, const nb_kview *out,
                      const nb_gemm_epilogue *ep, int64_t ldaux, int64_t ldcin) {
  nb_sm90_params p;
  sm90_shape(&p, pr->rows, pr->N, pr->K, nb_dtype_is_fp8(pr->in) ? 2 * kBK : kBK);
  p.scale_a = pr->scale_a;
  p.scale_b = pr->scale_b;
  p.alpha = ep ? ep->alpha : 1.0f;
  p.beta = ep && ep->c ? ep->beta : 0.0f;
  p.gelu = ep ? ep->gelu : 0;
  p.c = out->data;
  p.ldc = pr->ldc;
  nb_sm90_out_map(&pr->m.c, &p.tma_c, &p.pairs_c, out->dtype, out->data, pr->rows, pr->N, pr->ldc);
  pr->m.aux = pr->m.c;
  if (ep && ep->aux) {
    p.aux = ep->aux->data;
    p.ldaux = ldaux;
    nb_sm90_out_map(&pr->m.aux, &p.tma_aux, &p.pairs_aux, out->dtype, p.aux, pr->rows, pr->N, ldaux);
  }
  if (p.beta != 0.0f) {
    p.cin = ep->c->data;
    p.ldcin = ldcin;
  }
  if (ep && ep->bias) p.bias = ep->bias->data;
  int cand = sm90_pick(ctx, pr, p, out->dtype, ep != NULL);
  int64_t grid = sm90_apply(ctx, &p, nb_sm90_resolve(cand, p.tiles_m, p.N, p.ktiles, ctx->n_sm));
  return sm90_go(ctx, pr, out->dtype, pr->m, p, grid);
}

int nb_sm90_matmul(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a,
                   const nb_kview *b, nb_status *st) {
  *st = NB_OK;
  nb_sm90_problem pr;
  if (out->dtype != a->dtype || !nb_sm90_plan(ctx, out, a, b, &pr)) return 0;
  *st = nb_sm90_run(ctx, &pr, out, NULL, 0, 0);
  return 1;
}

int nb_sm90_gemm_ex(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a,
                    const nb_kview *b, const nb_gemm_epilogue *ep, nb_status *st) {
  *st = NB_OK;
  if (out->ndim != 2 || (out->dtype != a->dtype && out->dtype != NB_F32)) return 0;
  int64_t M = out->shape[0], N = out->shape[1], ldaux = 0, ldcin = 0;
  if (ep && ep->aux && !nb_sm90_ld(ep->aux, M, N, &ldaux)) return 0;
  if (ep && ep->c && ep->beta != 0.0f && !nb_sm90_ld(ep->c, M, N, &ldcin)) return 0;
  if (ep && ep->bias && ep->bias->strides[0] != 1 && N > 1) return 0;
  nb_sm90_problem pr;
  if (!nb_sm90_plan(ctx, out, a, b, &pr)) return 0;
  *st = nb_sm90_run(ctx, &pr, out, ep, ldaux, ldcin);
  return 1;
}
