/* The own sm_90a GEMM's schedule model (gemm_sm90.cu), on the host: which
 * launch each autotuning candidate makes for a product, through
 * nb_cuda_gemm_own_schedule (bf16/f16: k-tiles of 64) and
 * nb_cuda_scaled_mm_own_schedule (FP8: k-tiles of 128, the same
 * candidates and rules). Needs the CUDA backend compiled in, not a GPU.
 *
 * Checked against the rules that docs/ARCHITECTURE.md states, recomputed
 * here independently: tiles of 128 x 256; split-K only when the tiles fill
 * fewer than all SMs, with S minimising waves x ceil(ktiles / S) + 3 (S - 1)
 * over 1 <= S <= min(16, ktiles / 8) with (S - 1) tiles within the 2 slots
 * per SM, taking the fewest parts within 5% of the best, and split-sync
 * instead where its model (below) is shorter: the documented cases 768 x
 * 3072 x 16384 (split-K's 3 parts on 216 CTAs: one main of 143 k-tiles per
 * tile on 132) and 2304 x 768 x 16384 (2 parts: two mains of 107); each candidate's grid; clusters of 2 only with two tile rows;
 * dpsk: W = tiles / SMs full waves data-parallel, the r = tiles % SMs tail
 * tiles' k-iterations split over min(SMs, r ktiles / 4) CTAs, when that is
 * more than r (else data-parallel); sk-heads: with fewer tiles T than SMs P, T
 * head CTAs of head_k >= T kt / P k-tiles (leaving a rest of at least 4),
 * tile rows in groups of 1 when the rows are at least the columns in
 * elements, else all together, on P CTAs (else data-parallel); split-sync:
 * with T < P tiles not dividing P, P / T main parts of L >= T kt / P k-tiles
 * per tile on P CTAs, rests of at least 4 (else data-parallel); and every
 * CTA's walk (nb_cuda_gemm_own_walk) for the split candidates: each
 * (tile, k-tile) once, each partial in a slot of its own, taken in k order
 * by its tile's one head, which under the heuristic and split-sync is
 * numbered after every CTA whose partial it waits for; pingpong: 128 x 128 tiles (tile_n 128),
 * data-parallel on min(tiles, SMs) CTAs, groups of 8 tile rows; every other
 * candidate 128 x 256 (tile_n 256), except that the heuristic (candidate 0)
 * launches what pingpong does when a tile has at most 12 k-tiles (bf16 K <=
 * 768, FP8 K <= 1536) and the 128 x 128 tiles are at least as many as the
 * SMs, any layout. */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_gemm.h"

enum { DEFAULT, GROUP4, GROUP16, DATA_PARALLEL, STREAM_K, CTA_PER_TILE, CLUSTER2, DPSK, SK_HEADS, SPLIT_SYNC,
       SPLIT_SYNC2, PINGPONG, LAST = PINGPONG };

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The documented split-K cost and choice, written out again. */
static double cost(int64_t tiles, int64_t kt, int n_sm, int64_t s) {
  return (double)(cdiv(tiles * s, n_sm) * cdiv(kt, s)) + 3.0 * (double)(s - 1);
}
static int splits(int64_t tiles, int64_t kt, int n_sm) {
  if (tiles >= n_sm) return 1;
  int64_t top = kt / 8 < 16 ? kt / 8 : 16;
  while (top > 1 && (top - 1) * tiles > 2 * (int64_t)n_sm) top--;
  double best = cost(tiles, kt, n_sm, 1);
  for (int64_t s = 2; s <= top; s++)
    if (cost(tiles, kt, n_sm, s) < best) best = cost(tiles, kt, n_sm, s);
  for (int64_t s = 1; s <= top; s++)
    if (cost(tiles, kt, n_sm, s) <= 1.05 * best) return (int)s;
  return 1;
}

/* The documented split-sync time model, written out again: q = P / T mains of L per tile, E = P
 * - q T spares with a = T / E whole rests each, the left = T - a E tiles' rests in n = E / left
 * pieces and their mains L - 3 (n - 1); the best L from the even share up, or -1. */
static double sync_cost(int64_t T, int64_t kt, int P, int64_t *bestL) {
  if (T < 1 || T >= P || P % T == 0) return -1.0;
  int64_t q = P / T, E = P - q * T, a = T / E, left = T - a * E, n = left ? E / left : 0;
  double best = -1.0;
  for (int64_t L = cdiv(T * kt, P); L * q < kt && L < cdiv(T * kt, P) + 512; L++) {
    int64_t L2 = left ? L - 3 * (n - 1) : L, R = kt - q * L, R2 = kt - q * L2;
    if (L2 < 1 || R < 4 || (left && R2 < 4 * n)) continue;
    double piece = left ? (double)cdiv(R2, n) + 3.0 : 0.0, spare = piece + (double)a * (double)(R + 3);
    double main = (double)L + (q > 1 ? 3.0 : 0.0), normal = (main > spare ? main : spare) + 3.0 * (double)q;
    double late = (double)L2 > piece ? (double)L2 : piece, lo = left ? late + 3.0 * (double)(q - 1 + n) : 0.0;
    double c = normal > lo ? normal : lo;
    if (best < 0.0 || c < best) best = c, *bestL = L;
  }
  return best;
}

/* f8: the FP8 product's schedule (nb_scaled_mm) */
static nb_gemm_own_schedule sched_of(int f8, int cand, int64_t M, int64_t N, int64_t K, int n_sm) {
  nb_gemm_own_schedule s = {0};
  int ok = f8 ? nb_cuda_scaled_mm_own_schedule(cand, M, N, K, n_sm, &s)
              : nb_cuda_gemm_own_schedule(cand, M, N, K, n_sm, &s);
  NBT_CHECK(ok, "%sschedule %d %lldx%lldx%lld on %d SMs", f8 ? "fp8 " : "", cand, (long long)M, (long long)N,
            (long long)K, n_sm);
  return s;
}
static nb_gemm_own_schedule sched(int cand, int64_t M, int64_t N, int64_t K, int n_sm) {
  return sched_of(0, cand, M, N, K, n_sm);
}
static nb_gemm_own_schedule sched8(int cand, int64_t M, int64_t N, int64_t K, int n_sm) {
  return sched_of(1, cand, M, N, K, n_sm);
}

/* Every candidate on one problem against the rules (f8: FP8, 128-deep k-tiles). */
static void check_rules_of(int f8, int64_t M, int64_t N, int64_t K, int n_sm) {
  int64_t tm = cdiv(M, 128), tn = cdiv(N, 256), tiles = tm * tn, kt = cdiv(K, f8 ? 128 : 64);
  char what[96];
  snprintf(what, sizeof what, "%s%lldx%lldx%lld on %d SMs", f8 ? "fp8 " : "", (long long)M, (long long)N,
           (long long)K, n_sm);
  int64_t pt_tiles = tm * cdiv(N, 128);
  int heur_pp = kt <= 12 && pt_tiles >= n_sm; /* the heuristic takes the ping-pong kernel */
  for (int c = DEFAULT; c <= GROUP16; c++) { /* split-K as the heuristic */
    if (c == DEFAULT && heur_pp) continue; /* below, with pingpong */
    nb_gemm_own_schedule s = sched_of(f8, c, M, N, K, n_sm);
    int S = splits(tiles, kt, n_sm), sync = 0;
    int64_t L = 0;
    if (S > 1) { /* split-sync where its model is shorter */
      double y = sync_cost(tiles, kt, n_sm, &L);
      if (y >= 0.0 && y < cost(tiles, kt, n_sm, S)) S = 1, sync = 1;
    }
    NBT_CHECK(s.tiles == tiles && s.splits == S && !s.stream_k && s.cluster == 1 &&
                  (sync ? s.sync_q == n_sm / tiles && s.sync_l == L : s.sync_q == 0),
              "%s cand %d: %lld tiles (want %lld), %d parts (want %d), split-sync %d of %d (want %d of %lld)", what,
              c, (long long)s.tiles, (long long)tiles, s.splits, S, s.sync_q, s.sync_l, sync, (long long)L);
    int64_t grid = sync ? n_sm : S > 1 ? tiles * S : tiles < n_sm ? tiles : n_sm;
    NBT_CHECK(s.grid == grid, "%s cand %d: grid %lld, want %lld", what, c, (long long)s.grid, (long long)grid);
    /* the heuristic's narrow grids (at most 3 tile columns, a wave, unsplit): groups of 2 */
    int g = c == GROUP4 ? 4 : c == GROUP16 ? 16 : c == DEFAULT && S == 1 && !sync && tn <= 3 && tiles >= n_sm ? 2 : 8;
    NBT_CHECK(s.group == (g < tm ? g : tm), "%s cand %d: group %d", what, c, s.group);
  }
  nb_gemm_own_schedule dp = sched_of(f8, DATA_PARALLEL, M, N, K, n_sm);
  NBT_CHECK(dp.splits == 1 && dp.grid == (tiles < n_sm ? tiles : n_sm), "%s data-parallel grid %lld", what,
            (long long)dp.grid);
  nb_gemm_own_schedule sk = sched_of(f8, STREAM_K, M, N, K, n_sm);
  NBT_CHECK(sk.stream_k && sk.splits == 1 && sk.grid == n_sm && sk.dp_tiles == 0 && sk.sk_ctas == n_sm,
            "%s stream-k", what);
  for (int c = heur_pp ? GROUP4 : DEFAULT; c < PINGPONG; c++)
    NBT_CHECK(sched_of(f8, c, M, N, K, n_sm).tile_n == 256, "%s cand %d: 256-wide tiles", what, c);
  nb_gemm_own_schedule pp = sched_of(f8, PINGPONG, M, N, K, n_sm);
  NBT_CHECK(pp.tile_n == 128 && pp.tiles == pt_tiles && pp.splits == 1 && !pp.stream_k && pp.cluster == 1 &&
                pp.grid == (pt_tiles < n_sm ? pt_tiles : n_sm) && pp.group == (8 < tm ? 8 : tm),
            "%s pingpong: %lld tiles of 128 x %d (want %lld), grid %lld", what, (long long)pp.tiles, pp.tile_n,
            (long long)pt_tiles, (long long)pp.grid);
  if (heur_pp) {
    nb_gemm_own_schedule h0 = sched_of(f8, DEFAULT, M, N, K, n_sm);
    NBT_CHECK(h0.tile_n == 128 && h0.tiles == pt_tiles && h0.splits == 1 && !h0.stream_k && h0.cluster == 1 &&
                  h0.grid == n_sm && h0.group == pp.group && h0.dp_tiles == 0 && h0.sk_ctas == 0,
              "%s heuristic, %lld k-tiles and %lld tiles of 128 x 128: the ping-pong launch (tile_n %d, %lld "
              "tiles, grid %lld)",
              what, (long long)kt, (long long)pt_tiles, h0.tile_n, (long long)h0.tiles, (long long)h0.grid);
  }
  nb_gemm_own_schedule h = sched_of(f8, DPSK, M, N, K, n_sm);
  int64_t waves = tiles / n_sm, r = tiles % n_sm, ctas = r * kt / 4 < n_sm ? r * kt / 4 : n_sm;
  NBT_CHECK(h.tiles == tiles && h.splits == 1 && h.cluster == 1 && h.group == (8 < tm ? 8 : tm), "%s dpsk", what);
  if (r == 0 || ctas <= r)
    NBT_CHECK(!h.stream_k && h.grid == dp.grid && h.dp_tiles == 0 && h.sk_ctas == 0,
              "%s dpsk without a tail to split: data-parallel (grid %lld)", what, (long long)h.grid);
  else
    NBT_CHECK(h.stream_k && h.dp_tiles == waves * n_sm && h.sk_ctas == ctas && h.grid == (waves ? n_sm : ctas),
              "%s dpsk: %lld tiles data-parallel (want %lld), tail over %d CTAs (want %lld), grid %lld", what,
              (long long)h.dp_tiles, (long long)(waves * n_sm), h.sk_ctas, (long long)ctas, (long long)h.grid);
  /* sk-heads: with fewer tiles than SMs, one head CTA per tile over its first head_k k-tiles,
   * head_k at least the even share T kt / P and leaving at least 4 k-tiles of rest; else
   * data-parallel */
  nb_gemm_own_schedule sh = sched_of(f8, SK_HEADS, M, N, K, n_sm);
  int64_t lo = cdiv(tiles * kt, n_sm);
  if (tiles < n_sm && lo <= kt - 4)
    NBT_CHECK(sh.stream_k && sh.sk_heads == tiles && sh.head_k >= lo && sh.head_k <= kt - 4 && sh.grid == n_sm &&
                  sh.sk_ctas == n_sm && sh.splits == 1 && sh.cluster == 1 &&
                  sh.group == (tm * 128 >= tn * 256 ? 1 : tm),
              "%s sk-heads: %d heads of %d k-tiles (share %lld of %lld), grid %lld", what, sh.sk_heads, sh.head_k,
              (long long)lo, (long long)kt, (long long)sh.grid);
  else
    NBT_CHECK(!sh.stream_k && sh.sk_heads == 0 && sh.grid == dp.grid, "%s sk-heads: data-parallel", what);
  /* split-sync: with T < P tiles not dividing P, q = P / T main parts per tile of L >= T kt / P
   * k-tiles on P CTAs, a rest of at least 4 (the leftover tiles' mains L2 <= L); else
   * data-parallel (the walk is checked below) */
  nb_gemm_own_schedule sy = sched_of(f8, SPLIT_SYNC, M, N, K, n_sm);
  if (sy.sync_q)
    NBT_CHECK(tiles < n_sm && n_sm % tiles != 0 && sy.sync_q == n_sm / tiles && sy.sync_l >= lo &&
                  sy.sync_q * sy.sync_l <= kt - 4 && sy.sync_l2 >= 1 && sy.sync_l2 <= sy.sync_l &&
                  sy.grid == n_sm && !sy.stream_k && sy.splits == 1 && sy.cluster == 1,
              "%s split-sync: %d mains of %d (%d) k-tiles (share %lld of %lld), grid %lld", what, sy.sync_q,
              sy.sync_l, sy.sync_l2, (long long)lo, (long long)kt, (long long)sy.grid);
  else
    NBT_CHECK(sy.grid == dp.grid && sy.splits == 1 && !sy.stream_k, "%s split-sync: data-parallel", what);
  nb_gemm_own_schedule pt = sched_of(f8, CTA_PER_TILE, M, N, K, n_sm);
  NBT_CHECK(pt.grid == tiles, "%s cta-per-tile grid %lld", what, (long long)pt.grid);
  nb_gemm_own_schedule cl = sched_of(f8, CLUSTER2, M, N, K, n_sm);
  int64_t units = cdiv(tm, 2) * tn;
  if (tm >= 2 && n_sm >= 2)
    NBT_CHECK(cl.cluster == 2 && cl.grid % 2 == 0 && cl.grid == 2 * (units < n_sm / 2 ? units : n_sm / 2),
              "%s cluster2: cluster %d grid %lld", what, cl.cluster, (long long)cl.grid);
  else
    NBT_CHECK(cl.cluster == 1 && cl.grid == dp.grid, "%s cluster2 with one tile row or one SM: unclustered", what);
  /* split-sync2: split-sync over units of two tile rows on n_sm / 2 clusters of 2; with one
   * tile row split-sync's launch; where it does not apply, cluster2's */
  nb_gemm_own_schedule y2 = sched_of(f8, SPLIT_SYNC2, M, N, K, n_sm);
  int64_t ulo = n_sm >= 2 ? cdiv(units * kt, n_sm / 2) : 0;
  if (tm < 2 || n_sm < 2) {
    NBT_CHECK(y2.cluster == 1 && y2.grid == sy.grid && y2.sync_q == sy.sync_q && y2.sync_l == sy.sync_l,
              "%s split-sync2 with one tile row or SM: split-sync's launch", what);
  } else {
    /* the layout split-sync plans for ceil(tm / 2) tile rows on n_sm / 2 SMs, or none */
    nb_gemm_own_schedule u = sched_of(f8, SPLIT_SYNC, cdiv(tm, 2) * 128, N, K, n_sm / 2);
    NBT_CHECK(y2.sync_q == u.sync_q && y2.sync_l == u.sync_l && y2.sync_l2 == u.sync_l2,
              "%s split-sync2: %d mains of %d (%d), split-sync's for %lld tile rows on %d SMs %d of %d (%d)", what,
              y2.sync_q, y2.sync_l, y2.sync_l2, (long long)cdiv(tm, 2), n_sm / 2, u.sync_q, u.sync_l, u.sync_l2);
    if (y2.sync_q)
      NBT_CHECK(y2.cluster == 2 && units < n_sm / 2 && (n_sm / 2) % units != 0 &&
                    y2.sync_q == (n_sm / 2) / units && y2.sync_l >= ulo && y2.sync_q * y2.sync_l <= kt - 4 &&
                    y2.grid == 2 * (n_sm / 2) && y2.splits == 1 && !y2.stream_k,
                "%s split-sync2: %d mains of %d k-tiles per unit (share %lld), grid %lld", what, y2.sync_q,
                y2.sync_l, (long long)ulo, (long long)y2.grid);
    else
      NBT_CHECK(y2.cluster == 2 && y2.grid == cl.grid && y2.splits == 1 && !y2.stream_k,
                "%s split-sync2: cluster2's launch", what);
  }
}
/* Candidate cand's walk over every CTA (the cooperative kernel's segments,
 * nb_cuda_gemm_own_walk): each (tile, k-tile) exactly once; whole tiles
 * whole; every partial in a workspace slot (2 per SM) of its own, and taken
 * by its tile's one head, in k order, which together cover the tile. */
static void check_walk(int cand, int64_t M, int64_t N, int64_t K, int n_sm) {
  nb_gemm_own_schedule s = sched(cand, M, N, K, n_sm);
  int64_t kt = cdiv(K, 64), tiles = s.tiles;
  if (s.tile_n != 256 || (s.cluster != 1 && cand != SPLIT_SYNC2) || tiles * kt > ((int64_t)1 << 24)) return;
  char what[96];
  snprintf(what, sizeof what, "walk %s %lldx%lldx%lld on %d SMs", nb_cuda_gemm_own_candidate(cand), (long long)M,
           (long long)N, (long long)K, n_sm);
  unsigned char *cov = calloc((size_t)(tiles * kt), 1);
  int *head = malloc(sizeof(int) * (size_t)tiles), nslot = 2 * n_sm, bad = 0;
  int *slot_tile = malloc(sizeof(int) * (size_t)nslot), *slot_kb = malloc(sizeof(int) * (size_t)nslot);
  int *slot_cta = malloc(sizeof(int) * (size_t)nslot), *tk_cta = malloc(sizeof(int) * 16);
  int *puts = calloc((size_t)tiles, sizeof(int)), cap = 64;
  nb_gemm_own_segment *seg = malloc(sizeof *seg * (size_t)cap);
  for (int64_t t = 0; t < tiles; t++) head[t] = -1;
  for (int i = 0; i < nslot; i++) slot_tile[i] = -1;
  /* heads' takes, checked after all puts are known: (tile, slots) */
  int ntk = 0, tk_cap = 16;
  nb_gemm_own_segment *tk = malloc(sizeof *tk * (size_t)tk_cap);
  for (int64_t c = 0; c < s.grid && !bad; c++) {
    int n = nb_cuda_gemm_own_walk(cand, M, N, K, n_sm, (int)c, seg, cap);
    if (n > cap) {
      cap = n;
      seg = realloc(seg, sizeof *seg * (size_t)cap);
      n = nb_cuda_gemm_own_walk(cand, M, N, K, n_sm, (int)c, seg, cap);
    }
    NBT_CHECK(n >= 0, "%s: CTA %lld walks", what, (long long)c);
    for (int i = 0; i < n && !bad; i++) {
      nb_gemm_own_segment *g = &seg[i];
      if (!(g->tile >= 0 && g->tile < tiles && g->kb >= 0 && g->kb < g->ke && g->ke <= kt)) {
        NBT_CHECK(0, "%s: CTA %lld segment %d: tile %d k [%d, %d)", what, (long long)c, i, g->tile, g->kb, g->ke);
        bad = 1;
        break;
      }
      for (int k = g->kb; k < g->ke; k++) cov[(int64_t)g->tile * kt + k]++;
      if (g->role == 0) {
        if (g->kb != 0 || g->ke != kt) {
          NBT_CHECK(0, "%s: a whole tile of k [%d, %d)", what, g->kb, g->ke);
          bad = 1;
        }
      } else if (g->role == 1) {
        if (g->slot < 0 || g->slot >= nslot || slot_tile[g->slot] >= 0) {
          NBT_CHECK(0, "%s: CTA %lld puts tile %d into slot %d (used by tile %d)", what, (long long)c, g->tile,
                    g->slot, g->slot >= 0 && g->slot < nslot ? slot_tile[g->slot] : -2);
          bad = 1;
        } else {
          slot_tile[g->slot] = g->tile, slot_kb[g->slot] = g->kb, slot_cta[g->slot] = (int)c, puts[g->tile]++;
        }
      } else {
        if ((g->kb == 0 && g->ke == kt) || head[g->tile] >= 0) {
          NBT_CHECK(0, "%s: tile %d's head k [%d, %d), a head before: %d", what, g->tile, g->kb, g->ke, head[g->tile]);
          bad = 1;
        }
        head[g->tile] = (int)c;
        if (ntk == tk_cap) {
          tk = realloc(tk, sizeof *tk * (size_t)(tk_cap *= 2));
          tk_cta = realloc(tk_cta, sizeof *tk_cta * (size_t)tk_cap);
        }
        tk_cta[ntk] = (int)c;
        tk[ntk++] = *g;
      }
    }
  }
  int64_t holes = 0;
  for (int64_t i = 0; i < tiles * kt; i++) holes += cov[i] != 1;
  NBT_CHECK(!bad && holes == 0, "%s: %lld (tile, k-tile) pairs not covered exactly once", what, (long long)holes);
  for (int i = 0; i < ntk && !bad; i++) {
    const nb_gemm_own_segment *g = &tk[i];
    int ok = g->ntakes == puts[g->tile] && g->ntakes > 0, kb = -1;
    for (int j = 0; j < g->ntakes && j < NB_GEMM_OWN_TAKES && ok; j++) {
      int sl = g->takes[j];
      ok = sl >= 0 && sl < nslot && slot_tile[sl] == g->tile && slot_kb[sl] > kb;
      if (ok) kb = slot_kb[sl];
    }
    NBT_CHECK(ok, "%s: tile %d's head takes %d partials in k order (%d put)", what, g->tile, g->ntakes, puts[g->tile]);
    /* the heuristic's splits and split-sync: a head waits only on CTAs launched before it */
    for (int j = 0; ok && (cand == DEFAULT || cand == SPLIT_SYNC || cand == SPLIT_SYNC2) && j < g->ntakes &&
                    j < NB_GEMM_OWN_TAKES;
         j++)
      if (slot_cta[g->takes[j]] >= tk_cta[i]) {
        NBT_CHECK(0, "%s: tile %d's head (CTA %d) waits on CTA %d", what, g->tile, tk_cta[i], slot_cta[g->takes[j]]);
        break;
      }
  }
  for (int64_t t = 0; t < tiles && !bad; t++)
    if (puts[t]) NBT_CHECK(head[t] >= 0, "%s: tile %lld has partials and a head", what, (long long)t);
  free(cov), free(head), free(slot_tile), free(slot_kb), free(slot_cta), free(puts), free(seg), free(tk), free(tk_cta);
}

static void check_rules(int64_t M, int64_t N, int64_t K, int n_sm) {
  check_rules_of(0, M, N, K, n_sm);
  check_rules_of(1, M, N, K, n_sm);
  const int walked[] = {DEFAULT, DATA_PARALLEL, STREAM_K, CTA_PER_TILE, DPSK, SK_HEADS, SPLIT_SYNC, SPLIT_SYNC2};
  for (size_t i = 0; i < sizeof walked / sizeof *walked; i++) check_walk(walked[i], M, N, K, n_sm);
}

static void test_documented(void) {
  nb_gemm_own_schedule s = sched(DEFAULT, 768, 3072, 16384, 132);
  NBT_CHECK(s.tiles == 72 && s.splits == 1 && s.sync_q == 1 && s.sync_l == 143 && s.grid == 132,
            "768x3072x16384: 72 tiles, split-sync (model 147 k-tiles against split-K's 3 parts, 178)");
  s = sched(DEFAULT, 2304, 768, 16384, 132);
  NBT_CHECK(s.tiles == 54 && s.splits == 1 && s.sync_q == 2 && s.sync_l == 107 && s.grid == 132,
            "2304x768x16384: 54 tiles, split-sync (116 against split-K's 2 parts, 131)");
  s = sched(DEFAULT, 1000, 520, 4136, 132);
  NBT_CHECK(s.tiles == 24 && s.splits == 4, "1000x520x4136: 24 tiles, 4 parts (the gemm tune case)");
  s = sched(DEFAULT, 4096, 4096, 4096, 132);
  NBT_CHECK(s.tiles == 512 && s.splits == 1 && s.grid == 132 && s.cluster == 1, "4096^3: persistent, unsplit");
  s = sched(CLUSTER2, 4096, 4096, 4096, 132);
  NBT_CHECK(s.cluster == 2 && s.grid == 132 && s.group == 4, "4096^3 cluster2: 66 pairs, groups of 4 pair rows");
  s = sched(DEFAULT, 16384, 768, 64, 132);
  NBT_CHECK(s.splits == 1, "one k-tile: never split");
  /* narrow outputs (3 tile columns, a wave or more): the heuristic's groups of 2; group4 keeps 4 */
  s = sched(DEFAULT, 16384, 768, 50304, 132);
  NBT_CHECK(s.tiles == 384 && s.splits == 1 && s.grid == 132 && s.group == 2, "16384x768x50304: groups of 2");
  s = sched(DEFAULT, 50304, 768, 16384, 132);
  NBT_CHECK(s.tiles == 1179 && s.group == 2, "50304x768x16384: groups of 2");
  s = sched(GROUP4, 16384, 768, 50304, 132);
  NBT_CHECK(s.group == 4, "16384x768x50304 group4: groups of 4");
  s = sched(DEFAULT, 16384, 1024, 50304, 132);
  NBT_CHECK(s.group == 8, "16384x1024x50304 (4 tile columns): groups of 8");
  /* FP8 (nb_scaled_mm): 8192^3 is 2048 tiles of 64 k-tiles, 15.5 waves on 132 SMs */
  s = sched8(DEFAULT, 8192, 8192, 8192, 132);
  NBT_CHECK(s.tiles == 2048 && s.splits == 1 && !s.stream_k && s.cluster == 1 && s.grid == 132 && s.group == 8,
            "fp8 8192^3: persistent, unsplit, groups of 8");
  nb_gemm_own_schedule s8;
  s = sched8(STREAM_K, 8192, 8192, 8192, 132);
  NBT_CHECK(s.stream_k && s.grid == 132, "fp8 8192^3 stream-k: 132 CTAs");
  s = sched8(CLUSTER2, 8192, 8192, 8192, 132);
  NBT_CHECK(s.cluster == 2 && s.grid == 132 && s.group == 4, "fp8 8192^3 cluster2: 66 pairs, groups of 4");
  s = sched8(CTA_PER_TILE, 8192, 8192, 8192, 132);
  NBT_CHECK(s.grid == 2048, "fp8 8192^3 cta-per-tile: 2048 CTAs");
  /* dpsk: 8192^3 is 15 full waves (1980 tiles) and 68 tail tiles of 128 k-tiles over 132 CTAs
   * (bf16; FP8's 64 k-tiles the same); 2176 x 2304 x 520: 153 tiles, 21 tail tiles of 9
   * k-tiles over 47 CTAs; 768 x 3072 x 16384: no full wave, 72 tiles over 132 CTAs (stream-k's
   * launch); 1024 x 1024 x 64: one k-tile, nothing to split */
  s = sched(DPSK, 8192, 8192, 8192, 132);
  NBT_CHECK(s.stream_k && s.dp_tiles == 1980 && s.sk_ctas == 132 && s.grid == 132, "8192^3 dpsk: 1980 + 68 tiles");
  s8 = sched8(DPSK, 8192, 8192, 8192, 132);
  NBT_CHECK(s8.stream_k && s8.dp_tiles == 1980 && s8.sk_ctas == 132 && s8.grid == 132, "fp8 8192^3 dpsk");
  s = sched(DPSK, 2176, 2304, 520, 132);
  NBT_CHECK(s.stream_k && s.dp_tiles == 132 && s.sk_ctas == 47 && s.grid == 132, "2176x2304x520 dpsk: 47 CTAs (%d)",
            s.sk_ctas);
  s = sched(DPSK, 768, 3072, 16384, 132);
  nb_gemm_own_schedule k = sched(STREAM_K, 768, 3072, 16384, 132);
  NBT_CHECK(s.stream_k && s.dp_tiles == 0 && s.sk_ctas == 132 && s.grid == 132 && k.grid == s.grid &&
                k.sk_ctas == s.sk_ctas && k.dp_tiles == s.dp_tiles,
            "768x3072x16384 dpsk: stream-k's launch");
  /* sk-heads on the weight gradients: 72 tiles of 256 k-tiles (3072 x 768 x 16384) on 132 SMs,
   * the even share 140 k-tiles; 54 tiles (2304 x 768 x 16384), share 105 */
  s = sched(SK_HEADS, 3072, 768, 16384, 132);
  NBT_CHECK(s.stream_k && s.sk_heads == 72 && s.head_k >= 140 && s.head_k < 160 && s.grid == 132,
            "3072x768x16384 sk-heads: 72 heads of %d k-tiles", s.head_k);
  s = sched(SK_HEADS, 2304, 768, 16384, 132);
  NBT_CHECK(s.stream_k && s.sk_heads == 54 && s.head_k >= 105 && s.head_k < 130 && s.grid == 132,
            "2304x768x16384 sk-heads: 54 heads of %d k-tiles", s.head_k);
  s = sched(DPSK, 1024, 1024, 64, 132);
  NBT_CHECK(!s.stream_k && s.grid == 32, "1024x1024x64 dpsk: one k-tile, data-parallel");
  /* split-sync on the weight gradients (the layouts its planner's comment works out): 72 tiles
   * of 256 k-tiles, one main of 143 per tile (131 for the 12 whose rests go in 5 pieces); 54
   * tiles, two mains of 107 (98); 2048^3 (128 tiles of 32 k-tiles: no room for rests) none */
  s = sched(SPLIT_SYNC, 3072, 768, 16384, 132);
  NBT_CHECK(s.sync_q == 1 && s.sync_l == 143 && s.sync_l2 == 131 && s.grid == 132,
            "3072x768x16384 split-sync: q %d, L %d, L2 %d", s.sync_q, s.sync_l, s.sync_l2);
  s = sched(SPLIT_SYNC, 2304, 768, 16384, 132);
  NBT_CHECK(s.sync_q == 2 && s.sync_l == 107 && s.sync_l2 == 98 && s.grid == 132,
            "2304x768x16384 split-sync: q %d, L %d, L2 %d", s.sync_q, s.sync_l, s.sync_l2);
  s = sched(SPLIT_SYNC, 2048, 2048, 2048, 132);
  NBT_CHECK(s.sync_q == 0 && s.grid == 128, "2048^3 split-sync: data-parallel");
  /* split-sync2 on 3072 x 768 x 16384: 36 units of two tile rows on 66 clusters */
  s = sched(SPLIT_SYNC2, 3072, 768, 16384, 132);
  NBT_CHECK(s.sync_q == 1 && s.cluster == 2 && s.grid == 132, "3072x768x16384 split-sync2: q %d, cluster %d",
            s.sync_q, s.cluster);
  /* pingpong: the fc forward 16384 x 3072 x 768 is 128 x 24 = 3072 tiles of 128 x 128 on 132 CTAs */
  s = sched(PINGPONG, 16384, 3072, 768, 132);
  NBT_CHECK(s.tiles == 3072 && s.tile_n == 128 && s.grid == 132 && s.splits == 1 && !s.stream_k && s.group == 8,
            "16384x3072x768 pingpong: 3072 tiles of 128 x 128, 132 CTAs");
  s8 = sched8(PINGPONG, 300, 700, 1024, 132);
  NBT_CHECK(s8.tiles == 18 && s8.tile_n == 128 && s8.grid == 18 && s8.group == 3, "fp8 300x700x1024 pingpong: 18 tiles");
  /* the heuristic's kernel: ping-pong at most 12 k-tiles deep with at least a wave of 128 x 128
   * tiles (the measured K = 768 training shapes, fused epilogues alike: the epilogue's view
   * does not enter the schedule); cooperative one k-tile deeper or a tile short of a wave */
  s = sched(DEFAULT, 16384, 3072, 768, 132);
  NBT_CHECK(s.tile_n == 128 && s.tiles == 3072 && s.grid == 132 && s.splits == 1 && !s.stream_k,
            "16384x3072x768 heuristic: pingpong, 3072 tiles (tile_n %d)", s.tile_n);
  s = sched(DEFAULT, 16384, 2304, 768, 132);
  NBT_CHECK(s.tile_n == 128 && s.tiles == 2304, "16384x2304x768 heuristic: pingpong (tile_n %d)", s.tile_n);
  s = sched(DEFAULT, 16384, 50304, 768, 132);
  NBT_CHECK(s.tile_n == 128 && s.tiles == 128 * 393, "16384x50304x768 heuristic: pingpong (tile_n %d)", s.tile_n);
  s = sched(DEFAULT, 16384, 3072, 769, 132);
  NBT_CHECK(s.tile_n == 256 && s.tiles == 1536 && s.grid == 132, "16384x3072x769 (13 k-tiles) heuristic: cooperative");
  const int64_t coop[][3] = {{16384, 768, 3072}, {16384, 768, 2304}, {2304, 768, 16384}, {768, 3072, 16384},
                             {8192, 8192, 8192}, {4096, 4096, 4096},  {2048, 2048, 2048}, {16384, 768, 50304}};
  for (size_t i = 0; i < sizeof coop / sizeof *coop; i++)
    NBT_CHECK(sched(DEFAULT, coop[i][0], coop[i][1], coop[i][2], 132).tile_n == 256 &&
                  sched8(DEFAULT, coop[i][0], coop[i][1], coop[i][2], 132).tile_n == 256,
              "%lldx%lldx%lld heuristic: cooperative (more than 12 k-tiles)", (long long)coop[i][0],
              (long long)coop[i][1], (long long)coop[i][2]);
  s = sched(DEFAULT, 1408, 1536, 768, 132); /* 11 x 12 = 132 tiles: one wave */
  NBT_CHECK(s.tile_n == 128 && s.tiles == 132 && s.grid == 132, "1408x1536x768 heuristic: pingpong, one wave");
  s = sched(DEFAULT, 1408, 1408, 768, 132); /* 11 x 11 = 121 tiles: short of a wave */
  NBT_CHECK(s.tile_n == 256 && s.tiles == 66, "1408x1408x768 heuristic: cooperative (121 tiles of 128 x 128)");
  s8 = sched8(DEFAULT, 16384, 3072, 1536, 132); /* FP8: 12 k-tiles of 128 */
  NBT_CHECK(s8.tile_n == 128 && s8.tiles == 3072, "fp8 16384x3072x1536 heuristic: pingpong (tile_n %d)", s8.tile_n);
  s8 = sched8(DEFAULT, 16384, 3072, 1537, 132);
  NBT_CHECK(s8.tile_n == 256, "fp8 16384x3072x1537 (13 k-tiles) heuristic: cooperative");
  /* the k-tile depth matters: 9 tiles over K = 1024 are 16 bf16 k-tiles (2 parts) but 8
   * FP8 ones (parts of at least 8 k-tiles: none) */
  s = sched(DEFAULT, 300, 700, 1024, 132);
  s8 = sched8(DEFAULT, 300, 700, 1024, 132);
  NBT_CHECK(s.tiles == 9 && s.splits == 2 && s8.tiles == 9 && s8.splits == 1 && s8.grid == 9,
            "300x700x1024: bf16 2 parts (%d), fp8 unsplit (%d, grid %lld)", s.splits, s8.splits,
            (long long)s8.grid);
  s8 = sched8(DEFAULT, 768, 3072, 16384, 132); /* 72 tiles of 128 k-tiles: split-sync as bf16's 256 */
  NBT_CHECK(s8.tiles == 72 && s8.splits == 1 && s8.sync_q == 1 && s8.sync_l == 74 && s8.grid == 132,
            "fp8 768x3072x16384: split-sync, one main of %d k-tiles", s8.sync_l);
  /* an FP8 product of K has the schedule of a 16-bit one of K/2 rounded up (same k-tiles) */
  const int64_t ks[] = {1, 16, 130, 1040, 4136, 16384, 40001};
  for (int c = DEFAULT; c <= LAST; c++)
    for (size_t k = 0; k < sizeof ks / sizeof *ks; k++) {
      nb_gemm_own_schedule a = sched8(c, 1000, 520, ks[k], 132), b = sched(c, 1000, 520, cdiv(ks[k], 2), 132);
      NBT_CHECK(a.tiles == b.tiles && a.grid == b.grid && a.splits == b.splits && a.stream_k == b.stream_k &&
                    a.cluster == b.cluster && a.group == b.group && a.dp_tiles == b.dp_tiles && a.sk_ctas == b.sk_ctas &&
                    a.sk_heads == b.sk_heads && a.head_k == b.head_k && a.sync_q == b.sync_q &&
                    a.sync_l == b.sync_l && a.sync_l2 == b.sync_l2 && a.tile_n == b.tile_n,
                "fp8 1000x520x%lld cand %d: the schedule of bf16 K = %lld", (long long)ks[k], c,
                (long long)cdiv(ks[k], 2));
    }
}

static void test_bad(void) {
  nb_gemm_own_schedule s;
  NBT_CHECK(!nb_cuda_gemm_own_schedule(-1, 8, 8, 8, 132, &s), "candidate -1");
  NBT_CHECK(!nb_cuda_gemm_own_schedule(1000, 8, 8, 8, 132, &s), "candidate past the last");
  NBT_CHECK(nb_cuda_gemm_own_candidate(LAST) && !nb_cuda_gemm_own_candidate(LAST + 1),
            "the candidates this test knows are all there are");
  NBT_CHECK(!nb_cuda_gemm_own_schedule(0, 0, 8, 8, 132, &s) && !nb_cuda_gemm_own_schedule(0, 8, 8, 8, 0, &s) &&
                !nb_cuda_gemm_own_schedule(0, 8, 8, (int64_t)1 << 40, 132, &s),
            "empty or oversized problems, no SMs");
  NBT_CHECK(!nb_cuda_scaled_mm_own_schedule(-1, 8, 8, 8, 132, &s) &&
                !nb_cuda_scaled_mm_own_schedule(LAST + 1, 8, 8, 8, 132, &s) &&
                !nb_cuda_scaled_mm_own_schedule(0, 8, 0, 8, 132, &s) &&
                !nb_cuda_scaled_mm_own_schedule(0, 8, 8, (int64_t)1 << 40, 132, &s),
            "fp8: bad candidates, empty or oversized problems");
}

int main(void) {
  test_documented();
  test_bad();
  const int sms[] = {132, 114, 8, 1};
  const int64_t shapes[][3] = {{768, 3072, 16384}, {3072, 768, 16384}, {2304, 768, 16384},
                               {16384, 3072, 768},  {1000, 520, 4136},   {1, 1, 1},
                               {129, 257, 65},      {2176, 2304, 520},   {50304, 768, 16384},
                               {16384, 768, 768},   {1408, 1536, 768},   {2048, 3072, 1536}};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    for (size_t j = 0; j < sizeof sms / sizeof *sms; j++) check_rules(shapes[i][0], shapes[i][1], shapes[i][2], sms[j]);
  uint64_t x = 7; /* random sizes, primes and tails included */
  for (int r = 0; r < 200; r++) {
    int64_t d[3];
    for (int k = 0; k < 3; k++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      d[k] = 1 + (int64_t)((x >> 33) % (k == 2 ? (r % 4 == 0 ? 1600 : 40000) : 9000)); /* some K of <= 12 k-tiles */
    }
    check_rules(d[0], d[1], d[2], r % 2 ? 132 : 78);
  }
  return nbt_finish();
}
#else
int main(void) {
  printf("test_gemm_schedule: no CUDA backend compiled in; nothing to check\n");
  return 0;
}
#endif
