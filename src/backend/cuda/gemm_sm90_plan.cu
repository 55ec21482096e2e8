/* The own sm_90a GEMM's host-side planning (see gemm_sm90.cu for the kernel):
 * TMA maps of the operands and outputs, which products the kernel takes,
 * the split-K cost model and its workspace, the schedule candidates that
 * autotuning chooses among and their resolution for a problem. Nothing
 * here launches the kernel; nb_sm90_schedule and nb_sm90_candidate answer
 * without a device (tests/test_gemm_schedule.c). */
#include <cudaTypedefs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/gemm_sm90.h"
#include "backend/cuda/gemm_sm90_plan.h"

constexpr int kBM = NB_SM90_BM, kBN = NB_SM90_BN, kBK = NB_SM90_BK, kGroupM = NB_SM90_GROUP_M;

PFN_cuTensorMapEncodeTiled_v12000 nb_sm90_encode_fn(void) {
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

int nb_sm90_encode(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap *m, CUtensorMapDataType type,
                   cuuint32_t rank, void *p, const cuuint64_t *dims, const cuuint64_t *strides,
                   const cuuint32_t *box) {
  static const cuuint32_t es[5] = {1, 1, 1, 1, 1};
  return enc(m, type, rank, p, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int nb_sm90_device_ok(int dev) {
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

static CUtensorMapDataType sm90_tma_type(nb_dtype dt) {
  return dt == NB_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
         : dt == NB_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
}

/* A 2-D tensor map of dtype dt: inner x outer elements, rows stride_el
 * apart, box box_in x box_out, 128-byte swizzle, zero fill out of bounds.
 * 0 when TMA cannot take it (alignment, sizes). */
static int sm90_map(CUtensorMap *m, nb_dtype dt, const void *p, int64_t inner, int64_t outer,
                    int64_t stride_el, uint32_t box_in, uint32_t box_out) {
  PFN_cuTensorMapEncodeTiled_v12000 enc = nb_sm90_encode_fn();
  int64_t es = (int64_t)nb_dtype_size(dt);
  if (!enc || !p || ((uintptr_t)p & 15)) return 0;
  int64_t sb = outer == 1 ? ((inner * es + 15) & ~(int64_t)15) : stride_el * es;
  if (sb % 16 || sb < inner * es || sb >= ((int64_t)1 << 40)) return 0;
  if (inner >= ((int64_t)1 << 32) || outer >= ((int64_t)1 << 32)) return 0;
  cuuint64_t dims[2] = {(cuuint64_t)inner, (cuuint64_t)outer}, strides[1] = {(cuuint64_t)sb};
  cuuint32_t box[2] = {box_in, box_out};
  return nb_sm90_encode(enc, m, sm90_tma_type(dt), 2, (void *)p, dims, strides, box);
}

/* An output's TMA store map: boxes of 64 rows x 128 bytes. */
void nb_sm90_out_map(CUtensorMap *m, int *tma, int *pairs, nb_dtype dt, void *p, int64_t rows,
                     int64_t N, int64_t ld) {
  size_t es = nb_dtype_size(dt);
  *pairs = ld % 2 == 0 && ((uintptr_t)p % (2 * es)) == 0;
  *tma = sm90_map(m, dt, p, N, rows, ld, (uint32_t)(128 / es), 64);
}

/* ---- split tiles: split-K and stream-K -----------------------------------
 * Split-K (the heuristic's choice when the tiles do not fill the SMs): S
 * parts per tile, CTA u on part u / tiles of tile u % tiles. All CTAs of a
 * part read the same k columns at the same time, so L2 serves the panels
 * they share. Stream-K (a tuning candidate only) splits the k-iterations
 * evenly instead, which staggers the CTAs over k: on the H100 the GPT-2
 * weight-gradient shapes ran 0.54-0.63x cuBLASLt with it (2304x768x16384
 * TN 0.170 ms), below one partly empty data-parallel wave (768x3072x16384
 * TN 0.157 against 0.222 ms).
 * S minimises a time in k-tiles: waves of one CTA per SM times the part's
 * k-tiles, plus kPartCost for each partial the head adds (a 128 KB f32
 * tile read from L2 costs about what 3 k-tiles of loads and wgmma do);
 * among S within 5% of the best, the fewest parts. Parts are at least 8
 * k-tiles long and the non-head parts fit the workspace's slots.
 * The workspace (kSlotsPerSM partial tiles per SM and two flags per slot)
 * is allocated once per device and kept; flags carry a launch epoch, so
 * they never need clearing. Launches on the device's one stream run in
 * order, so one workspace serves them all. */
constexpr int kSlotsPerSM = 2;
constexpr double kPartCost = 3.0;

static double sm90_split_cost(int64_t tiles, int64_t ktiles, int n_sm, int64_t s) {
  int64_t waves = (tiles * s + n_sm - 1) / n_sm;
  return (double)(waves * ((ktiles + s - 1) / s)) + kPartCost * (double)(s - 1);
}

static int sm90_splits(int64_t tiles, int64_t ktiles, int n_sm) {
  if (tiles >= n_sm) return 1;
  int64_t top = ktiles / 8, slots = (int64_t)kSlotsPerSM * n_sm;
  if (top > 16) top = 16;
  while (top > 1 && (top - 1) * tiles > slots) top--;
  double best = sm90_split_cost(tiles, ktiles, n_sm, 1);
  for (int64_t s = 2; s <= top; s++) {
    double c = sm90_split_cost(tiles, ktiles, n_sm, s);
    if (c < best) best = c;
  }
  for (int64_t s = 1; s <= top; s++)
    if (sm90_split_cost(tiles, ktiles, n_sm, s) <= 1.05 * best) return (int)s;
  return 1;
}

static pthread_mutex_t sm90_ws_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  float *ws;
  unsigned *flags;
  unsigned epoch;
  int slots;
} sm90_ws[64]; /* per device; guarded by sm90_ws_lock */

/* The device's workspace: kSlotsPerSM slots per SM. */
int nb_sm90_ws_get(const nb_cuda_ctx *ctx, float **ws, unsigned **flags, unsigned *epoch) {
  if (ctx->dev < 0 || ctx->dev >= 64) return 0;
  pthread_mutex_lock(&sm90_ws_lock);
  auto *s = &sm90_ws[ctx->dev];
  int want = kSlotsPerSM * ctx->n_sm;
  if (s->slots < want) {
    if (s->ws) cudaFree(s->ws); /* not reached with one n_sm per device */
    s->ws = NULL;
    s->slots = 0;
    size_t tile = (size_t)kBM * kBN * sizeof(float), fl = (size_t)2 * want * sizeof(unsigned);
    void *m = NULL;
    if (cudaMalloc(&m, tile * want + fl) == cudaSuccess &&
        cudaMemsetAsync((char *)m + tile * want, 0, fl, ctx->stream) == cudaSuccess) {
      s->ws = (float *)m;
      s->flags = (unsigned *)((char *)m + tile * want);
      s->slots = want;
    } else {
      if (m) cudaFree(m);
      cudaGetLastError();
    }
  }
  int ok = s->slots >= want;
  if (ok) {
    if (++s->epoch == 0) s->epoch = 1; /* 0 is the cleared state */
    *ws = s->ws;
    *flags = s->flags;
    *epoch = s->epoch;
  }
  pthread_mutex_unlock(&sm90_ws_lock);
  return ok;
}

/* ---- schedules ------------------------------------------------------------
 * The candidates among which autotuning chooses (backend/autotune.h). They
 * change only which CTA computes which tile or k range, and in what order;
 * the tile shape and the instructions stay, so the template instantiations
 * do not multiply (the ping-pong kernel has its own). Candidate 0 is the
 * heuristic, the choice when tuning is off: pingpong's launch where
 * sm90_heuristic_pingpong says so (few k-tiles, a full wave of 128 x 128
 * tiles; below), else raster groups of 8 tile rows (2 on narrow grids:
 * sm90_group_rows), split-K when
 * sm90_splits says so (or split-sync, below, where its time model is
 * shorter than that split-K's), else a persistent grid of min(tiles, SMs)
 * CTAs. The
 * others: groups of 4
 * or 16 tile rows (split-K as the heuristic); data-parallel (never split);
 * stream-K whenever the workspace can be had (also for several waves of
 * tiles: it evens out a last partial wave); one CTA per tile (not
 * persistent: the hardware hands tiles to SMs as CTAs finish, without the
 * overlap of one tile's stores with the next one's loads); clusters of 2
 * (data-parallel, pairs of tile rows share each B tile by TMA multicast:
 * half the B traffic from L2; on the H100 within +-2% of the unclustered
 * grid on the GPT-2 and square shapes, 6% slower at 2048^3, so not the
 * heuristic's choice); dpsk, sk-heads (below); pingpong (the ping-pong kernel,
 * gemm_sm90_pingpong.cuh: 128 x 128 tiles, one per consumer warpgroup in
 * turn, data-parallel on min(tiles, SMs) CTAs in groups of 8 tile rows,
 * its tile columns 128 wide). An output tile
 * is summed over k in order by one CTA, except that split-K and stream-K
 * add the partial sums of their k ranges in a fixed order: a candidate
 * changes results at most by rounding. */
static const char *const sm90_cand_names[] = {"default",      "group4",       "group16", "data-parallel",
                                              "stream-k",     "cta-per-tile", "cluster2", "dpsk",
                                              "sk-heads",     "split-sync",   "split-sync2",
                                              "pingpong"};
enum sm90_split { SM90_SPLIT_K, SM90_NO_SPLIT, SM90_STREAM_K, SM90_DPSK, SM90_SK_HEADS, SM90_SYNC };
static const struct {
  int group;          /* tile rows per raster group */
  sm90_split split;   /* split-K as sm90_splits says, no split, or stream-K */
  int per_tile;       /* data-parallel grid of one CTA per tile */
  int cluster;        /* 1, or 2 (when unsplit and there are two tile rows) */
  int pingpong;       /* the ping-pong kernel: 128 x 128 tiles, data-parallel */
} sm90_cands[] = {{kGroupM, SM90_SPLIT_K, 0, 1, 0},  {4, SM90_SPLIT_K, 0, 1, 0},
                  {16, SM90_SPLIT_K, 0, 1, 0},       {kGroupM, SM90_NO_SPLIT, 0, 1, 0},
                  {kGroupM, SM90_STREAM_K, 0, 1, 0}, {kGroupM, SM90_NO_SPLIT, 1, 1, 0},
                  {kGroupM, SM90_NO_SPLIT, 0, 2, 0}, {kGroupM, SM90_DPSK, 0, 1, 0},
                  {kGroupM, SM90_SK_HEADS, 0, 1, 0}, {kGroupM, SM90_SYNC, 0, 1, 0},
                  {kGroupM, SM90_SYNC, 0, 2, 0},     {kGroupM, SM90_NO_SPLIT, 0, 1, 1}};
constexpr int kCands = (int)(sizeof sm90_cands / sizeof *sm90_cands);
static_assert(sizeof sm90_cand_names / sizeof *sm90_cand_names == kCands, "one name per candidate");

const char *nb_sm90_candidate(int i) { return i >= 0 && i < kCands ? sm90_cand_names[i] : NULL; }
int nb_sm90_cand_count(void) { return kCands; }
const char *const *nb_sm90_cand_names(void) { return sm90_cand_names; }

/* ---- dpsk: data-parallel waves + a stream-K tail ---------------------------
 * T tiles on P SMs are W = T / P full waves and a last wave of r = T % P
 * tiles that leaves P - r SMs idle for a whole tile's time (8192^3: 2048
 * tiles, 15 waves + 68 tiles, the last wave half empty). dpsk first splits
 * the first r tiles of the raster order (a tail's worth: r ktiles
 * k-iterations) evenly over P' CTAs as stream-K does (the same partial
 * tiles, flags and fixed-order fix-up), then runs the other W P tiles
 * data-parallel as the persistent grid does (CTA c: tiles r + c, r + c + P,
 * ...), so the split part takes r ktiles / P' k-tiles plus the fix-up
 * instead of a whole last wave. The split tiles are consecutive in the
 * raster order, and consecutive CTAs take consecutive k ranges of them: the CTAs
 * sharing an A panel (tiles a raster group apart) or a B panel (adjacent
 * tiles) start within a few k-tiles of each other (8192^3: about 2 and 4
 * of 128), so L2 serves the panels as it does for the data-parallel waves;
 * an even stream-K of all tiles instead puts its CTAs on tiles far apart in
 * the raster. P' = min(P, r ktiles / kMinShare): each CTA's share is at
 * least kMinShare k-tiles, so a short K does not cut a tile into more
 * partials than its k-tiles pay for. No tail (r = 0), or P' <= r (each
 * share a whole tile or more): data-parallel. */
constexpr int64_t kMinShare = 4;

/* s: resolved as the data-parallel candidate, which it stays without a tail to split. */
static void sm90_dpsk(nb_sm90_sched *s, int64_t tiles, int ktiles, int n_sm) {
  int64_t waves = tiles / n_sm, r = tiles - waves * n_sm, ctas = r * ktiles / kMinShare;
  if (ctas > n_sm) ctas = n_sm;
  if (r == 0 || ctas <= r) return;
  s->sk = 1;
  s->dp_tiles = waves * n_sm;
  s->sk_ctas = (int)ctas;
  s->grid = waves > 0 ? n_sm : ctas;
}

/* ---- sk-heads: stream-K with heads ------------------------------------------
 * T < P tiles of K k-tiles each (the GPT-2 weight gradients: 72 or 54 tiles
 * of 256 k-tiles on 132 SMs). Split-K into S equal parts leaves a partly
 * empty last wave (72 x 3 parts = 216 on 132 SMs: 82% busy); stream-K
 * spreads the work evenly but its CTAs read each tile's operand panels at
 * staggered k, which cost it up to half its speed in L2 misses. sk-heads
 * keeps most of the work in step: CTA t < T runs tile t's first L
 * k-tiles (all T at the same k, as one data-parallel wave), the other
 * R = P - T CTAs split the T rests (K - L each) evenly as stream-K does and
 * put their partials; each head then adds its tile's partials (one or a
 * few) and stores. L balances the two sides in k-tile times: a head L plus
 * kPartCost per partial it reads, a rest CTA its share T (K - L) / R plus
 * kPartCost per partial it puts (the partials counted as the most ranges a
 * rest or a share can meet). L is searched upward from the even share
 * T K / P. No schedule (data-parallel) when T >= P, or the rests would be
 * shorter than kMinShare k-tiles. */
static double sm90_heads_cost(int64_t tiles, int64_t ktiles, int n_sm, int64_t L) {
  int64_t rest = ktiles - L, R = n_sm - tiles;
  double share = (double)(tiles * rest) / (double)R;
  double puts = (double)(int64_t)(share / (double)rest) + 2.0, reads = (double)(int64_t)((double)rest / share) + 2.0;
  if (puts > (double)tiles) puts = (double)tiles;
  double head = (double)L + kPartCost * (reads - 1.0), tail = share + kPartCost * puts;
  return head > tail ? head : tail;
}

static int64_t sm90_heads_k(int64_t tiles, int64_t ktiles, int n_sm) {
  if (tiles < 1 || tiles >= n_sm) return 0;
  int64_t lo = (tiles * ktiles + n_sm - 1) / n_sm, best = 0;
  double cost = 0.0;
  for (int64_t L = lo; L <= ktiles - kMinShare && L < lo + 256; L++) {
    double c = sm90_heads_cost(tiles, ktiles, n_sm, L);
    if (!best || c < cost) best = L, cost = c;
  }
  return best;
}

/* s: resolved as the data-parallel candidate, which it stays without heads.
 * The rests are taken in the raster order, a rest CTA's range a little
 * more than one rest, so consecutive CTAs are a fraction of a rest apart
 * in k: the tiles that share a panel of the larger operand are made
 * consecutive (rows: group 1, A's panels; columns: one group of all tile
 * rows, B's), so its panel is read again a few k-tiles after the first
 * read, from L2, where the group-8 raster put them 8 tiles (about 7 CTAs
 * and any k offset) apart. */
static void sm90_sk_heads(nb_sm90_sched *s, int tiles_m, int64_t tiles, int ktiles, int n_sm) {
  int64_t L = sm90_heads_k(tiles, ktiles, n_sm);
  if (!L) return;
  s->group = (int64_t)tiles_m * kBM >= (int64_t)s->tiles_n * kBN ? 1 : tiles_m;
  s->sk = 1;
  s->sk_ctas = n_sm;
  s->sk_heads = (int)tiles;
  s->head_k = (int)L;
  s->grid = n_sm;
}

/* ---- split-sync: split-K in step, with spares --------------------------------
 * T < P tiles of K k-tiles. Split-K into S equal parts runs whole waves of
 * parts (72 tiles x 3 parts on 132 SMs: 216 CTAs, the second wave 84) and
 * stream-K staggers the CTAs over k (sk-heads above: its rests start at as
 * many k offsets as their shares' remainder makes). Split-sync keeps every
 * CTA on one of a few k ranges at a time on one wave of P CTAs: q = P / T
 * main parts per tile of L k-tiles each ([0, q L), one CTA each, all tiles
 * at once; the last part's CTA is the tile's head), and the E = P - q T
 * spare CTAs (numbered first, so that heads wait only on CTAs launched
 * before them) run the rests [q L, K): a = T / E whole rests each (spare s
 * the tiles s, s + E, ...: at any time E consecutive tiles at one k), the
 * left = T - a E tiles after those with their rests cut in n = E / left
 * pieces, which the first n left spares run before their whole rests (all
 * leftover tiles' piece j at one k). Heads add, in k order, the other main
 * parts' partials, then the rest's or its pieces'. The leftover tiles'
 * mains are L2 = L - kPartCost (n - 1) long, since their heads read n - 1
 * partials more. L is searched upward from the even share T K / P, each
 * side timed in k-tiles with kPartCost a partial read or put: a normal head
 * waits for the later of its main and its spare, then reads q partials; a
 * leftover head for its main and its pieces, then reads q - 1 + n. On 132
 * SMs 72 x 256 (3072x768x16384): q 1, E 60, a 1, left 12, n 5, L ~143
 * against split-K's two waves of 86; 54 x 256: q 2, E 24, a 2, left 6, n 4,
 * L ~107 against one wave of 128. No schedule (data-parallel) when T >= P,
 * E = 0 (plain split-K), or pieces or rests would be under kMinShare. */
/* The layout for mains of L k-tiles (L2 for the leftover tiles) into *y,
 * with the derived fields the kernel's walk reads; 0 when a main, a rest or
 * a piece would be too short. */
static int sm90_sync_make(int64_t tiles, int64_t ktiles, int n_sm, int64_t L, int64_t L2, nb_sm90_sync *y) {
  int64_t q = n_sm / tiles, E = n_sm - q * tiles, a = tiles / E, left = tiles - a * E, n = left ? E / left : 0;
  if (!left) L2 = L;
  int64_t R = ktiles - q * L, R2 = ktiles - q * L2;
  if (L2 < 1 || L2 > L || R < kMinShare || (left && R2 < n * kMinShare)) return 0;
  *y = nb_sm90_sync{(int)q,         (int)E,         (int)a,          (int)left,        (int)n,       (int)L,
                    (int)L2,        (int)tiles,     (int)(q * tiles), (int)(a * E),     (int)(q * L),  (int)(q * L2),
                    (int)(n ? R2 / n : 0), (int)(n ? R2 % n : 0), nb_fastdiv_make((uint32_t)tiles),
                    nb_fastdiv_make((uint32_t)(n ? n : 1))};
  return 1;
}

/* The time model of the layout with mains of L (the leftover tiles' L2 =
 * L - kPartCost (n - 1)) into *y: the later of a normal and a leftover
 * head, in k-tile times; -1 when that layout cannot be made. */
static double sm90_sync_cost(int64_t tiles, int64_t ktiles, int n_sm, int64_t L, nb_sm90_sync *y) {
  int64_t E = n_sm - n_sm / tiles * tiles, left = tiles - tiles / E * E, n = left ? E / left : 0;
  if (!sm90_sync_make(tiles, ktiles, n_sm, L, L - (int64_t)(kPartCost * (double)(n - 1)), y)) return -1.0;
  double piece = left ? (double)((ktiles - (int64_t)y->k_piece + n - 1) / n) + kPartCost : 0.0;
  double spare = piece + (double)y->a * ((double)(ktiles - y->k_rest) + kPartCost);
  double main = (double)L + (y->q > 1 ? kPartCost : 0.0);
  double normal = (main > spare ? main : spare) + kPartCost * (double)y->q;
  double late = (double)y->L2 > piece ? (double)y->L2 : piece;
  double leftover = left ? late + kPartCost * (double)(y->q - 1 + n) : 0.0;
  return normal > leftover ? normal : leftover;
}

/* The best split-sync layout for T tiles of ktiles on n_sm SMs into *y, its
 * cost in k-tiles returned; -1 (and y->q 0) when it does not apply. */
static double sm90_sync_plan(int64_t tiles, int64_t ktiles, int n_sm, nb_sm90_sync *y) {
  *y = nb_sm90_sync();
  if (tiles < 1 || tiles >= n_sm || n_sm % tiles == 0) return -1.0;
  int64_t q = n_sm / tiles, lo = (tiles * ktiles + n_sm - 1) / n_sm;
  double best = -1.0;
  for (int64_t L = lo; L * q < ktiles && L < lo + 512; L++) {
    nb_sm90_sync c;
    double cost = sm90_sync_cost(tiles, ktiles, n_sm, L, &c);
    if (cost >= 0.0 && (best < 0.0 || cost < best)) best = cost, *y = c;
  }
  return best;
}

/* s: resolved as the data-parallel candidate, now the split-sync layout y
 * (sm90_sync_plan's), which NABLA_GEMM_SYNC_L=dL,D moves to mains of
 * y.L + dL k-tiles, the leftover tiles' L - D (for measurements). */
static void sm90_split_sync(nb_sm90_sched *s, const nb_sm90_sync &y, int64_t tiles, int ktiles, int n_sm) {
  s->sy = y;
  s->grid = n_sm;
  static const char *e = getenv("NABLA_GEMM_SYNC_L"); /* read once */
  long dL, D;
  nb_sm90_sync m;
  if (!e || sscanf(e, "%ld,%ld", &dL, &D) != 2) return;
  int64_t L = y.L + dL; /* a layout the model takes at L, then its leftover mains moved */
  if (L >= 1 && sm90_sync_cost(tiles, ktiles, n_sm, L, &m) >= 0.0 && sm90_sync_make(tiles, ktiles, n_sm, L, L - D, &m))
    s->sy = m;
}

/* ---- the heuristic's kernel ------------------------------------------------
 * Candidate 0 runs the ping-pong kernel (candidate pingpong's launch) when a
 * tile has at most kPPMaxKtiles k-tiles (bf16/f16: K <= 768; FP8's 128-deep
 * k-tiles: K <= 1536) and the 128 x 128 tiles fill at least one wave (tiles >=
 * SMs), any layout; the cooperative kernel otherwise. On the H100 (012fbda,
 * each schedule in its own process) pingpong was faster than the cooperative
 * heuristic on every such product measured, all of them 12 k-tiles:
 * 16384x3072x768 NT 0.1506 -> 0.1426 ms, NN 0.1361 -> 0.1332, 16384x2304x768
 * NT 0.0990 -> 0.0972, 16384x50304x768 NT 2.1657 -> 2.1118, bias+GELU
 * 16384x3072x768 NT 0.2208 -> 0.2006; and slower on every deeper one (8192^3
 * 1.5366 -> 1.7733, the K = 16384 dW shapes by about 30%): with few k-tiles
 * the per-tile epilogue that the other warpgroup's main loop hides is a large
 * share of a tile's time, with many it is not and the narrower tile's extra
 * shared-memory and L2 reads per flop dominate. Below a wave the
 * cooperative kernel's split-K and fewer, wider tiles stay. */
constexpr int kPPMaxKtiles = 12;
constexpr int kCandPingpong = 11; /* sm90_cands[kCandPingpong], the last */
static_assert(kCandPingpong == kCands - 1, "pingpong is the last candidate");

static int sm90_heuristic_pingpong(int tiles_m, int64_t N, int ktiles, int n_sm) {
  int64_t tiles = (int64_t)tiles_m * ((N + kBN / 2 - 1) / (kBN / 2));
  return ktiles <= kPPMaxKtiles && tiles >= n_sm;
}

/* Tile rows per raster group: the candidate's, or NABLA_GEMM_GROUP=n for
 * every candidate (read once; for measurements). The heuristic's is 8, but 2
 * for a grid of at least a wave of tiles (never split) at most 3 columns wide (N
 * <= 768: the dX = dY W products of GPT-2's qkv, fc and lm head layers, the
 * lm head's TN weight gradient): a CTA's tile then shares its A panel with
 * the CTAs a few ids away instead of 8 apart. On the H100 at the steady
 * clock (interleaved, bench/results/h100-2026-11-25-session23.md):
 * 16384x768x50304 NN 0.8-1.8% and 50304x768x16384 TN 2.2% faster than
 * groups of 8 in four and one calls; a group of 32 or 128 rows on the lm
 * head's NT forward cut its DRAM reads by two thirds and ran 10-14% slower. */
static int sm90_group_rows(int cand, int narrow) {
  static const char *e = getenv("NABLA_GEMM_GROUP");
  int g = e ? atoi(e) : 0;
  return g >= 1 ? g : narrow ? 2 : cand;
}

nb_sm90_sched nb_sm90_resolve(int i, int tiles_m, int64_t N, int ktiles, int n_sm) {
  if (i == 0 && sm90_heuristic_pingpong(tiles_m, N, ktiles, n_sm)) i = kCandPingpong;
  int pp = sm90_cands[i].pingpong, tiles_n = (int)((N + (pp ? kBN / 2 : kBN) - 1) / (pp ? kBN / 2 : kBN));
  int64_t tiles = (int64_t)tiles_m * tiles_n;
  nb_sm90_sched s;
  s.dp_tiles = 0;
  s.sk_ctas = 0;
  s.sk_heads = s.head_k = 0;
  s.sy = nb_sm90_sync();
  s.pingpong = pp;
  s.tiles_n = tiles_n;
  s.sk = sm90_cands[i].split == SM90_STREAM_K;
  if (s.sk) s.sk_ctas = n_sm;
  s.splits = sm90_cands[i].split == SM90_SPLIT_K ? sm90_splits(tiles, ktiles, n_sm) : 1;
  /* split-sync: its candidate, or the heuristic's split where its time model is shorter;
   * split-sync2 (in clusters of 2, given two tile rows and two SMs): over units of two
   * tile rows, a cluster each, on n_sm / 2 clusters */
  nb_sm90_sync y;
  const int sc = sm90_cands[i].split == SM90_SYNC && tiles_m >= 2 && n_sm >= 2 ? sm90_cands[i].cluster : 1;
  const int64_t su = (int64_t)((tiles_m + sc - 1) / sc) * tiles_n; /* the units split-sync plans over */
  int sync = sm90_cands[i].split == SM90_SYNC || s.splits > 1;
  if (sync) {
    double c = sm90_sync_plan(su, ktiles, n_sm / sc, &y);
    sync = c >= 0.0 && (s.splits == 1 || c < sm90_split_cost(tiles, ktiles, n_sm, s.splits));
  }
  if (sync) s.splits = 1;
  s.cluster = !s.sk && s.splits == 1 && tiles_m >= 2 && n_sm >= 2 ? sm90_cands[i].cluster : 1;
  /* a group of at least all the unit rows is one raster: column by column */
  int64_t rows = (tiles_m + s.cluster - 1) / s.cluster, units = rows * tiles_n;
  int narrow = i == 0 && tiles_n <= 3 && tiles >= n_sm; /* a wave or more: never split, no cluster */
  int g = sm90_group_rows(sm90_cands[i].group, narrow) / s.cluster;
  s.group = g < 1 ? 1 : g < rows ? g : (int)rows;
  if (s.cluster > 1) /* clusters of 2 CTAs, one per unit at most */
    s.grid = 2 * (units < n_sm / 2 ? units : n_sm / 2);
  else
    s.grid = s.sk ? n_sm
             : s.splits > 1 ? tiles * s.splits
             : tiles <= n_sm || (sm90_cands[i].per_tile && tiles <= INT32_MAX) ? tiles : n_sm;
  if (sm90_cands[i].split == SM90_DPSK) sm90_dpsk(&s, tiles, ktiles, n_sm);
  if (sm90_cands[i].split == SM90_SK_HEADS) sm90_sk_heads(&s, tiles_m, tiles, ktiles, n_sm);
  if (sync) { /* s.cluster == sc */
    sm90_split_sync(&s, y, su, ktiles, n_sm / sc);
    s.grid *= sc;
  }
  return s;
}

int nb_sm90_same(const nb_sm90_sched &a, const nb_sm90_sched &b) {
  return a.group == b.group && a.sk == b.sk && a.splits == b.splits && a.cluster == b.cluster &&
         a.grid == b.grid && a.dp_tiles == b.dp_tiles && a.sk_ctas == b.sk_ctas &&
         a.pingpong == b.pingpong && a.tiles_n == b.tiles_n && a.sk_heads == b.sk_heads && a.head_k == b.head_k &&
         a.sy.q == b.sy.q && a.sy.L == b.sy.L && a.sy.L2 == b.sy.L2;
}

int nb_sm90_args_ok(int i, int64_t rows, int64_t N, int64_t K, int bk, int n_sm) {
  return i >= 0 && i < kCands && rows >= 1 && N >= 1 && K >= 1 && n_sm >= 1 && rows <= INT32_MAX &&
         N <= INT32_MAX && K <= INT32_MAX && bk >= 1;
}

int nb_sm90_schedule_bk(int i, int64_t rows, int64_t N, int64_t K, int bk, int n_sm,
                        nb_gemm_own_schedule *out) {
  if (!nb_sm90_args_ok(i, rows, N, K, bk, n_sm)) return 0;
  int tiles_m = (int)((rows + kBM - 1) / kBM);
  nb_sm90_sched s = nb_sm90_resolve(i, tiles_m, N, (int)((K + bk - 1) / bk), n_sm);
  out->tiles = (int64_t)tiles_m * s.tiles_n;
  out->tile_n = s.pingpong ? kBN / 2 : kBN;
  out->grid = s.grid;
  out->splits = s.splits;
  out->stream_k = s.sk;
  out->cluster = s.cluster;
  out->group = s.group;
  out->dp_tiles = s.dp_tiles;
  out->sk_ctas = s.sk_ctas;
  out->sk_heads = s.sk_heads;
  out->head_k = s.head_k;
  out->sync_q = s.sy.q;
  out->sync_l = s.sy.L;
  out->sync_l2 = s.sy.L2;
  return 1;
}

int nb_sm90_schedule(int i, int64_t rows, int64_t N, int64_t K, int n_sm, nb_gemm_own_schedule *out) {
  return nb_sm90_schedule_bk(i, rows, N, K, kBK, n_sm, out);
}

static pthread_mutex_t sm90_occ_lock = PTHREAD_MUTEX_INITIALIZER;
static int sm90_occ[64]; /* per device; guarded by sm90_occ_lock */

int nb_sm90_max_clusters(const nb_cuda_ctx *ctx, const void *kern, const cudaLaunchConfig_t *cfg) {
  pthread_mutex_lock(&sm90_occ_lock);
  int *n = &sm90_occ[ctx->dev]; /* dev < 64: nb_sm90_device_ok */
  if (!*n && (cudaOccupancyMaxActiveClusters(n, kern, cfg) != cudaSuccess || *n < 1)) {
    cudaGetLastError();
    *n = ctx->n_sm / 2; /* one CTA per SM */
  }
  int r = *n;
  pthread_mutex_unlock(&sm90_occ_lock);
  return r;
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

/* Any column stride for one column; N for one row. */
int nb_sm90_ld(const nb_kview *v, int64_t M, int64_t N, int64_t *ld) {
  int od = v->ndim;
  if (!(v->strides[od - 1] == 1 || N == 1)) return 0;
  *ld = M == 1 ? N : v->strides[od - 2];
  return 1;
}

int nb_sm90_plan(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a, const nb_kview *b,
                 nb_sm90_problem *pr) {
  nb_dtype dt = a->dtype;
  if ((dt != NB_F16 && dt != NB_BF16) || b->dtype != dt) return 0;
  int od = out->ndim, nbd = od - 2;
  if (od < 2 || a->ndim != od || b->ndim != od || !nb_sm90_device_ok(ctx->dev)) return 0;
  int64_t M = out->shape[od - 2], N = out->shape[od - 1], K = a->shape[od - 1];
  int64_t sam = a->strides[od - 2], sak = a->strides[od - 1];
  int64_t sbk = b->strides[od - 2], sbn = b->strides[od - 1];
  for (int d = 0; d < nbd; d++) /* one B for every batch */
    if (out->shape[d] != 1 && b->strides[d] != 0) return 0;
  int ta = !(sak == 1 || K == 1);
  if (ta && sam != 1 && M != 1) return 0;
  int tb = !(sbk == 1 || K == 1);
  if (tb && sbn != 1 && N != 1) return 0;
  int64_t ldc = 0, rows = M, rows_a = M;
  if (!nb_sm90_ld(out, M, N, &ldc)) return 0;
  if (nbd > 0) {
    if (ta) { /* an MN-major A cannot absorb batches */
      for (int d = 0; d < nbd; d++)
        if (out->shape[d] != 1) return 0;
    } else if (!sm90_fold_rows(a, out->shape, nbd, M, M == 1 ? K : sam, &rows_a) ||
               !sm90_fold_rows(out, out->shape, nbd, M, ldc, &rows)) {
      return 0;
    }
  }
  if (rows != rows_a || rows > INT32_MAX || N > INT32_MAX || K > INT32_MAX) return 0;
  int ok = ta ? sm90_map(&pr->m.a, dt, a->data, rows, K, sak, 64, 64)
              : sm90_map(&pr->m.a, dt, a->data, K, rows, M == 1 ? K : sam, kBK, kBM);
  ok = ok && (tb ? sm90_map(&pr->m.b, dt, b->data, N, K, sbk, 64, 64)
                 : sm90_map(&pr->m.b, dt, b->data, K, N, N == 1 ? K : sbn, kBK, kBN / 2));
  pr->in = pr->in_b = dt;
  pr->scale_a = pr->scale_b = NULL;
  pr->ta = ta;
  pr->tb = tb;
  pr->rows = rows;
  pr->N = N;
  pr->K = K;
  pr->ldc = ldc;
  return ok;
}

/* The autotuning key's device: "NAME-132sm" (the name is read once). */
static pthread_mutex_t sm90_name_lock = PTHREAD_MUTEX_INITIALIZER;
static char sm90_names[64][80]; /* per device; guarded by sm90_name_lock */

void nb_sm90_device_label(const nb_cuda_ctx *ctx, char *buf, size_t cap) {
  pthread_mutex_lock(&sm90_name_lock);
  char *name = sm90_names[ctx->dev]; /* dev < 64: nb_sm90_device_ok */
  if (!name[0]) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, ctx->dev) == cudaSuccess)
      snprintf(name, sizeof sm90_names[0], "%.*s", (int)sizeof sm90_names[0] - 1, prop.name);
    else
      snprintf(name, sizeof sm90_names[0], "sm90");
    cudaGetLastError();
  }
  snprintf(buf, cap, "%s-%dsm", name, ctx->n_sm);
  pthread_mutex_unlock(&sm90_name_lock);
}
