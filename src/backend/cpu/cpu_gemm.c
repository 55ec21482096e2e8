/* CPU matrix multiply: out (B.., M, N) = a (B.., M, K) @ b (B.., K, N).
 *
 * The packed path is GotoBLAS/BLIS-style. For each block of MC rows of A and
 * KC of K, the A block is packed into MR-row micro-panels (k-major, so the
 * micro-kernel reads MR values per k); for each block of NC columns of B, the
 * B block is packed into NR-column micro-panels. Packing reads any strides
 * (a transposed view is read in place) and converts f16/bf16 to f32, so the
 * micro-kernel only sees contiguous f32 or f64 data. The micro-kernel keeps
 * an MR x NR tile of C in vector registers and does MR broadcasts, NR/VL
 * loads and MR*NR/VL FMAs per k. The A micro-panel (MR x KC) stays in L1
 * while the loop walks the B micro-panels of the block, which sit in L2.
 *
 * C is accumulated in the accumulator type (f32, or f64 for f64). When out
 * is of that type with unit column stride, tiles go straight into out;
 * otherwise (f16/bf16, or a strided out) they go into a per-thread f32
 * workspace that is rounded once into out at the end. Tiny or skinny
 * products skip packing (the direct path); small f32 products whose A rows
 * are unit-stride read A in place (the small path, AVX-512: the batched
 * matmuls of attention). OpenMP splits the work into tasks over batch
 * entries, or row/column blocks of one matrix; the result does not depend
 * on the split, and a call that stalled on a descheduled thread makes the
 * next ones run on one thread for a while (nbg_run). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>
#if defined(__SSE2__) || defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "backend/autotune.h"
#include "backend/cpu/cpu_gemm.h"
#include "core/core.h"

/* ---- micro-kernels ------------------------------------------------------
 * kc steps of C[MR x NR] (+)= A[MR x kc] B[kc x NR]; a is k-major with MR
 * values per k, b with NR values per k; c has row stride ldc and unit
 * column stride; acc selects += over =. */
typedef void (*nbg_ukr_fn)(int64_t kc, const void *a, const void *b, void *c, int64_t ldc,
                           int acc);

#define NBG_PRAGMA(x) _Pragma(#x)
/* The C tile is read (acc) and written after the k loop; fetching its rows
 * now hides that latency behind the FMAs. */
#if defined(__GNUC__)
#define NBG_PREFETCH_ROW(p) (__builtin_prefetch((p), 1, 3), __builtin_prefetch((char *)(p) + 64, 1, 3))
#else
#define NBG_PREFETCH_ROW(p) ((void)(p))
#endif
#define NBG_UKR_SIMD(name, T, V, MR, NV, VL, SET1, LOAD, STORE, FMA, ADD, ZERO)               \
  static void name(int64_t kc, const void *ap, const void *bp, void *cp, int64_t ldc,        \
                   int acc) {                                                                \
    const T *a = ap, *b = bp;                                                                \
    T *c = cp;                                                                               \
    V r[MR][NV];                                                                             \
    NBG_PRAGMA(GCC unroll 16) for (int i = 0; i < MR; i++) NBG_PREFETCH_ROW(c + i * ldc);   \
    NBG_PRAGMA(GCC unroll 16) for (int i = 0; i < MR; i++)                                  \
    NBG_PRAGMA(GCC unroll 4) for (int v = 0; v < NV; v++) r[i][v] = ZERO();                 \
    for (int64_t k = 0; k < kc; k++, a += MR, b += NV * VL) {                                \
      V bv[NV];                                                                              \
      NBG_PRAGMA(GCC unroll 4) for (int v = 0; v < NV; v++) bv[v] = LOAD(b + v * VL);       \
      NBG_PRAGMA(GCC unroll 16) for (int i = 0; i < MR; i++) {                              \
        V av = SET1(a[i]);                                                                   \
        NBG_PRAGMA(GCC unroll 4) for (int v = 0; v < NV; v++) r[i][v] = FMA(av, bv[v], r[i][v]); \
      }                                                                                      \
    }                                                                                        \
    NBG_PRAGMA(GCC unroll 16) for (int i = 0; i < MR; i++)                                  \
    NBG_PRAGMA(GCC unroll 4) for (int v = 0; v < NV; v++) {                                 \
      T *p = c + i * ldc + v * VL;                                                           \
      STORE(p, acc ? ADD(r[i][v], LOAD(p)) : r[i][v]);                                       \
    }                                                                                        \
  }

/* Plain C fallback: the compiler may vectorise the j loops. */
#define NBG_UKR_SCALAR(name, T, MR, NR)                                                      \
  static void name(int64_t kc, const void *ap, const void *bp, void *cp, int64_t ldc,        \
                   int acc) {                                                                \
    const T *a = ap, *b = bp;                                                                \
    T *c = cp, r[MR][NR] = {{0}};                                                            \
    for (int64_t k = 0; k < kc; k++, a += MR, b += NR)                                       \
      for (int i = 0; i < MR; i++)                                                           \
        for (int j = 0; j < NR; j++) r[i][j] += a[i] * b[j];                                 \
    for (int i = 0; i < MR; i++)                                                             \
      for (int j = 0; j < NR; j++) c[i * ldc + j] = acc ? c[i * ldc + j] + r[i][j] : r[i][j]; \
  }

#if defined(__AVX512F__)
#define NBG_ISA "avx512"
NBG_UKR_SIMD(nbg_ukr_f32, float, __m512, 12, 2, 16, _mm512_set1_ps, _mm512_loadu_ps,
             _mm512_storeu_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_setzero_ps)
NBG_UKR_SIMD(nbg_ukr_f64, double, __m512d, 12, 2, 8, _mm512_set1_pd, _mm512_loadu_pd,
             _mm512_storeu_pd, _mm512_fmadd_pd, _mm512_add_pd, _mm512_setzero_pd)
/* B block (KC x NC) ~ 768 KiB / 512 KiB: in L2; A micro-panel 18 / 24 KiB: in L1. */
static const int64_t nbg_blk_f32[5] = {12, 32, 384, 512, 1536};
static const int64_t nbg_blk_f64[5] = {12, 16, 256, 256, 768};
#elif defined(__AVX2__) && defined(__FMA__)
#define NBG_ISA "avx2"
NBG_UKR_SIMD(nbg_ukr_f32, float, __m256, 6, 2, 8, _mm256_set1_ps, _mm256_loadu_ps,
             _mm256_storeu_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_setzero_ps)
NBG_UKR_SIMD(nbg_ukr_f64, double, __m256d, 6, 2, 4, _mm256_set1_pd, _mm256_loadu_pd,
             _mm256_storeu_pd, _mm256_fmadd_pd, _mm256_add_pd, _mm256_setzero_pd)
static const int64_t nbg_blk_f32[5] = {6, 16, 256, 512, 1536};
static const int64_t nbg_blk_f64[5] = {6, 8, 256, 256, 768};
#else
#define NBG_ISA "scalar"
NBG_UKR_SCALAR(nbg_ukr_f32, float, 4, 8)
NBG_UKR_SCALAR(nbg_ukr_f64, double, 4, 8)
static const int64_t nbg_blk_f32[5] = {4, 8, 256, 256, 512};
static const int64_t nbg_blk_f64[5] = {4, 8, 256, 256, 512};
#endif

const char *nb_cpu_gemm_isa(void) { return NBG_ISA; }

/* Blocking of one accumulator type: register tile MR x NR, cache blocks KC
 * (depth), NC (columns of the packed B block), MC (rows of the packed A
 * block; a multiple of MR). */
typedef struct {
  int f64;          /* accumulator is f64 (else f32) */
  size_t esz;       /* accumulator size */
  int64_t mr, nr, kc, nc, mc;
  nbg_ukr_fn ukr;
} nbg_cfg;

static nbg_cfg nbg_cfg_for(int f64) {
  const int64_t *k = f64 ? nbg_blk_f64 : nbg_blk_f32;
  nbg_cfg c = {f64, f64 ? 8 : 4, k[0], k[1], k[2], k[3], k[4], f64 ? nbg_ukr_f64 : nbg_ukr_f32};
  return c;
}

void nb_cpu_gemm_tile(nb_dtype dt, int *mr, int *nr) {
  nbg_cfg c = nbg_cfg_for(dt == NB_F64);
  *mr = (int)c.mr;
  *nr = (int)c.nr;
}

/* ---- element conversion ------------------------------------------------- */
static inline float nbg_f16(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return nb_f16_to_f32(h);
#endif
}

static inline float nbg_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* n contiguous f16 or bf16 values into f32: vector conversions. */
static void nbg_cvt16_unit(float *d, const uint16_t *s, int64_t n, nb_dtype dt) {
  int64_t i = 0;
  if (dt == NB_BF16) {
    for (; i < n; i++) { /* vectorises: a widening shift */
      uint32_t u = (uint32_t)s[i] << 16;
      memcpy(d + i, &u, 4);
    }
    return;
  }
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
#endif
  for (; i < n; i++) d[i] = nbg_f16(s[i]);
}

/* n elements, source stride ss, into f32 with destination stride ds. */
static void nbg_cvt_f32(float *d, int64_t ds, const void *src, int64_t ss, int64_t n,
                        nb_dtype dt) {
  if (ds == 1 && ss == 1 && dt != NB_F32) {
    nbg_cvt16_unit(d, src, n, dt);
  } else if (dt == NB_F32 && ds == 1 && ss == 1) {
    memcpy(d, src, (size_t)n * 4);
  } else if (dt == NB_F32) {
    const float *s = src;
    for (int64_t i = 0; i < n; i++) d[i * ds] = s[i * ss];
  } else if (dt == NB_F16) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) d[i * ds] = nbg_f16(s[i * ss]);
  } else {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) d[i * ds] = nbg_bf16(s[i * ss]);
  }
}

static void nbg_cvt_f64(double *d, int64_t ds, const void *src, int64_t ss, int64_t n) {
  const double *s = src;
  if (ds == 1 && ss == 1) memcpy(d, s, (size_t)n * 8);
  else for (int64_t i = 0; i < n; i++) d[i * ds] = s[i * ss];
}

/* Converts n source elements (stride ss) into the accumulator type. */
static void nbg_cvt(const nbg_cfg *cf, void *d, int64_t ds, const char *s, int64_t ss,
                    int64_t n, nb_dtype dt) {
  if (cf->f64) nbg_cvt_f64(d, ds, s, ss, n);
  else nbg_cvt_f32(d, ds, s, ss, n, dt);
}

/* Rounds one accumulator value into out's dtype. */
static void nbg_put(char *p, nb_dtype dt, double v) {
  switch (dt) {
    case NB_F64: *(double *)p = v; break;
    case NB_F32: *(float *)p = (float)v; break;
    case NB_F16: *(uint16_t *)p = nb_f32_to_f16((float)v); break;
    default: *(uint16_t *)p = nb_f32_to_bf16((float)v); break;
  }
}

/* ---- one matrix (or a block of one) ------------------------------------ */
typedef struct {
  int64_t M, N, K;
  const char *a; int64_t sam, sak;   /* strides in elements */
  const char *b; int64_t sbk, sbn;
  char *c; int64_t scm, scn;
  nb_dtype dt;                       /* dtype of a, b and c */
  size_t isz;                        /* its size */
} nbg_prob;

#if defined(__SSE2__)
/* Packs r rows (r a multiple of 4) of kc contiguous f32 values, rows s_in
 * apart, k-major: 4x4 blocks transposed in registers, so that the k-major
 * stores are whole vectors (row-major A, transposed B). */
static void nbg_pack_t4(float *dst, const float *s, int64_t r, int64_t kc, int64_t s_in) {
  int64_t k = 0;
  for (; k + 4 <= kc; k += 4)
    for (int64_t i = 0; i < r; i += 4) {
      const float *q = s + i * s_in + k;
      __m128 r0 = _mm_loadu_ps(q), r1 = _mm_loadu_ps(q + s_in);
      __m128 r2 = _mm_loadu_ps(q + 2 * s_in), r3 = _mm_loadu_ps(q + 3 * s_in);
      _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
      float *d = dst + k * r + i;
      _mm_storeu_ps(d, r0);
      _mm_storeu_ps(d + r, r1);
      _mm_storeu_ps(d + 2 * r, r2);
      _mm_storeu_ps(d + 3 * r, r3);
    }
  for (; k < kc; k++)
    for (int64_t i = 0; i < r; i++) dst[k * r + i] = s[i * s_in + k];
}
#define NBG_HAVE_T4 1
#else
#define NBG_HAVE_T4 0
#endif

/* Packs an n x kc block (element (i, k) at src + (i*s_in + k*s_k)*isz) into
 * ceil(n/r) micro-panels of r x kc, k-major, zero-padded to r rows. The loop
 * order follows the unit-stride direction of the source. */
static void nbg_pack(const nbg_cfg *cf, char *dst, const char *src, nb_dtype dt, size_t isz,
                     int64_t n, int64_t r, int64_t kc, int64_t s_in, int64_t s_k) {
  for (int64_t p0 = 0; p0 < n; p0 += r) {
    int64_t rows = n - p0 < r ? n - p0 : r;
    const char *s = src + (size_t)(p0 * s_in) * isz;
    if (s_in == 1 && rows == r && isz == cf->esz && r * cf->esz == 128) {
      /* The common row-major B panel: one fixed-size (inlined) copy per k. */
      for (int64_t k = 0; k < kc; k++)
        memcpy(dst + (size_t)(k * 128), s + (size_t)(k * s_k) * isz, 128);
    } else if (NBG_HAVE_T4 && dt == NB_F32 && !cf->f64 && s_k == 1 && rows == r && r % 4 == 0) {
#if NBG_HAVE_T4
      nbg_pack_t4((float *)dst, (const float *)s, r, kc, s_in);
#endif
    } else if (s_in == 1 && s_k != 1) {
      for (int64_t k = 0; k < kc; k++)
        nbg_cvt(cf, dst + (size_t)(k * r) * cf->esz, 1, s + (size_t)(k * s_k) * isz, 1, rows, dt);
    } else {
      for (int64_t i = 0; i < rows; i++)
        nbg_cvt(cf, dst + (size_t)i * cf->esz, r, s + (size_t)(i * s_in) * isz, s_k, kc, dt);
    }
    if (rows < r)
      for (int64_t k = 0; k < kc; k++)
        memset(dst + (size_t)(k * r + rows) * cf->esz, 0, (size_t)(r - rows) * cf->esz);
    dst += (size_t)(r * kc) * cf->esz;
  }
}

/* A partial tile (mr x nr of the MR x NR tile t) into C. */
static void nbg_edge(const nbg_cfg *cf, char *c, int64_t ldc, const char *t, int64_t mr,
                     int64_t nr, int acc) {
  for (int64_t i = 0; i < mr; i++) {
    if (cf->f64) {
      double *d = (double *)c + i * ldc;
      const double *s = (const double *)t + i * cf->nr;
      for (int64_t j = 0; j < nr; j++) d[j] = acc ? d[j] + s[j] : s[j];
    } else {
      float *d = (float *)c + i * ldc;
      const float *s = (const float *)t + i * cf->nr;
      for (int64_t j = 0; j < nr; j++) d[j] = acc ? d[j] + s[j] : s[j];
    }
  }
}

/* The packed product of an mc x kc A block and a kc x nc B block into C. */
static void nbg_macro(const nbg_cfg *cf, const char *ap, const char *bp, char *c, int64_t ldc,
                      int64_t mc, int64_t nc, int64_t kc, int acc) {
  _Alignas(64) char tile[12 * 32 * 8];
  for (int64_t ir = 0; ir < mc; ir += cf->mr) {
    int64_t mr = mc - ir < cf->mr ? mc - ir : cf->mr;
    const char *a = ap + (size_t)(ir * kc) * cf->esz;
    for (int64_t jr = 0; jr < nc; jr += cf->nr) {
      int64_t nr = nc - jr < cf->nr ? nc - jr : cf->nr;
      const char *b = bp + (size_t)(jr * kc) * cf->esz;
      char *cc = c + (size_t)(ir * ldc + jr) * cf->esz;
      if (mr == cf->mr && nr == cf->nr) {
        cf->ukr(kc, a, b, cc, ldc, acc);
      } else {
        cf->ukr(kc, a, b, tile, cf->nr, 0);
        nbg_edge(cf, cc, ldc, tile, mr, nr, acc);
      }
    }
  }
}

/* Per-thread buffers, kept between calls (the OpenMP threads persist), so a
 * stream of small matmuls does not allocate. Slot 0: packed A, 1: packed B,
 * 2: C workspace, 3: direct-path row. NULL when out of memory. */
static _Thread_local struct { void *p; size_t cap; } nbg_bufs[4];

static void *nbg_buf(int slot, size_t n) {
  n = (n + 63) & ~(size_t)63;
  if (nbg_bufs[slot].cap < n) {
    free(nbg_bufs[slot].p);
    nbg_bufs[slot].p = aligned_alloc(64, n);
    nbg_bufs[slot].cap = nbg_bufs[slot].p ? n : 0;
  }
  return nbg_bufs[slot].p;
}

/* Gives back a buffer too large to keep for the next call. */
static void nbg_trim(int slot) {
  if (nbg_bufs[slot].cap <= ((size_t)16 << 20)) return;
  free(nbg_bufs[slot].p);
  nbg_bufs[slot].p = NULL;
  nbg_bufs[slot].cap = 0;
}

/* The packed path into C (accumulator type, row stride ldc, unit columns). */
static int nbg_packed(const nbg_cfg *cf, const nbg_prob *p, char *c, int64_t ldc) {
  int64_t mcb = p->M < cf->mc ? p->M : cf->mc, kcb = p->K < cf->kc ? p->K : cf->kc;
  int64_t ncb = p->N < cf->nc ? p->N : cf->nc;
  int64_t mcp = (mcb + cf->mr - 1) / cf->mr * cf->mr, ncp = (ncb + cf->nr - 1) / cf->nr * cf->nr;
  char *ap = nbg_buf(0, (size_t)(mcp * kcb) * cf->esz);
  char *bp = nbg_buf(1, (size_t)(ncp * kcb) * cf->esz);
  if (!ap || !bp) return -1;
  for (int64_t ic = 0; ic < p->M; ic += cf->mc) {
    int64_t mc = p->M - ic < cf->mc ? p->M - ic : cf->mc;
    for (int64_t pc = 0; pc < p->K; pc += cf->kc) {
      int64_t kc = p->K - pc < cf->kc ? p->K - pc : cf->kc;
      nbg_pack(cf, ap, p->a + (size_t)(ic * p->sam + pc * p->sak) * p->isz, p->dt, p->isz, mc,
               cf->mr, kc, p->sam, p->sak);
      for (int64_t jc = 0; jc < p->N; jc += cf->nc) {
        int64_t nc = p->N - jc < cf->nc ? p->N - jc : cf->nc;
        nbg_pack(cf, bp, p->b + (size_t)(pc * p->sbk + jc * p->sbn) * p->isz, p->dt, p->isz,
                 nc, cf->nr, kc, p->sbn, p->sbk);
        nbg_macro(cf, ap, bp, c + (size_t)(ic * ldc + jc) * cf->esz, ldc, mc, nc, kc, pc > 0);
      }
    }
  }
  return 0;
}

/* The direct path for small or skinny products: row i of C accumulates
 * a[i,k] * b[k,:] over k (reading B rows in place when they are unit-stride
 * in the accumulator type, converting them into a row buffer otherwise). */
static int nbg_direct(const nbg_cfg *cf, const nbg_prob *p, char *c, int64_t ldc) {
  int inplace = p->sbn == 1 && p->isz == cf->esz;
  char *brow = inplace ? NULL : nbg_buf(3, (size_t)p->N * cf->esz);
  if (!inplace && !brow) return -1;
  for (int64_t i = 0; i < p->M; i++) {
    char *crow = c + (size_t)(i * ldc) * cf->esz;
    memset(crow, 0, (size_t)p->N * cf->esz);
    for (int64_t k = 0; k < p->K; k++) {
      const char *bk = p->b + (size_t)(k * p->sbk) * p->isz;
      if (!inplace) nbg_cvt(cf, brow, 1, bk, p->sbn, p->N, p->dt);
      const char *bsrc = inplace ? bk : brow;
      const char *aik = p->a + (size_t)(i * p->sam + k * p->sak) * p->isz;
      if (cf->f64) {
        double av = *(const double *)aik, *cr = (double *)crow;
        const double *br = (const double *)bsrc;
        for (int64_t j = 0; j < p->N; j++) cr[j] += av * br[j];
      } else {
        float av, *cr = (float *)crow;
        nbg_cvt_f32(&av, 1, aik, 1, 1, p->dt);
        const float *br = (const float *)bsrc;
        for (int64_t j = 0; j < p->N; j++) cr[j] += av * br[j];
      }
    }
  }
  return 0;
}

#if defined(__AVX512F__)
/* The in-place path for small f32 products with unit-stride rows of A and
 * B (the batched matmuls of attention): no packing, the micro-kernel reads
 * 12 rows of A and 32 columns of B where they lie. Rows past M repeat the
 * last row (results discarded); columns past N are masked off, so nothing
 * outside the operands is read or written. */
#define NBG_SMALL_TILE(name, MR, NV)                                                         \
  static void name(int64_t kc, const float *a, int64_t lda, int64_t mr, const float *b,     \
                   int64_t ldb, int64_t nr, float *c, int64_t ldc) {                        \
    __mmask16 m[2];                                                                          \
    m[0] = nr >= 16 ? 0xFFFF : (__mmask16)((1u << nr) - 1);                                 \
    m[1] = nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);           \
    int64_t off[MR];                                                                         \
    for (int i = 0; i < MR; i++) off[i] = (i < mr ? i : mr - 1) * lda;                      \
    __m512 r[MR][NV];                                                                        \
    NBG_PRAGMA(GCC unroll 12) for (int i = 0; i < MR; i++)                                  \
    NBG_PRAGMA(GCC unroll 2) for (int v = 0; v < NV; v++) r[i][v] = _mm512_setzero_ps();   \
    for (int64_t k = 0; k < kc; k++, a++, b += ldb) {                                        \
      __m512 bv[NV];                                                                         \
      NBG_PRAGMA(GCC unroll 2) for (int v = 0; v < NV; v++)                                 \
        bv[v] = _mm512_maskz_loadu_ps(m[v], b + 16 * v);                                     \
      NBG_PRAGMA(GCC unroll 12) for (int i = 0; i < MR; i++) {                              \
        __m512 av = _mm512_set1_ps(a[off[i]]);                                               \
        NBG_PRAGMA(GCC unroll 2) for (int v = 0; v < NV; v++)                               \
          r[i][v] = _mm512_fmadd_ps(av, bv[v], r[i][v]);                                     \
      }                                                                                      \
    }                                                                                        \
    NBG_PRAGMA(GCC unroll 12) for (int i = 0; i < MR; i++) {                                \
      if (i >= mr) break;                                                                    \
      NBG_PRAGMA(GCC unroll 2) for (int v = 0; v < NV; v++)                                 \
        _mm512_mask_storeu_ps(c + i * ldc + 16 * v, m[v], r[i][v]);                          \
    }                                                                                        \
  }
/* 12 rows, and narrower tiles for the last rows so no work is wasted;
 * 16-column tiles for outputs of at most 16 columns (attention's @ v). */
NBG_SMALL_TILE(nbg_small_tile12, 12, 2)
NBG_SMALL_TILE(nbg_small_tile8, 8, 2)
NBG_SMALL_TILE(nbg_small_tile4, 4, 2)
NBG_SMALL_TILE(nbg_small_tile12n, 12, 1)
NBG_SMALL_TILE(nbg_small_tile8n, 8, 1)
NBG_SMALL_TILE(nbg_small_tile4n, 4, 1)

typedef void (*nbg_small_fn)(int64_t, const float *, int64_t, int64_t, const float *, int64_t,
                             int64_t, float *, int64_t);

/* B is read in place when its rows are unit-stride, else (a transposed k
 * in q @ k^T) packed first into 32-column panels: K*N is small here. */
static int nbg_small(const nbg_cfg *cf, const nbg_prob *p, char *c, int64_t ldc) {
  const float *a = (const float *)p->a, *b = (const float *)p->b, *bp = NULL;
  float *cf32 = (float *)c;
  if (p->sbn != 1) {
    bp = nbg_buf(1, (size_t)((p->N + 31) / 32 * 32 * p->K) * 4);
    if (!bp) return -1;
    nbg_pack(cf, (char *)bp, p->b, p->dt, p->isz, p->N, 32, p->K, p->sbn, p->sbk);
  }
  for (int64_t j = 0; j < p->N; j += 32) {
    int64_t nr = p->N - j < 32 ? p->N - j : 32;
    const float *bj = bp ? bp + j * p->K : b + j;
    int64_t ldb = bp ? 32 : p->sbk;
    for (int64_t i = 0; i < p->M; i += 12) {
      int64_t mr = p->M - i < 12 ? p->M - i : 12;
      nbg_small_fn f = nr > 16 ? (mr > 8 ? nbg_small_tile12 : mr > 4 ? nbg_small_tile8 : nbg_small_tile4)
                               : (mr > 8 ? nbg_small_tile12n : mr > 4 ? nbg_small_tile8n : nbg_small_tile4n);
      f(p->K, a + i * p->sam, p->sam, mr, bj, ldb, nr, cf32 + i * ldc + j, ldc);
    }
  }
  return 0;
}

/* Small enough that packing would cost a noticeable share of the time,
 * with B small enough to stay in L1/L2; A is read in place. */
static int nbg_use_small(const nbg_cfg *cf, const nbg_prob *p) {
  return !cf->f64 && cf->nr == 32 && p->dt == NB_F32 && p->sak == 1 && p->K <= 256 &&
         p->K * p->N <= 16384 && p->M <= 512;
}
#else
static int nbg_use_small(const nbg_cfg *cf, const nbg_prob *p) { (void)cf; (void)p; return 0; }
#define nbg_small nbg_packed
#endif

/* Packing costs O(MK + KN) against O(MNK) work, and a tile wider than the
 * matrix wastes lanes; below these sizes the direct loop wins. */
static int nbg_use_direct(const nbg_cfg *cf, const nbg_prob *p) {
  return p->M * p->N * p->K < 8192 || p->M < 4 || p->N < cf->nr / 2;
}

/* One product into out: straight into out when it already is an
 * accumulator-typed, unit-column-stride matrix, else through a workspace
 * rounded once into out's dtype. */
typedef int (*nbg_path_fn)(const nbg_cfg *, const nbg_prob *, char *, int64_t);

/* The path is chosen once per matrix, never per block of a split matrix:
 * every path sums over k in the same order whatever the split, so results
 * do not depend on the number of threads. */
static nbg_path_fn nbg_path_for(const nbg_cfg *cf, const nbg_prob *p) {
  return nbg_use_direct(cf, p) ? nbg_direct : nbg_use_small(cf, p) ? nbg_small : nbg_packed;
}

static int nbg_solve(const nbg_cfg *cf, nbg_path_fn path, const nbg_prob *p) {
  int direct_out = p->isz == cf->esz && p->scn == 1;
  char *c = direct_out ? p->c : nbg_buf(2, (size_t)(p->M * p->N) * cf->esz);
  int64_t ldc = direct_out ? p->scm : p->N;
  if (!c) return -1;
  if (path(cf, p, c, ldc)) return -1;
  if (direct_out) return 0;
  for (int64_t i = 0; i < p->M; i++)
    for (int64_t j = 0; j < p->N; j++) {
      const char *s = c + (size_t)(i * ldc + j) * cf->esz;
      double v = cf->f64 ? *(const double *)s : (double)*(const float *)s;
      nbg_put(p->c + (size_t)(i * p->scm + j * p->scn) * p->isz, p->dt, v);
    }
  nbg_trim(2);
  return 0;
}

/* ---- the kernel entry --------------------------------------------------- */
typedef struct {
  nbg_prob m;                     /* one matrix, batch offset 0 */
  int nbd;                        /* batch axes */
  const int64_t *shape;           /* out's batch shape */
  const int64_t *sa, *sb, *sc;    /* batch strides */
  int64_t mt, nt, mchunk, nchunk; /* row/column split of each matrix */
  nbg_path_fn path;               /* chosen for the whole matrix */
} nbg_job;

/* Task t: batch entry t / (mt*nt), then its row and column block. */
static int nbg_task(const nbg_cfg *cf, const nbg_job *jb, int64_t t) {
  int64_t bi = t / (jb->mt * jb->nt), r = t % (jb->mt * jb->nt);
  int64_t oa = 0, ob = 0, oc = 0;
  for (int d = jb->nbd - 1; d >= 0; d--) {
    int64_t ix = bi % jb->shape[d];
    bi /= jb->shape[d];
    oa += ix * jb->sa[d]; ob += ix * jb->sb[d]; oc += ix * jb->sc[d];
  }
  nbg_prob p = jb->m;
  int64_t m0 = (r / jb->nt) * jb->mchunk, n0 = (r % jb->nt) * jb->nchunk;
  p.M = p.M - m0 < jb->mchunk ? p.M - m0 : jb->mchunk;
  p.N = p.N - n0 < jb->nchunk ? p.N - n0 : jb->nchunk;
  if (p.M <= 0 || p.N <= 0) return 0;
  p.a += (size_t)(oa + m0 * p.sam) * p.isz;
  p.b += (size_t)(ob + n0 * p.sbn) * p.isz;
  p.c += (size_t)(oc + m0 * p.scm + n0 * p.scn) * p.isz;
  return nbg_solve(cf, jb->path, &p);
}

/* Splits each matrix so that there are at least nthr balanced tasks: whole
 * matrices when the batch alone balances, else row blocks (or column blocks
 * for short wide outputs), aligned to the register tile. Tasks share no
 * packed data, so a call has no barrier but its end: each thread packs the
 * B blocks it needs itself (O(K*N) more per thread, a few per cent at
 * 1024), which keeps a thread that the OS deschedules from stalling the
 * others on a shared machine. */
static void nbg_split(const nbg_cfg *cf, nbg_job *jb, int64_t nbatch, int nthr) {
  int64_t M = jb->m.M, N = jb->m.N;
  jb->mt = jb->nt = 1;
  jb->mchunk = M;
  jb->nchunk = N;
  if (nthr <= 1 || nbatch % nthr == 0 || nbatch >= 4 * nthr) return;
  if (M >= 2 * nthr * cf->mr) {
    jb->mchunk = ((M + nthr - 1) / nthr + cf->mr - 1) / cf->mr * cf->mr;
    jb->mt = (M + jb->mchunk - 1) / jb->mchunk;
  } else if (N >= 2 * nthr * cf->nr) {
    jb->nchunk = ((N + nthr - 1) / nthr + cf->nr - 1) / cf->nr * cf->nr;
    jb->nt = (N + jb->nchunk - 1) / jb->nchunk;
  }
}

/* Writes zeros into every element of out (K == 0). */
static void nbg_zero(const nb_kview *o) {
  int64_t n = 1;
  for (int d = 0; d < o->ndim; d++) n *= o->shape[d];
  size_t isz = nb_dtype_size(o->dtype);
  for (int64_t e = 0; e < n; e++) {
    int64_t r = e, off = 0;
    for (int d = o->ndim - 1; d >= 0; d--) {
      off += (r % o->shape[d]) * o->strides[d];
      r /= o->shape[d];
    }
    nbg_put((char *)o->data + (size_t)off * isz, o->dtype, 0.0);
  }
}

static int nbg_float(nb_dtype d) {
  return d == NB_F64 || d == NB_F32 || d == NB_F16 || d == NB_BF16;
}

static nb_status nbg_check(const nb_kview *o, const nb_kview *a, const nb_kview *b) {
  int nd = o->ndim;
  if (!nbg_float(o->dtype) || a->dtype != o->dtype || b->dtype != o->dtype)
    return nb_error_set(NB_ERR_DTYPE, "matmul (cpu): dtypes out %s, a %s, b %s (expected one "
                        "float dtype)", nb_dtype_name(o->dtype), nb_dtype_name(a->dtype),
                        nb_dtype_name(b->dtype));
  if (nd < 2 || a->ndim != nd || b->ndim != nd || a->shape[nd - 2] != o->shape[nd - 2] ||
      b->shape[nd - 1] != o->shape[nd - 1] || a->shape[nd - 1] != b->shape[nd - 2])
    return nb_error_set(NB_ERR_SHAPE, "matmul (cpu): kernel views of ranks out %d, a %d, b %d "
                        "do not form (.., M, K) @ (.., K, N) -> (.., M, N)", nd, a->ndim, b->ndim);
  return NB_OK;
}

/* A column-major out is computed as out^T = b^T a^T, so that the micro-
 * kernel stores along unit-stride rows (batch strides of a and b swap too). */
static void nbg_orient(nbg_job *jb) {
  nbg_prob *p = &jb->m, t = jb->m;
  if (p->scn == 1 || p->scm != 1 || p->N == 1) return;
  p->M = t.N; p->N = t.M;
  p->a = t.b; p->sam = t.sbn; p->sak = t.sbk;
  p->b = t.a; p->sbk = t.sak; p->sbn = t.sam;
  p->scm = t.scn; p->scn = t.scm;
  const int64_t *s = jb->sa;
  jb->sa = jb->sb;
  jb->sb = s;
}

/* Contention backoff. On a shared machine another process may hold a CPU
 * that an OpenMP worker needs; the call then ends only when that worker is
 * scheduled (with spinning waiters, often a scheduler tick: milliseconds
 * for a call of microseconds). A call that waited over 1 ms, and over a
 * quarter of its time, for a late thread makes the next 250 ms of calls
 * run on one thread; then threads are tried again. Results do not change
 * (see nbg_path_for), only the speed. */
#ifndef NBG_BACKOFF_US /* -DNBG_BACKOFF_US=0 turns it off, for measurements */
#define NBG_BACKOFF_US 250000
#endif
static _Atomic int64_t nbg_serial_until_us;

static int64_t nbg_now_us(void) { return (int64_t)(omp_get_wtime() * 1e6); }

/* Runs the tasks on nthr threads; returns nonzero if one failed. */
static int nbg_run(const nbg_cfg *cf, const nbg_job *jb, int64_t ntask, int nthr) {
  int failed = 0;
  double busy = 0, t0 = omp_get_wtime();
#pragma omp parallel num_threads(nthr) if (nthr > 1 && ntask > 1) reduction(| : failed) \
    reduction(max : busy)
  {
    double b0 = omp_get_wtime();
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t t = 0; t < ntask; t++) failed |= nbg_task(cf, jb, t) != 0;
    busy = omp_get_wtime() - b0;
  }
  double wall = omp_get_wtime() - t0, late = wall - busy;
  if (nthr > 1 && ntask > 1 && late > 1e-3 && late > 0.25 * wall)
    nbg_serial_until_us = nbg_now_us() + NBG_BACKOFF_US;
  return failed;
}

/* ---- autotuning of the packed path's blocking --------------------------
 * Config 0 is the blocking above (the heuristic, used when tuning is off);
 * the others halve or double KC or NC. Blocking changes only which packed
 * blocks are formed: within a KC block the sum over k runs in the same
 * order, and the KC blocks are added in order, so a config changes results
 * at most by rounding (KC moves the points where partial sums are added). */
#define NBG_NCONF 5
static const char *const nbg_conf_names[NBG_NCONF] = {"default", "kc/2", "kc*2", "nc/2",
                                                       "nc*2"};

static nbg_cfg nbg_blocking(nbg_cfg c, int i) {
  if (i == 1) c.kc /= 2;
  else if (i == 2) c.kc *= 2;
  else if (i == 3) c.nc = (c.nc / 2 + c.nr - 1) / c.nr * c.nr;
  else if (i == 4) c.nc *= 2;
  return c;
}

/* One matrix of the job (batch entry 0) into a scratch output, allocated
 * on the first timing, so a cached choice costs no allocation. */
typedef struct {
  nbg_cfg cf;
  nbg_job jb;
  int nthr;
  void *scratch;
} nbg_tune_ctx;

static double nbg_time(void *ctx, int i) {
  nbg_tune_ctx *t = ctx;
  nbg_prob *p = &t->jb.m;
  if (!t->scratch && !(t->scratch = malloc((size_t)(p->M * p->N) * p->isz))) return -1;
  nbg_cfg cf = nbg_blocking(t->cf, i);
  nbg_job jb = t->jb;
  jb.nbd = 0;
  jb.m.c = t->scratch;
  jb.m.scm = p->N;
  jb.m.scn = 1;
  nbg_split(&cf, &jb, 1, t->nthr);
  double t0 = omp_get_wtime();
  if (nbg_run(&cf, &jb, jb.mt * jb.nt, t->nthr)) return -1;
  return omp_get_wtime() - t0;
}

/* The blocking config for the job: cached, tuned (NABLA_AUTOTUNE=1) or 0.
 * The key: ISA, dtype, A/B layout (row- or column-major after orienting)
 * and M x N x K rounded up to powers of two; not the thread count, so that
 * results on 1 and on all threads stay identical (see nbg_path_for). */
static int nbg_tuned(const nbg_cfg *cf, const nbg_job *jb, int nthr) {
  const nbg_prob *p = &jb->m;
  char key[160], layout[32];
  snprintf(layout, sizeof layout, "a%c-b%c", p->sak == 1 ? 'r' : 'c', p->sbn == 1 ? 'r' : 'c');
  if (!nb_tune_key(key, sizeof key, "cpu-" NBG_ISA, "matmul", nb_dtype_name(p->dt), layout, 3,
                   (int64_t[]){p->M, p->N, p->K}))
    return 0;
  nbg_tune_ctx t = {*cf, *jb, nthr, NULL};
  int i = nb_tune_pick(key, NBG_NCONF, nbg_conf_names, nbg_time, &t, 0);
  free(t.scratch);
  return i;
}

nb_status nb_cpu_matmul(const nb_kview *out, const nb_kview *a, const nb_kview *b) {
  nb_status st = nbg_check(out, a, b);
  if (st) return st;
  int nd = out->ndim;
  nbg_job jb = {.m = {out->shape[nd - 2], out->shape[nd - 1], a->shape[nd - 1],
                      a->data, a->strides[nd - 2], a->strides[nd - 1],
                      b->data, b->strides[nd - 2], b->strides[nd - 1],
                      out->data, out->strides[nd - 2], out->strides[nd - 1],
                      out->dtype, nb_dtype_size(out->dtype)},
                .nbd = nd - 2, .shape = out->shape, .sa = a->strides, .sb = b->strides,
                .sc = out->strides};
  int64_t nbatch = 1;
  for (int d = 0; d < nd - 2; d++) nbatch *= out->shape[d];
  if (nbatch == 0 || jb.m.M == 0 || jb.m.N == 0) return NB_OK;
  if (jb.m.K == 0) { nbg_zero(out); return NB_OK; }
  nbg_orient(&jb);
  nbg_cfg cf = nbg_cfg_for(out->dtype == NB_F64);
  double flops = 2.0 * (double)nbatch * (double)jb.m.M * (double)jb.m.N * (double)jb.m.K;
  int nthr = flops < 3e5 ? 1 : omp_get_max_threads();
  if (nthr > 1 && nbg_now_us() < nbg_serial_until_us) nthr = 1;
  jb.path = nbg_path_for(&cf, &jb.m);
  if (jb.path == nbg_packed && (out->dtype == NB_F32 || out->dtype == NB_F64) &&
      nb_tune_active()) /* tuning off, nothing cached: config 0 */
    cf = nbg_blocking(cf, nbg_tuned(&cf, &jb, nthr));
  nbg_split(&cf, &jb, nbatch, nthr);
  if (nbg_run(&cf, &jb, nbatch * jb.mt * jb.nt, nthr))
    return nb_error_set(NB_ERR_OOM, "matmul (cpu): out of memory for packing buffers "
                        "(M=%lld, N=%lld, K=%lld, %s)", (long long)jb.m.M, (long long)jb.m.N,
                        (long long)jb.m.K, nb_dtype_name(out->dtype));
  return NB_OK;
}
