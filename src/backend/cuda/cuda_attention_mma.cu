/* The tensor-core flash attention (FlashAttention-2's algorithm) for bf16 and
 * f16 inputs with f32 accumulation: mma.sync.m16n8k16, ldmatrix and cp.async,
 * so any GPU of compute capability 8.0 or later (the H100 included; its
 * wgmma/TMA kernel is a later step). Head dimensions 64, 96, 128 (D == Dv);
 * rows contiguous and 16-byte aligned (row and batch strides multiples of 8
 * elements), else cuda_attention.cu's SIMT kernels run.
 *
 * Forward: a CTA of 4 or 8 warps, each owning 16 query rows (D = 96, 128;
 * Q's A fragments kept in registers) or 32 (D = 64; Q read from shared
 * memory, each K/V fragment serving both 16-row halves), of one (batch,
 * head), streams tiles of 64 keys and values through shared memory (two
 * stages, cp.async: tile j + 1 loads while tile j is computed; with Q in
 * registers, Q is staged in stage 1's space and moved out before that stage
 * is first needed). Per tile, in registers: S = Q K^T (K by ldmatrix), the
 * mask (keys past Lk; causal, key j for query i when j <= i, aligned
 * top-left, only on tiles that cross a warp's diagonal), the row max
 * through the quad's shuffles, p = exp2(s scale log2e - m scale log2e) with
 * the max subtracted first, the row sums, and O += P V with P rounded to
 * the input dtype as the A operand straight from the S accumulators and V
 * read by ldmatrix.trans. Tiles wholly above the diagonal are never loaded.
 * o = O / l in the input dtype, lse = m scale + log(l) in f32. Query blocks
 * run heaviest first (causal balance).
 *
 * Backward, recomputing P from lse: delta = rowsum(dout * o) (one kernel);
 * dK, dV: a CTA of 4 or 8 warps per 64 or 128 keys, each warp owning 16,
 * streaming the 64-query blocks that see them (Q, dO, lse, delta
 * double-buffered): S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T,
 * dS^T = P^T (dP^T - delta), dK += dS^T Q, all in registers; dQ: a CTA per
 * 64 or 128 queries streaming the 64-key K/V blocks they see, recomputing
 * S, P, dP and dS, dQ += dS K. Warps per CTA: see fa_fwd_warps. Every
 * output element is accumulated by one thread in a fixed order (no
 * atomics): the same bits on every run. Shapes: q (.., Lq, D), k, v (.., Lk, D), o, dout (.., Lq, D),
 * lse (.., Lq) f32, dq, dk, dv as q, k, v; every view but lse (and the
 * delta scratch) strided as fa_view_ok allows (the (B, H, T, D) views of a
 * packed (B, T, 3 H D) projection and of its gradient included).
 *
 * The optional parts are template flags (EX: FA_MASK, FA_DROP, FA_GQA), so
 * the plain kernels (EX = 0) compile as before. FA_MASK: after S = Q K^T
 * (unscaled) each thread adds mask / scale to its S elements, read from
 * global memory at its (query, key) with the mask's strides (its batch
 * offset once per CTA); a row whose scores are all -inf keeps m = -inf
 * (fa_softmax takes p = 0, l = 0), ends with o = 0, lse = -inf, and the
 * backward reads lse = -inf as +inf (p = 0). FA_DROP: forward multiplies P
 * by z = keep / (1 - p) after the row sums, before O += P V (keep from
 * Philox per element, cuda_attention_extra.cuh); dK/dV's pass keeps the 32
 * keep bits of its S^T fragment in one register, packs P Z into dV's
 * operand and takes dS = P (Z dP - delta); dQ's pass the same dS. FA_GQA
 * (dK/dV only; the other kernels read k, v through attn_group.h's stride-0
 * group axis): a CTA per kv head's key block loops over the G query heads
 * in order, each a full pass over its query tiles, so dK, dV sum the group
 * in a fixed order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_attention_extra.cuh"
#include "backend/cuda/cuda_attention_mma.cuh"
#include "backend/cuda/cuda_mma.cuh"

#define FA_MAXB (NB_MAX_DIMS - 2)
#define FA_BN 64 /* keys per tile (dQ) */
#define FA_BM 64 /* queries per streamed tile (dK, dV) */
/* k-steps of S = A B^T unrolled in the backward kernels: 1 in dK/dV keeps
 * its registers under 255 at D = 128 (unrolled it spills), all in dQ */
#define FA_KU 1
#define FA_KUQ 8
#define FA_LOG2E 1.4426950408889634f
/* the template flags of the optional parts */
#define FA_MASK 1
#define FA_DROP 2
#define FA_GQA 4
#define FA_X (FA_MASK | FA_DROP) /* one instantiation for both (runtime branches inside) */

namespace {

/* A (.., L, D) view: data, row stride and batch strides in elements. */
struct fa_view {
  const uint16_t *p;
  int64_t rs, bs[FA_MAXB];
};

struct fa_params {
  fa_view q, k, v, o, g; /* g: dout; o is written by the forward */
  fa_view dq, dk, dv;    /* written by the backward (strided like o) */
  float *lse, *delta;    /* (B, Lq) */
  int nb;
  int64_t bshape[FA_MAXB];
  int B, Lq, Lk, nblk; /* nblk: row blocks per (batch, head) */
  float scale, sl2;    /* sl2 = scale * log2(e) */
  int causal;
  int G;               /* query heads per kv head (FA_GQA) */
  float inv_scale;     /* 1 / scale: the mask in S's unscaled units */
  nb_attx x;           /* mask, dropout */
};

/* The (query i, key j) of element e of S's n-th 16 x 8 fragment (a warp's
 * rows row, row + 8; keys col0 + ...); TR: transposed, as below. */
template <bool TR>
__device__ __forceinline__ void fa_frag_ij(int row, int col0, int lane, int n, int e, int &i, int &j) {
  const int c = col0 + 8 * n + 2 * (lane & 3) + (e & 1), r = row + 8 * (e >> 1);
  i = TR ? c : r;
  j = TR ? r : c;
}

/* S[16 x 8 NT] (a warp's rows row, row + 8; keys col0 + ...) += mask / scale,
 * rows at or past Lq and keys at or past Lk left alone. T: transposed
 * (keys x queries, dK/dV's S^T: the row is a key, columns queries). */
template <int NT, bool TR>
__device__ __forceinline__ void fa_add_mask(float (&s)[NT][4], const fa_params &p, int64_t mb,
                                            int row, int col0, int lane) {
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int i, j;
      fa_frag_ij<TR>(row, col0, lane, n, e, i, j);
      if (i < p.Lq && j < p.Lk)
        s[n][e] += nb_attx_val(p.x, mb + (int64_t)i * p.x.mrs + (int64_t)j * p.x.mcs) * p.inv_scale;
    }
}

/* The keep bits of S[16 x 8 NT]'s elements (bit 4 n + e), as fa_add_mask
 * indexes them. */
template <int NT, bool TR>
__device__ __forceinline__ uint32_t fa_keep_bits(const fa_params &p, int64_t b, int row, int col0,
                                                 int lane) {
  uint32_t bits = 0;
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int i, j;
      fa_frag_ij<TR>(row, col0, lane, n, e, i, j);
      if (i < p.Lq && j < p.Lk && nb_attx_keep(p.x, b, i, j, p.Lq, p.Lk)) bits |= 1u << (4 * n + e);
    }
  return bits;
}

/* Element offset of batch index b in view v. */
__device__ __forceinline__ int64_t fa_off(const fa_params &p, const fa_view &v, int64_t b) {
  int64_t off = 0;
  for (int d = p.nb - 1; d >= 0; d--) {
    off += (b % p.bshape[d]) * v.bs[d];
    b /= p.bshape[d];
  }
  return off;
}

/* Rows [r0, r0 + ROWS) x D of a view (base at its batch) into a shared tile
 * of pitch D + 8 elements (the 8 rows an ldmatrix phase reads fall in 8
 * different bank groups); rows at or past L are zero-filled, never read. */
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void fa_load(uint16_t *s, const uint16_t *base, int64_t rs, int r0, int L) {
  constexpr int CPR = D / 8, CH = ROWS * CPR;
  static_assert(CH % THREADS == 0, "chunks per thread");
#pragma unroll
  for (int j = 0; j < CH / THREADS; j++) {
    const int i = threadIdx.x + j * THREADS, r = i / CPR, c = (i % CPR) * 8;
    const bool in = r0 + r < L;
    const uint16_t *src = in ? base + (int64_t)(r0 + r) * rs + c : base;
    nb_mma_cp16(nb_mma_smem(s + r * (D + 8) + c), src, in ? 16 : 0);
  }
}

/* acc[16 x 64] += A (16 rows at sa, K-major) B^T where B is 64 rows at sb
 * (K-major, k = D contiguous): S = Q K^T and its relatives. KU: k-steps
 * unrolled (fewer keep fewer fragments in flight: register pressure). */
template <typename T, int D, int KU>
__device__ __forceinline__ void fa_mma_abt(float (&acc)[8][4], const uint16_t *sa,
                                           const uint16_t *sb, int lane) {
  constexpr int P = D + 8;
  const uint32_t a0 = nb_mma_smem(sa + nb_mma_frag_a(lane, P));
  const uint32_t b0 = nb_mma_smem(sb + nb_mma_frag_bn(lane, P));
#pragma unroll KU
  for (int kk = 0; kk < D / 16; kk++) {
    uint32_t a[4];
    nb_mma_ldsm(a, a0 + 2 * kk * 16);
#pragma unroll
    for (int nj = 0; nj < 4; nj++) {
      uint32_t b[4];
      nb_mma_ldsm(b, b0 + 2 * (nj * 16 * P + kk * 16));
      nb_mma<T>::run(acc[2 * nj], a, b);
      nb_mma<T>::run(acc[2 * nj + 1], a, b + 2);
    }
  }
}

/* acc[16 x D] += X (16 x 64, the f32 accumulators x, rounded to T) B where B
 * is 64 rows x D at sb (row-major, read transposed): O += P V and its
 * relatives. DROP: x[n][e] times zs where bit 4 n + e of keep is set, else
 * 0 (dV += (P Z)^T dO). */
template <typename T, int D, bool DROP = false>
__device__ __forceinline__ void fa_mma_xb(float (&acc)[D / 8][4], const float (&x)[8][4],
                                          const uint16_t *sb, int lane, uint32_t keep = 0,
                                          float zs = 1.0f) {
  constexpr int P = D + 8;
  const uint32_t b0 = nb_mma_smem(sb + nb_mma_frag_bk(lane, P));
#define FA_XE(n, e) (DROP ? ((keep >> (4 * (n) + (e))) & 1u ? x[n][e] * zs : 0.0f) : x[n][e])
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    const uint32_t a[4] = {nb_mma<T>::pack(FA_XE(2 * kk, 0), FA_XE(2 * kk, 1)),
                           nb_mma<T>::pack(FA_XE(2 * kk, 2), FA_XE(2 * kk, 3)),
                           nb_mma<T>::pack(FA_XE(2 * kk + 1, 0), FA_XE(2 * kk + 1, 1)),
                           nb_mma<T>::pack(FA_XE(2 * kk + 1, 2), FA_XE(2 * kk + 1, 3))};
#undef FA_XE
#pragma unroll
    for (int nd = 0; nd < D / 16; nd++) {
      uint32_t b[4];
      nb_mma_ldsm_t(b, b0 + 2 * (kk * 16 * P + nd * 16));
      nb_mma<T>::run(acc[2 * nd], a, b);
      nb_mma<T>::run(acc[2 * nd + 1], a, b + 2);
    }
  }
}

/* Rows r and r + 8 of a warp's 16 x D accumulators, times mul[h], to a
 * (.., L, D) destination of row stride rs; rows at or past L skipped. */
template <typename T, int D>
__device__ __forceinline__ void fa_store(T *dst, int64_t rs, int r, int L, const float (&acc)[D / 8][4],
                                         const float *mul, int lane) {
#pragma unroll
  for (int h = 0; h < 2; h++) {
    if (r + 8 * h >= L) continue;
    T *row = dst + (int64_t)(r + 8 * h) * rs + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < D / 8; n++)
      *(uint32_t *)(row + 8 * n) = nb_mma<T>::pack(acc[n][2 * h] * mul[h], acc[n][2 * h + 1] * mul[h]);
  }
}

/* ---- forward ----------------------------------------------------------- */
/* One tile's online softmax for a warp's rows g and g + 8 (h = 0, 1): s
 * becomes p, o and l are rescaled by the change of the running max m. */
template <int D, int NT>
__device__ __forceinline__ void fa_softmax(float (&s)[NT][4], float (&o)[D / 8][4], float *m, float *l,
                                           float sl2) {
#pragma unroll
  for (int h = 0; h < 2; h++) {
    float mx = m[h];
#pragma unroll
    for (int n = 0; n < NT; n++) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float ms = mx == -INFINITY ? 0.0f : mx * sl2; /* a row with no key yet */
    const float corr = nb_mma_exp2(m[h] * sl2 - ms);    /* 0 on the first tile */
    m[h] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      s[n][2 * h] = nb_mma_exp2(fmaf(s[n][2 * h], sl2, -ms));
      s[n][2 * h + 1] = nb_mma_exp2(fmaf(s[n][2 * h + 1], sl2, -ms));
      sum += s[n][2 * h] + s[n][2 * h + 1];
    }
    l[h] = l[h] * corr + sum; /* this thread's columns; the quad sums at the end */
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][2 * h] *= corr, o[n][2 * h + 1] *= corr;
  }
}

/* -inf where key col0 + column is past Lk or (causal) after the row. */
template <int NT>
__device__ __forceinline__ void fa_mask(float (&s)[NT][4], int row, int col0, int Lk, int causal,
                                        float fill, int lane) {
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int c = col0 + 8 * n + 2 * (lane & 3) + (e & 1), r = row + 8 * (e >> 1);
      if (c >= Lk || (causal && c > r)) s[n][e] = fill;
    }
}

/* S[MI][16 x 64] += Q K^T for a warp's 16 MI rows: Q's A fragments from
 * registers (qf, MI == 1) or shared memory (qa), K's from shared memory. */
template <typename T, int D, int MI, int QR, int NT>
__device__ __forceinline__ void fa_fwd_s(float (&s)[MI][NT][4], const uint32_t (&qf)[QR][4], uint32_t qa,
                                         uint32_t kb0) {
  constexpr int P = D + 8;
#pragma unroll MI == 1 ? D / 16 : 1
  for (int kk = 0; kk < D / 16; kk++) {
    uint32_t a[MI][4];
    if (MI > 1) {
#pragma unroll
      for (int mi = 0; mi < MI; mi++) nb_mma_ldsm(a[mi], qa + 2 * (mi * 16 * P + kk * 16));
    }
#pragma unroll
    for (int nj = 0; nj < NT / 2; nj++) {
      uint32_t bf[4];
      nb_mma_ldsm(bf, kb0 + 2 * (nj * 16 * P + kk * 16));
#pragma unroll
      for (int mi = 0; mi < MI; mi++) {
        const uint32_t *af = MI == 1 ? qf[kk % QR] : a[mi];
        nb_mma<T>::run(s[mi][2 * nj], af, bf);
        nb_mma<T>::run(s[mi][2 * nj + 1], af, bf + 2);
      }
    }
  }
}

/* O[MI] += P[MI] V: P rounded to T from the S accumulators (all of it
 * first, so the f32 values die before V's fragments load), V by
 * ldmatrix.trans. */
template <typename T, int D, int MI, int NT>
__device__ __forceinline__ void fa_fwd_pv(float (&o)[MI][D / 8][4], const float (&x)[MI][NT][4],
                                          uint32_t vb0) {
  constexpr int P = D + 8;
  uint32_t pa[NT / 2][MI][4];
#pragma unroll
  for (int kk = 0; kk < NT / 2; kk++)
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
      pa[kk][mi][0] = nb_mma<T>::pack(x[mi][2 * kk][0], x[mi][2 * kk][1]);
      pa[kk][mi][1] = nb_mma<T>::pack(x[mi][2 * kk][2], x[mi][2 * kk][3]);
      pa[kk][mi][2] = nb_mma<T>::pack(x[mi][2 * kk + 1][0], x[mi][2 * kk + 1][1]);
      pa[kk][mi][3] = nb_mma<T>::pack(x[mi][2 * kk + 1][2], x[mi][2 * kk + 1][3]);
    }
#pragma unroll
  for (int kk = 0; kk < NT / 2; kk++) {
    const uint32_t (&a)[MI][4] = pa[kk];
#pragma unroll
    for (int nd = 0; nd < D / 16; nd++) {
      uint32_t bf[4];
      nb_mma_ldsm_t(bf, vb0 + 2 * (kk * 16 * P + nd * 16));
#pragma unroll
      for (int mi = 0; mi < MI; mi++) {
        nb_mma<T>::run(o[mi][2 * nd], a[mi], bf);
        nb_mma<T>::run(o[mi][2 * nd + 1], a[mi], bf + 2);
      }
    }
  }
}

// q (B, Lq, D), k, v (B, Lk, D) -> o (B, Lq, D), lse (B, Lq)
/* NW warps of 16 MI rows each, tiles of BN keys. MI == 1: Q's fragments
 * live in registers and Q is staged in stage 1's space; MI == 2: Q stays in
 * its own shared tile and each warp's K/V fragments serve 32 rows (half the
 * fragment reads per row). */
template <typename T, int D, int MI, int BN, int NW, int EX>
__global__ void __launch_bounds__(NW * 32) fa_fwd_kernel(const fa_params p) {
  constexpr int WR = 16 * MI, BM = WR * NW, P = D + 8, TILE = BN * P, QR = MI == 1 ? D / 16 : 1;
  constexpr int NT = BN / 8, TH = NW * 32;
  static_assert(MI == 2 || BM <= 2 * BN, "Q fits stage 1");
  extern __shared__ __align__(16) uint16_t fa_smem[];
  const int b = blockIdx.x % p.B, i0 = (p.nblk - 1 - blockIdx.x / p.B) * BM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, row = i0 + warp * WR + (lane >> 2);
  const uint16_t *qb = p.q.p + fa_off(p, p.q, b), *kb = p.k.p + fa_off(p, p.k, b);
  const uint16_t *vb = p.v.p + fa_off(p, p.v, b);
  const int kend = p.causal ? min(p.Lk, min(i0 + BM, p.Lq)) : p.Lk;
  const int ntiles = (kend + BN - 1) / BN;
  uint16_t *sq = fa_smem + (MI == 1 ? 2 : 4) * TILE; /* MI == 1: stage 1's K space */
  fa_load<D, BM, TH>(sq, qb, p.q.rs, i0, p.Lq);
  nb_mma_commit();
  fa_load<D, BN, TH>(fa_smem, kb, p.k.rs, 0, p.Lk);
  fa_load<D, BN, TH>(fa_smem + TILE, vb, p.v.rs, 0, p.Lk);
  nb_mma_commit();
  nb_mma_wait<1>();
  __syncthreads();
  uint32_t qf[QR][4];
  const uint32_t qa = nb_mma_smem(sq + warp * WR * P + nb_mma_frag_a(lane, P));
  if (MI == 1) {
#pragma unroll
    for (int kk = 0; kk < QR; kk++) nb_mma_ldsm(qf[kk], qa + 2 * kk * 16);
  }
  float o[MI][D / 8][4], m[MI][2], l[MI][2];
#pragma unroll
  for (int mi = 0; mi < MI; mi++) {
    m[mi][0] = m[mi][1] = -INFINITY;
    l[mi][0] = l[mi][1] = 0.0f;
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.0f;
  }
  for (int j = 0; j < ntiles; j++) {
    nb_mma_wait<0>();
    __syncthreads(); /* tile j landed everywhere; tile j - 1 (and Q) no longer read */
    if (j + 1 < ntiles) {
      uint16_t *sk = fa_smem + ((j + 1) & 1) * 2 * TILE;
      fa_load<D, BN, TH>(sk, kb, p.k.rs, (j + 1) * BN, p.Lk);
      fa_load<D, BN, TH>(sk + TILE, vb, p.v.rs, (j + 1) * BN, p.Lk);
    }
    nb_mma_commit();
    const uint16_t *sk = fa_smem + (j & 1) * 2 * TILE, *sv = sk + TILE;
    float s[MI][NT][4];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
      for (int n = 0; n < NT; n++) s[mi][n][0] = s[mi][n][1] = s[mi][n][2] = s[mi][n][3] = 0.0f;
    fa_fwd_s<T, D, MI, QR, NT>(s, qf, qa, nb_mma_smem(sk + nb_mma_frag_bn(lane, P)));
    const int j0 = j * BN;
    if (j0 + BN > p.Lk || (p.causal && j0 + BN - 1 > i0 + warp * WR)) { /* warp-uniform */
#pragma unroll
      for (int mi = 0; mi < MI; mi++) fa_mask(s[mi], row + 16 * mi, j0, p.Lk, p.causal, -INFINITY, lane);
    }
    if ((EX & FA_MASK) && p.x.mask) {
      const int64_t mb = nb_attx_boff(p.x, p.nb, p.bshape, b);
#pragma unroll
      for (int mi = 0; mi < MI; mi++) fa_add_mask<NT, false>(s[mi], p, mb, row + 16 * mi, j0, lane);
    }
#pragma unroll
    for (int mi = 0; mi < MI; mi++) fa_softmax<D>(s[mi], o[mi], m[mi], l[mi], p.sl2);
    if ((EX & FA_DROP) && p.x.drop) {
#pragma unroll
      for (int mi = 0; mi < MI; mi++) {
        const uint32_t keep = fa_keep_bits<NT, false>(p, b, row + 16 * mi, j0, lane);
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
          for (int e = 0; e < 4; e++) s[mi][n][e] = (keep >> (4 * n + e)) & 1u ? s[mi][n][e] * p.x.zs : 0.0f;
      }
    }
    fa_fwd_pv<T, D, MI, NT>(o, s, nb_mma_smem(sv + nb_mma_frag_bk(lane, P)));
  }
  nb_mma_wait<0>();
#pragma unroll
  for (int mi = 0; mi < MI; mi++) {
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int r = row + 16 * mi + 8 * h;
      l[mi][h] += __shfl_xor_sync(0xffffffffu, l[mi][h], 1);
      l[mi][h] += __shfl_xor_sync(0xffffffffu, l[mi][h], 2);
      inv[h] = l[mi][h] > 0.0f ? 1.0f / l[mi][h] : 0.0f;
      if ((lane & 3) == 0 && r < p.Lq)
        p.lse[(int64_t)b * p.Lq + r] = l[mi][h] > 0.0f ? m[mi][h] * p.scale + logf(l[mi][h]) : -INFINITY;
    }
    fa_store<T, D>((T *)(p.o.p + fa_off(p, p.o, b)), p.o.rs, row + 16 * mi, p.Lq, o[mi], inv, lane);
  }
}

/* ---- backward ---------------------------------------------------------- */
/* delta[b, i] = dout[b, i, :] . o[b, i, :]: a warp per row. */
template <typename T, int D>
__global__ void fa_delta_kernel(const fa_params p) {
  const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= (int64_t)p.B * p.Lq) return;
  const int64_t b = r / p.Lq, i = r % p.Lq;
  const T *g = (const T *)(p.g.p + fa_off(p, p.g, b) + i * p.g.rs);
  const T *o = (const T *)(p.o.p + fa_off(p, p.o, b) + i * p.o.rs);
  float s = 0.0f;
  for (int d = 2 * lane; d < D; d += 64)
    s += nb_to_f(g[d]) * nb_to_f(o[d]) + nb_to_f(g[d + 1]) * nb_to_f(o[d + 1]);
  s = nb_warp_sum(s);
  if (lane == 0) p.delta[r] = s;
}

/* lse * log2(e) (+inf past Lq: p = 0) and delta of queries [i0, i0 + 64)
 * into shared sl[64], sd[64]: threads 0..127. */
__device__ __forceinline__ void fa_load_stats(float *sl, const fa_params &p, int64_t b, int i0) {
  const int t = threadIdx.x & 63, i = i0 + t;
  const float *src = threadIdx.x < 64 ? p.lse : p.delta;
  const float v = i < p.Lq ? src[b * p.Lq + i] : 0.0f;
  /* +inf past Lq and for a row with no allowed key (lse = -inf): p = 0 */
  if (threadIdx.x < 64) sl[t] = i < p.Lq && v != -INFINITY ? v * FA_LOG2E : INFINITY;
  else if (threadIdx.x < 128) sl[64 + t] = v;
}

// dk, dv (B, Lk, D): a CTA per 16 NW keys, a warp per 16 of them (FA_GQA:
// per kv head, over its G query heads in order)
template <typename T, int D, int NW, int EX>
__global__ void __launch_bounds__(NW * 32) fa_bwd_kv_kernel(const fa_params p) {
  constexpr int P = D + 8, TILE = FA_BM * P, BK = 16 * NW, TH = NW * 32, KT = NW / 4;
  constexpr bool GQA = (EX & FA_GQA) != 0;
  extern __shared__ __align__(16) uint16_t fa_smem[];
  const int nbk = GQA ? p.B / p.G : p.B;
  const int b0 = GQA ? blockIdx.x % nbk * p.G : blockIdx.x % nbk, j0 = blockIdx.x / nbk * BK;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int key = j0 + warp * 16 + (lane >> 2);
  const uint16_t *qb = p.q.p + fa_off(p, p.q, b0), *gb = p.g.p + fa_off(p, p.g, b0);
  const uint16_t *sk = fa_smem, *sv = fa_smem + KT * TILE; /* BK rows each */
  uint16_t *sq0 = fa_smem + 2 * KT * TILE;                  /* stage s: Q, dO at 2s, 2s + 1 */
  float *stats = (float *)(sq0 + 4 * TILE); /* per stage: lse * log2e [64], delta [64] */
  const int ibeg = p.causal ? j0 / FA_BM * FA_BM : 0;
  const int ntiles = ibeg < p.Lq ? (p.Lq - ibeg + FA_BM - 1) / FA_BM : 0;
  fa_load<D, BK, TH>(fa_smem, p.k.p + fa_off(p, p.k, b0), p.k.rs, j0, p.Lk);
  fa_load<D, BK, TH>(fa_smem + KT * TILE, p.v.p + fa_off(p, p.v, b0), p.v.rs, j0, p.Lk);
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
  for (int g = 0; g < (GQA ? p.G : 1); g++) {
    const int b = b0 + g;
    if (GQA && g) { /* the next query head; the previous one's last tile no longer read */
      qb = p.q.p + fa_off(p, p.q, b), gb = p.g.p + fa_off(p, p.g, b);
      __syncthreads();
    }
    if (ntiles) {
      fa_load<D, FA_BM, TH>(sq0, qb, p.q.rs, ibeg, p.Lq);
      fa_load<D, FA_BM, TH>(sq0 + TILE, gb, p.g.rs, ibeg, p.Lq);
      fa_load_stats(stats, p, b, ibeg);
    }
    nb_mma_commit();
    for (int it = 0; it < ntiles; it++) {
      const int i0 = ibeg + it * FA_BM;
      nb_mma_wait<0>();
      __syncthreads();
      if (it + 1 < ntiles) {
        const int s1 = (it + 1) & 1;
        fa_load<D, FA_BM, TH>(sq0 + 2 * s1 * TILE, qb, p.q.rs, i0 + FA_BM, p.Lq);
        fa_load<D, FA_BM, TH>(sq0 + (2 * s1 + 1) * TILE, gb, p.g.rs, i0 + FA_BM, p.Lq);
        fa_load_stats(stats + 128 * s1, p, b, i0 + FA_BM);
      }
      nb_mma_commit();
      const uint16_t *sq = sq0 + 2 * (it & 1) * TILE, *sg = sq + TILE;
      const float *sl = stats + 128 * (it & 1), *sd = sl + 64;
      float s[8][4], dp[8][4];
#pragma unroll
      for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
      fa_mma_abt<T, D, FA_KU>(s, sk + warp * 16 * P, sq, lane); /* S^T = K Q^T (keys x queries) */
      if ((EX & FA_MASK) && p.x.mask) fa_add_mask<8, true>(s, p, nb_attx_boff(p.x, p.nb, p.bshape, b), key, i0, lane);
      const bool diag = p.causal && i0 < j0 + BK;         /* CTA-uniform */
#pragma unroll
      for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int c = 8 * n + 2 * (lane & 3) + (e & 1);
          const float pv = nb_mma_exp2(fmaf(s[n][e], p.sl2, -sl[c]));
          s[n][e] = diag && i0 + c < key + 8 * (e >> 1) ? 0.0f : pv;
        }
      uint32_t keep = ~0u; /* every element kept, z = 1, without dropout */
      float zs = 1.0f;
      if ((EX & FA_DROP) && p.x.drop) {
        keep = fa_keep_bits<8, true>(p, b, key, i0, lane);
        zs = p.x.zs;
        fa_mma_xb<T, D, true>(dv, s, sg, lane, keep, zs); /* dV += (P Z)^T dO */
      } else {
        fa_mma_xb<T, D>(dv, s, sg, lane);                  /* dV += P^T dO */
      }
      fa_mma_abt<T, D, FA_KU>(dp, sv + warp * 16 * P, sg, lane); /* dP^T = V dO^T */
#pragma unroll
      for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float d = dp[n][e];
          if (EX & FA_DROP) d = (keep >> (4 * n + e)) & 1u ? d * zs : 0.0f;
          dp[n][e] = s[n][e] * (d - sd[8 * n + 2 * (lane & 3) + (e & 1)]);
        }
      fa_mma_xb<T, D>(dk, dp, sq, lane); /* dK += dS^T Q */
    }
  }
  nb_mma_wait<0>();
  const float one[2] = {1.0f, 1.0f}, sc[2] = {p.scale, p.scale};
  /* the outputs' batch offsets here, at the end (computed with the prologue's,
   * they made ptxas spill inside the loop at D = 128) */
  fa_store<T, D>((T *)(p.dk.p + fa_off(p, p.dk, b0)), p.dk.rs, key, p.Lk, dk, sc, lane);
  fa_store<T, D>((T *)(p.dv.p + fa_off(p, p.dv, b0)), p.dv.rs, key, p.Lk, dv, one, lane);
}

// dq (B, Lq, D): a CTA per 16 NW queries, a warp per 16 of them
template <typename T, int D, int NW, int EX>
__global__ void __launch_bounds__(NW * 32) fa_bwd_q_kernel(const fa_params p) {
  constexpr int P = D + 8, TILE = FA_BN * P, BQ = 16 * NW, TH = NW * 32, QT = NW / 4;
  extern __shared__ __align__(16) uint16_t fa_smem[];
  const int b = blockIdx.x % p.B, i0 = (p.nblk - 1 - blockIdx.x / p.B) * BQ;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, row = i0 + warp * 16 + (lane >> 2);
  const uint16_t *kb = p.k.p + fa_off(p, p.k, b), *vb = p.v.p + fa_off(p, p.v, b);
  const int kend = p.causal ? min(p.Lk, min(i0 + BQ, p.Lq)) : p.Lk;
  const int ntiles = (kend + FA_BN - 1) / FA_BN;
  uint16_t *sk0 = fa_smem + 2 * QT * TILE; /* stage s: K, V at 2s, 2s + 1 */
  /* dq's batch offset, computed here once: at the end, with the
   * accumulators live, the division routine's calls made ptxas spill */
  __shared__ int64_t out_off;
  if (threadIdx.x == 0) out_off = fa_off(p, p.dq, b);
  fa_load<D, BQ, TH>(fa_smem, p.q.p + fa_off(p, p.q, b), p.q.rs, i0, p.Lq);
  fa_load<D, BQ, TH>(fa_smem + QT * TILE, p.g.p + fa_off(p, p.g, b), p.g.rs, i0, p.Lq);
  if (ntiles) {
    fa_load<D, FA_BN, TH>(sk0, kb, p.k.rs, 0, p.Lk);
    fa_load<D, FA_BN, TH>(sk0 + TILE, vb, p.v.rs, 0, p.Lk);
  }
  nb_mma_commit();
  float lse[2], delta[2], dq[D / 8][4];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = row + 8 * h;
    const float L = r < p.Lq ? p.lse[(int64_t)b * p.Lq + r] : -INFINITY;
    lse[h] = L != -INFINITY ? L * FA_LOG2E : INFINITY; /* past Lq or no allowed key: p = 0 */
    delta[h] = r < p.Lq ? p.delta[(int64_t)b * p.Lq + r] : 0.0f;
  }
#pragma unroll
  for (int n = 0; n < D / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  const uint16_t *sq = fa_smem + warp * 16 * P, *sg = fa_smem + QT * TILE + warp * 16 * P;
  for (int j = 0; j < ntiles; j++) {
    nb_mma_wait<0>();
    __syncthreads();
    if (j + 1 < ntiles) {
      uint16_t *sk = sk0 + 2 * ((j + 1) & 1) * TILE;
      fa_load<D, FA_BN, TH>(sk, kb, p.k.rs, (j + 1) * FA_BN, p.Lk);
      fa_load<D, FA_BN, TH>(sk + TILE, vb, p.v.rs, (j + 1) * FA_BN, p.Lk);
    }
    nb_mma_commit();
    const uint16_t *sk = sk0 + 2 * (j & 1) * TILE, *sv = sk + TILE;
    float s[8][4], dp[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
    fa_mma_abt<T, D, FA_KUQ>(s, sq, sk, lane); /* S = Q K^T */
    const int j0 = j * FA_BN;
    if ((EX & FA_MASK) && p.x.mask) fa_add_mask<8, false>(s, p, nb_attx_boff(p.x, p.nb, p.bshape, b), row, j0, lane);
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[n][e] = nb_mma_exp2(fmaf(s[n][e], p.sl2, -lse[e >> 1]));
    if (j0 + FA_BN > p.Lk || (p.causal && j0 + FA_BN - 1 > i0 + warp * 16)) /* warp-uniform */
      fa_mask(s, row, j0, p.Lk, p.causal, 0.0f, lane);
    fa_mma_abt<T, D, FA_KUQ>(dp, sg, sv, lane); /* dP = dO V^T */
    if ((EX & FA_DROP) && p.x.drop) {
      const uint32_t keep = fa_keep_bits<8, false>(p, b, row, j0, lane);
#pragma unroll
      for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dp[n][e] = (keep >> (4 * n + e)) & 1u ? dp[n][e] * p.x.zs : 0.0f;
    }
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) dp[n][e] = s[n][e] * (dp[n][e] - delta[e >> 1]);
    fa_mma_xb<T, D>(dq, dp, sk, lane); /* dQ += dS K */
  }
  nb_mma_wait<0>();
  const float sc[2] = {p.scale, p.scale};
  __syncthreads(); /* out_off (the loop may have run no iteration) */
  fa_store<T, D>((T *)(p.dq.p + out_off), p.dq.rs, row, p.Lq, dq, sc, lane);
}

/* ---- host side --------------------------------------------------------- */
/* Compute capability major of dev (cached; 0 when unknown). */
int fa_cc_major(int dev) {
  static int cache[64];
  if (dev < 0 || dev >= 64) return 0;
  if (!cache[dev]) {
    int ma = 0;
    if (cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) ma = -1;
    cudaGetLastError();
    cache[dev] = ma;
  }
  return cache[dev];
}

/* NABLA_ATTN_MMA=0 sends every call to the SIMT kernels (comparisons). */
int fa_enabled(void) {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("NABLA_ATTN_MMA");
    on = !(e && !strcmp(e, "0"));
  }
  return on;
}

/* A view the kernels read with 16-byte copies: unit last stride, row and
 * batch strides multiples of 8 elements (size-1 axes aside), aligned data. */
int fa_view_ok(const nb_kview *v, nb_dtype dt, int64_t D) {
  int nd = v->ndim;
  if (v->dtype != dt || v->shape[nd - 1] != D || v->strides[nd - 1] != 1) return 0;
  for (int d = 0; d < nd - 1; d++)
    if (v->shape[d] > 1 && v->strides[d] % 8) return 0;
  return ((uintptr_t)v->data & 15) == 0;
}

fa_view fa_view_of(const nb_kview *v, int nb) {
  fa_view a;
  memset(&a, 0, sizeof a);
  if (!v) return a;
  a.p = (const uint16_t *)v->data;
  a.rs = v->strides[nb];
  for (int d = 0; d < nb; d++) a.bs[d] = v->strides[d];
  return a;
}

/* Fills p from the views when the kernels take the call; 0 when not. */
int fa_make(fa_params *p, const nb_cuda_ctx *ctx, const nb_kview *q, const nb_kview *k,
            const nb_kview *v, const nb_kview *o, const nb_kview *g, double scale, int causal) {
  const int nd = q->ndim;
  const nb_dtype dt = q->dtype;
  const int64_t D = q->shape[nd - 1];
  if ((dt != NB_BF16 && dt != NB_F16) || (D != 64 && D != 96 && D != 128)) return 0;
  if (!fa_enabled() || fa_cc_major(ctx->dev) < 8 || nd < 2 || nd - 2 > FA_MAXB) return 0;
  if (!fa_view_ok(q, dt, D) || !fa_view_ok(k, dt, D) || !fa_view_ok(v, dt, D) ||
      !fa_view_ok(o, dt, D) || (g && !fa_view_ok(g, dt, D)))
    return 0;
  int64_t B = 1, Lq = q->shape[nd - 2], Lk = k->shape[nd - 2];
  for (int d = 0; d < nd - 2; d++) B *= q->shape[d];
  int64_t blocks = ((Lq > Lk ? Lq : Lk) + 63) / 64;
  if (Lq > INT32_MAX / 2 || Lk > INT32_MAX / 2 || B > INT32_MAX || B * blocks > INT32_MAX) return 0;
  memset(p, 0, sizeof *p);
  p->nb = nd - 2;
  for (int d = 0; d < p->nb; d++) p->bshape[d] = q->shape[d];
  p->q = fa_view_of(q, p->nb); p->k = fa_view_of(k, p->nb); p->v = fa_view_of(v, p->nb);
  p->o = fa_view_of(o, p->nb); p->g = fa_view_of(g, p->nb);
  p->B = (int)B;
  p->Lq = (int)Lq;
  p->Lk = (int)Lk;
  p->scale = (float)scale;
  p->sl2 = (float)(scale * 1.4426950408889634);
  p->causal = causal;
  return 1;
}

template <typename K>
nb_status fa_launch(const nb_cuda_ctx *ctx, K kern, int64_t grid, int threads, size_t smem,
                    const fa_params &p, const char *name) {
  if (grid <= 0) return NB_OK;
  if (smem > 48 * 1024)
    NB_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                name);
  kern<<<(unsigned)grid, threads, smem, ctx->stream>>>(p);
  return nb_cuda_launch_check(name);
}

#define FA_D_SWITCH(d, D, ...)                        \
  switch (d) {                                        \
  case 64: { const int D = 64; __VA_ARGS__; } break;  \
  case 96: { const int D = 96; __VA_ARGS__; } break;  \
  default: { const int D = 128; __VA_ARGS__; } break; \
  }

#define FA_T_SWITCH(dt, T, ...)                                 \
  if (dt == NB_BF16) { typedef __nv_bfloat16 T; __VA_ARGS__; } \
  else { typedef __half T; __VA_ARGS__; }

/* Warps per CTA: NABLA_ATTN_FWD_WARPS=4 or 8 (a K/V tile shared by 64 MI
 * or 128 MI query rows) and NABLA_ATTN_BWD_WARPS=4 or 8 (64 or 128 keys per
 * dK/dV CTA and queries per dQ CTA), read once, force one for comparisons.
 * By default 4 at D = 64 and 8 above, the faster on the H100 (bench/results/
 * h100-2026-11-24-flash-mma.md): forward D = 128 238 -> 264 TFLOP/s with 8,
 * GPT-2's D = 64 forward 189 with 4 against 168 with 8, and its backward
 * faster with 4 (forward+backward 98.7 with 4 against 91.8 with 8). */
int fa_env_warps(const char *name, int *cache) {
  if (!*cache) {
    const char *e = getenv(name);
    int v = e ? atoi(e) : 0;
    *cache = v == 4 || v == 8 ? v : -1;
  }
  return *cache;
}
int fa_fwd_warps(int D) {
  static int nw = 0;
  int v = fa_env_warps("NABLA_ATTN_FWD_WARPS", &nw);
  return v > 0 ? v : D == 64 ? 4 : 8;
}
int fa_bwd_warps(int D) {
  static int nw = 0;
  int v = fa_env_warps("NABLA_ATTN_BWD_WARPS", &nw);
  return v > 0 ? v : D == 64 ? 4 : 8;
}

} /* namespace */

int nb_cuda_attn_mma_fwd(const nb_cuda_ctx *ctx, const nb_kview *o, const nb_kview *lse,
                         const nb_kview *q, const nb_kview *k, const nb_kview *v, double scale,
                         int causal, const nb_attx *x, nb_status *st) {
  fa_params p;
  if (!fa_make(&p, ctx, q, k, v, o, NULL, scale, causal)) return 0;
  p.lse = (float *)lse->data;
  if (x) p.x = *x;
  p.inv_scale = (float)(1.0 / scale);
  /* rows per warp in 16s: 2 at D = 64 (on the H100 10% faster than 1);
   * at D = 96 and 128 two would take over 255 registers with 64-key tiles */
  const int D = (int)q->shape[q->ndim - 1], mi = D == 64 ? 2 : 1, nw = fa_fwd_warps(D);
  const int bm = 16 * mi * nw, th = 32 * nw;
  p.nblk = (p.Lq + bm - 1) / bm;
  const size_t smem = (size_t)(4 * 64 + (mi == 2 ? bm : 0)) * (D + 8) * 2;
  const int64_t grid = (int64_t)p.B * p.nblk;
  const char *name = "attention (mma)";
#define FA_FWD(EX)                                                                                      \
  FA_T_SWITCH(q->dtype, T, {                                                                           \
    if (D == 64 && nw == 4) *st = fa_launch(ctx, fa_fwd_kernel<T, 64, 2, 64, 4, EX>, grid, th, smem, p, name);   \
    else if (D == 64) *st = fa_launch(ctx, fa_fwd_kernel<T, 64, 2, 64, 8, EX>, grid, th, smem, p, name);         \
    else if (D == 96 && nw == 4) *st = fa_launch(ctx, fa_fwd_kernel<T, 96, 1, 64, 4, EX>, grid, th, smem, p, name); \
    else if (D == 96) *st = fa_launch(ctx, fa_fwd_kernel<T, 96, 1, 64, 8, EX>, grid, th, smem, p, name);         \
    else if (nw == 4) *st = fa_launch(ctx, fa_fwd_kernel<T, 128, 1, 64, 4, EX>, grid, th, smem, p, name);        \
    else *st = fa_launch(ctx, fa_fwd_kernel<T, 128, 1, 64, 8, EX>, grid, th, smem, p, name);                      \
  })
  if (x && (x->mask || x->drop)) {
    FA_FWD(FA_X);
  } else {
    FA_FWD(0);
  }
#undef FA_FWD
  return 1;
}

int nb_cuda_attn_mma_bwd(const nb_cuda_ctx *ctx, const nb_kview *dq, const nb_kview *dk,
                         const nb_kview *dv, const nb_kview *dout, const nb_kview *q,
                         const nb_kview *k, const nb_kview *v, const nb_kview *o,
                         const nb_kview *lse, double scale, int causal, const nb_attx *x, int G,
                         nb_status *st) {
  fa_params p;
  if (!fa_make(&p, ctx, q, k, v, o, dout, scale, causal)) return 0;
  const int D = (int)q->shape[q->ndim - 1];
  if (!fa_view_ok(dq, q->dtype, D) || !fa_view_ok(dk, q->dtype, D) || !fa_view_ok(dv, q->dtype, D))
    return 0;
  p.lse = (float *)lse->data;
  p.dq = fa_view_of(dq, p.nb); p.dk = fa_view_of(dk, p.nb); p.dv = fa_view_of(dv, p.nb);
  if (x) p.x = *x;
  p.inv_scale = (float)(1.0 / scale);
  p.G = G;
  const bool ex = x && (x->mask || x->drop);
  const size_t dbytes = (size_t)p.B * p.Lq * sizeof(float);
  p.delta = dbytes ? (float *)nb_cuda_scratch(ctx, dbytes) : NULL;
  if (dbytes && !p.delta) {
    *st = nb_last_status();
    return 1;
  }
  const int nw = fa_bwd_warps(D);
  const size_t tiles = (size_t)(4 + 2 * nw / 4) * 64 * (D + 8) * 2; /* 2 x 16 nw rows + 4 x 64 */
  *st = NB_OK;
  /* dK, dV: a CTA per kv head's key block (G query heads each) */
#define FA_KV(EX)                                                                                      \
  if (nw == 8) *st = fa_launch(ctx, fa_bwd_kv_kernel<T, DD, 8, EX>, gkv, 256, skv, p, "attention_bwd (dk, dv)"); \
  else *st = fa_launch(ctx, fa_bwd_kv_kernel<T, DD, 4, EX>, gkv, 128, skv, p, "attention_bwd (dk, dv)")
#define FA_Q(EX)                                                                                       \
  if (nw == 8) *st = fa_launch(ctx, fa_bwd_q_kernel<T, DD, 8, EX>, gq, 256, tiles, p, "attention_bwd (dq)"); \
  else *st = fa_launch(ctx, fa_bwd_q_kernel<T, DD, 4, EX>, gq, 128, tiles, p, "attention_bwd (dq)")
  FA_T_SWITCH(q->dtype, T, FA_D_SWITCH(D, DD, {
    const int64_t rows = (int64_t)p.B * p.Lq;
    *st = fa_launch(ctx, fa_delta_kernel<T, DD>, (rows + 7) / 8, 256, 0, p, "attention_bwd (delta)");
    p.nblk = (p.Lk + 16 * nw - 1) / (16 * nw);
    const int64_t gkv = (int64_t)(p.B / G) * p.nblk;
    const size_t skv = tiles + 2 * 128 * sizeof(float);
    if (!*st) {
      if (G > 1 && ex) { FA_KV(FA_X | FA_GQA); }
      else if (G > 1) { FA_KV(FA_GQA); }
      else if (ex) { FA_KV(FA_X); }
      else { FA_KV(0); }
    }
    p.nblk = (p.Lq + 16 * nw - 1) / (16 * nw);
    const int64_t gq = (int64_t)p.B * p.nblk;
    if (!*st) {
      if (ex) { FA_Q(FA_X); }
      else { FA_Q(0); }
    }
  }));
#undef FA_KV
#undef FA_Q
  if (p.delta) nb_cuda_scratch_free(ctx, p.delta, dbytes);
  return 1;
}
