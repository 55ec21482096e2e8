/* Matmul through cuBLASLt: out (B.., M, N) = a (B.., M, K) @ b (B.., K, N).
 *
 * f32 uses CUBLAS_COMPUTE_32F (exact f32, no TF32), f16/bf16 f32 compute with
 * f32 scaling, f64 CUBLAS_COMPUTE_64F. cuBLASLt is column-major; a row-major
 * view is the transpose of a column-major one, so each operand is described
 * as op(S) with S column-major and a leading dimension taken from its
 * strides: a transposed or sliced view costs no copy. Two formulations are
 * tried for the output (out^T = b^T a^T when out's rows are contiguous,
 * out = a b when its columns are); an operand whose strides fit neither
 * layout is copied to a contiguous buffer first. Batch axes are coalesced;
 * one uniform batch stride (0 for a broadcast operand) becomes cuBLASLt's
 * strided batch, further batch axes a loop of calls. */
#include <pthread.h>
#include <string.h>

#include "backend/cuda/cuda_blaslt.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/gemm_sm90.h"
#include "backend/cuda/gemm_sm80.h"

#include <stdlib.h>
#include <string.h>

/* GEMM backend: 0 cuBLASLt; 1 nabla's own kernels where they apply
 * (gemm_sm90.cu on 9.0, gemm_sm80.cu on other devices >= 8.0), cuBLASLt
 * otherwise; 2 unset: the own sm_90a kernel on 9.0 (0.83-1.01x cuBLASLt on
 * the GPT-2 shapes, 1.26x with a fused epilogue), cuBLASLt elsewhere (the
 * portable kernel measured 0.34-0.41x of it on the H100), products with a
 * fused epilogue the own kernel everywhere it applies; 3 the portable
 * gemm_sm80.cu kernel on every device >= 8.0.
 * NABLA_GEMM=own|sm80|cublaslt, read at first use; nb_cuda_set_gemm_backend
 * overrides it. */
static int lt_backend = -1;

extern "C" void nb_cuda_set_gemm_backend(int own) { lt_backend = own == 2 ? 3 : own ? 1 : 0; }

static int lt_mode(void) {
  if (lt_backend < 0) {
    const char *e = getenv("NABLA_GEMM");
    lt_backend = !e ? 2 : !strcmp(e, "own") ? 1 : !strcmp(e, "sm80") ? 3 : !strcmp(e, "cublaslt") ? 0 : 2;
  }
  return lt_backend;
}

/* A logical R x C matrix (element (r, c) at r*sr + c*sc) as op(S), S
 * column-major rows x cols with leading dimension ld. */
typedef struct {
  int ok;
  cublasOperation_t op;
  int64_t rows, cols, ld;
} nb_lt_mat;

static nb_lt_mat lt_describe(int64_t R, int64_t C, int64_t sr, int64_t sc) {
  nb_lt_mat m = {0, CUBLAS_OP_N, 0, 0, 0};
  if ((sr == 1 || R == 1) && (C == 1 || sc >= (R > 1 ? R : 1))) {
    m.ok = 1;
    m.op = CUBLAS_OP_N;
    m.rows = R;
    m.cols = C;
    m.ld = C == 1 ? (R > 1 ? R : 1) : sc;
  } else if ((sc == 1 || C == 1) && (R == 1 || sr >= (C > 1 ? C : 1))) {
    m.ok = 1;
    m.op = CUBLAS_OP_T;
    m.rows = C;
    m.cols = R;
    m.ld = R == 1 ? (C > 1 ? C : 1) : sr;
  }
  return m;
}

/* Largest power of two (<= 256) dividing every byte address used. */
static uint32_t lt_align(const void *p, int64_t stride_bytes) {
  uint64_t v = (uint64_t)(uintptr_t)p | (uint64_t)(stride_bytes < 0 ? -stride_bytes : stride_bytes) | 256u;
  return (uint32_t)(v & (~v + 1));
}

typedef struct {
  cudaDataType_t dt;
  cublasComputeType_t compute;
  cudaDataType_t scale;
  size_t es;
} nb_lt_types;

static int lt_types(nb_dtype dt, nb_lt_types *t) {
  switch (dt) {
  case NB_F32: *t = (nb_lt_types){CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, 4}; return 1;
  case NB_F16: *t = (nb_lt_types){CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, 2}; return 1;
  case NB_BF16: *t = (nb_lt_types){CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, 2}; return 1;
  case NB_F64: *t = (nb_lt_types){CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F, 8}; return 1;
  default: return 0;
  }
}

static nb_status lt_check(cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return NB_OK;
  return nb_error_set(NB_ERR_BACKEND, "cuda matmul: %s failed: %s (status %d)", what,
                      nb_blaslt_status_string(s), (int)s);
}

/* One cuBLASLt call: D (m x n) = op(A) (m x k) op(B) (k x n), count batches. */
typedef struct {
  nb_lt_mat A, B, D;
  const void *pa, *pb;
  void *pd;
  int64_t m, n, k, count, sA, sB, sD; /* batch strides in elements */
} nb_lt_call;

static nb_status lt_layout(const nb_blaslt_api *lt, cublasLtMatrixLayout_t *l, const nb_lt_types *t,
                           const nb_lt_mat *mt, int64_t count, int64_t stride) {
  nb_status st = lt_check(lt->MatrixLayoutCreate(l, t->dt, (uint64_t)mt->rows,
                                              (uint64_t)mt->cols, mt->ld), "layout");
  if (st || count <= 1) return st;
  int32_t c = (int32_t)count;
  st = lt_check(lt->MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c, sizeof c),
                "layout batch count");
  if (!st)
    st = lt_check(lt->MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                               &stride, sizeof stride), "layout batch stride");
  return st;
}

/* The heuristic query costs far more than a small matmul's launch, and a
 * training step repeats the same shapes: its answer is cached per problem
 * (types, operations, layouts, batch, alignments; one device, one
 * workspace size), so each shape is looked up once per process. */
typedef struct { int64_t v[20]; } lt_key;

static void lt_key_of(lt_key *k, const nb_lt_types *t, const nb_lt_call *c, const uint32_t *al) {
  memset(k, 0, sizeof *k);
  int64_t *v = k->v;
  v[0] = t->dt; v[1] = t->compute; v[2] = t->scale;
  v[3] = c->A.op; v[4] = c->A.rows; v[5] = c->A.cols; v[6] = c->A.ld;
  v[7] = c->B.op; v[8] = c->B.rows; v[9] = c->B.cols; v[10] = c->B.ld;
  v[11] = c->D.rows; v[12] = c->D.cols; v[13] = c->D.ld;
  v[14] = c->count; v[15] = c->sA; v[16] = c->sB; v[17] = c->sD;
  v[18] = al[0] | (int64_t)al[1] << 16 | (int64_t)al[2] << 32;
  int dev = 0;
  cudaGetDevice(&dev);
  v[19] = dev;
}

#define LT_CACHE 512
static pthread_mutex_t lt_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  lt_key key[LT_CACHE];
  cublasLtMatmulHeuristicResult_t heur[LT_CACHE];
  int n, next;
} lt_cache; /* guarded by lt_cache_lock */

static int lt_cache_find(const lt_key *k, cublasLtMatmulHeuristicResult_t *out) {
  int hit = 0;
  pthread_mutex_lock(&lt_cache_lock);
  for (int i = 0; i < lt_cache.n && !hit; i++)
    if (!memcmp(&lt_cache.key[i], k, sizeof *k)) { *out = lt_cache.heur[i]; hit = 1; }
  pthread_mutex_unlock(&lt_cache_lock);
  return hit;
}

static void lt_cache_put(const lt_key *k, const cublasLtMatmulHeuristicResult_t *h) {
  pthread_mutex_lock(&lt_cache_lock);
  int i = lt_cache.n < LT_CACHE ? lt_cache.n++ : (lt_cache.next++ % LT_CACHE); /* round robin when full */
  lt_cache.key[i] = *k;
  lt_cache.heur[i] = *h;
  pthread_mutex_unlock(&lt_cache_lock);
}

static nb_status lt_run(const nb_cuda_ctx *ctx, const nb_lt_types *t, const nb_lt_call *c) {
  const nb_blaslt_api *lt = nb_blaslt(); /* loaded at the first product that needs it */
  if (!lt) return nb_last_status();
  void *ws;
  size_t ws_bytes;
  cublasLtHandle_t h = (cublasLtHandle_t)nb_cuda_lt_handle(ctx, &ws, &ws_bytes);
  if (!h) return nb_last_status();
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  nb_status st = lt_check(lt->MatmulDescCreate(&op, t->compute, t->scale), "desc");
  if (!st) st = lt_check(lt->MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &c->A.op, sizeof c->A.op), "transa");
  if (!st) st = lt_check(lt->MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &c->B.op, sizeof c->B.op), "transb");
  if (!st) st = lt_layout(lt, &la, t, &c->A, c->count, c->sA);
  if (!st) st = lt_layout(lt, &lb, t, &c->B, c->count, c->sB);
  if (!st) st = lt_layout(lt, &ld, t, &c->D, c->count, c->sD);
  if (!st) st = lt_check(lt->MatmulPreferenceCreate(&pref), "preference");
  uint32_t al[3] = {lt_align(c->pa, c->count > 1 ? c->sA * (int64_t)t->es : 0),
                    lt_align(c->pb, c->count > 1 ? c->sB * (int64_t)t->es : 0),
                    lt_align(c->pd, c->count > 1 ? c->sD * (int64_t)t->es : 0)};
  const cublasLtMatmulPreferenceAttributes_t keys[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && !st; i++)
    st = lt_check(lt->MatmulPreferenceSetAttribute(pref, keys[i], &al[i < 3 ? i : 2], sizeof(uint32_t)), "alignment");
  if (!st)
    st = lt_check(lt->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &ws_bytes, sizeof ws_bytes), "workspace");
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  lt_key key;
  lt_key_of(&key, t, c, al);
  if (!st && lt_cache_find(&key, &heur)) found = 1;
  else if (!st) {
    st = lt_check(lt->MatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &heur, &found), "heuristic");
    if (!st && found) lt_cache_put(&key, &heur);
  }
  if (!st && !found)
    st = nb_error_set(NB_ERR_UNSUPPORTED, "cuda matmul: cuBLASLt has no algorithm for (%lld x %lld) "
                      "@ (%lld x %lld), batch %lld", (long long)c->m, (long long)c->k,
                      (long long)c->k, (long long)c->n, (long long)c->count);
  if (!st) {
    float f1 = 1.0f, f0 = 0.0f;
    double d1 = 1.0, d0 = 0.0;
    const void *alpha = t->scale == CUDA_R_64F ? (const void *)&d1 : (const void *)&f1;
    const void *beta = t->scale == CUDA_R_64F ? (const void *)&d0 : (const void *)&f0;
    st = lt_check(lt->Matmul(h, op, alpha, c->pa, la, c->pb, lb, beta, c->pd, ld, c->pd, ld,
                             &heur.algo, ws, ws_bytes, ctx->stream), "cublasLtMatmul");
  }
  if (pref) lt->MatmulPreferenceDestroy(pref);
  if (ld) lt->MatrixLayoutDestroy(ld);
  if (lb) lt->MatrixLayoutDestroy(lb);
  if (la) lt->MatrixLayoutDestroy(la);
  if (op) lt->MatmulDescDestroy(op);
  return st;
}

/* A contiguous copy of v (batch shape bshape, nb batch axes) in scratch. */
static nb_status lt_contig(const nb_cuda_ctx *ctx, const nb_kview *v, int nbd,
                           const int64_t *bshape, nb_kview *out, void **mem, size_t *bytes) {
  *out = *v;
  out->ndim = nbd + 2;
  for (int d = 0; d < nbd; d++) out->shape[d] = bshape[d];
  out->shape[nbd] = v->shape[v->ndim - 2];
  out->shape[nbd + 1] = v->shape[v->ndim - 1];
  for (int d = 0; d < nbd; d++) out->strides[d] = v->strides[v->ndim - 2 - nbd + d];
  out->strides[nbd] = v->strides[v->ndim - 2];
  out->strides[nbd + 1] = v->strides[v->ndim - 1];
  nb_kview src = *out;
  nb_contiguous_strides(out->ndim, out->shape, out->strides);
  *bytes = (size_t)nb_shape_numel(out->ndim, out->shape) * nb_dtype_size(v->dtype);
  *mem = nb_cuda_scratch(ctx, *bytes ? *bytes : 1);
  if (!*mem) return nb_last_status();
  out->data = *mem;
  return nb_cuda_copy(out, &src);
}

typedef struct {
  const nb_kview *out, *a, *b;
  int64_t M, N, K;
} nb_mm;

/* Describes the call for both formulations; 0 if the output fits neither. */
static int lt_plan(const nb_mm *p, nb_lt_call *c, int *need_a, int *need_b) {
  const nb_kview *o = p->out, *a = p->a, *b = p->b;
  int od = o->ndim;
  int64_t som = o->strides[od - 2], son = o->strides[od - 1];
  int64_t sam = a->strides[a->ndim - 2], sak = a->strides[a->ndim - 1];
  int64_t sbk = b->strides[b->ndim - 2], sbn = b->strides[b->ndim - 1];
  nb_lt_mat D = lt_describe(p->N, p->M, son, som);
  if (D.ok && D.op == CUBLAS_OP_N) { /* out^T (N x M) = b^T (N x K) a^T (K x M) */
    c->D = D;
    c->A = lt_describe(p->N, p->K, sbn, sbk);
    c->B = lt_describe(p->K, p->M, sak, sam);
    c->m = p->N;
    c->n = p->M;
    *need_a = !c->B.ok;
    *need_b = !c->A.ok;
    return 1;
  }
  D = lt_describe(p->M, p->N, som, son);
  if (D.ok && D.op == CUBLAS_OP_N) { /* out (M x N) = a (M x K) b (K x N) */
    c->D = D;
    c->A = lt_describe(p->M, p->K, sam, sak);
    c->B = lt_describe(p->K, p->N, sbk, sbn);
    c->m = p->M;
    c->n = p->N;
    *need_a = !c->A.ok;
    *need_b = !c->B.ok;
    return 2;
  }
  return 0;
}

/* Runs the batched product over coalesced batch axes. */
static nb_status lt_batched(const nb_cuda_ctx *ctx, const nb_lt_types *t, const nb_mm *p) {
  nb_lt_call c;
  int need_a, need_b;
  int form = lt_plan(p, &c, &need_a, &need_b);
  if (!form || need_a || need_b) return NB_ERR_UNSUPPORTED; /* caller copies */
  c.k = p->K;
  int nbd = p->out->ndim - 2;
  const int64_t *st[3] = {p->out->strides, p->a->strides + (p->a->ndim - 2 - nbd),
                          p->b->strides + (p->b->ndim - 2 - nbd)};
  nb_iter it;
  nb_iter_make(&it, nbd, p->out->shape, 3, st);
  int inner = it.ndim - 1;
  int64_t count = it.size[inner], outer = 1;
  for (int d = 0; d < inner; d++) outer *= it.size[d];
  /* formulation 1 puts b first (A' = b, B' = a); 2 keeps the order */
  int ia = form == 1 ? 2 : 1, ib = form == 1 ? 1 : 2;
  const char *base[3] = {(const char *)p->out->data, (const char *)p->a->data,
                         (const char *)p->b->data};
  c.count = count;
  c.sD = it.stride[0][inner];
  c.sA = it.stride[ia][inner];
  c.sB = it.stride[ib][inner];
  for (int64_t o = 0; o < outer; o++) {
    int64_t off[3] = {0, 0, 0}, r = o;
    for (int d = inner - 1; d >= 0; d--) {
      int64_t q = r / it.size[d], cc = r - q * it.size[d];
      for (int k = 0; k < 3; k++) off[k] += cc * it.stride[k][d];
      r = q;
    }
    c.pd = (void *)(base[0] + off[0] * (int64_t)t->es);
    c.pa = base[ia] + off[ia] * (int64_t)t->es;
    c.pb = base[ib] + off[ib] * (int64_t)t->es;
    nb_status s = lt_run(ctx, t, &c);
    if (s) return s;
  }
  return NB_OK;
}

/* ---- operand copies --------------------------------------------------------
 * Operands that no product call can read as they are (or a batch that would
 * take one call per index, below) are copied to contiguous scratch, and an
 * output that cannot be written in place is computed contiguous and copied
 * back. */
typedef struct {
  nb_kview a, b, out;
  void *ma, *mb, *mo;
  size_t ba, bb, bo;
} mm_copy;

static nb_status mm_copy_make(const nb_cuda_ctx *ctx, const nb_kview *out, const nb_kview *a,
                              const nb_kview *b, int copy_a, int copy_b, int copy_out, mm_copy *c) {
  memset(c, 0, sizeof *c);
  c->a = *a;
  c->b = *b;
  c->out = *out;
  int nbd = out->ndim - 2;
  nb_status st = NB_OK;
  if (copy_a) st = lt_contig(ctx, a, nbd, out->shape, &c->a, &c->ma, &c->ba);
  if (!st && copy_b) st = lt_contig(ctx, b, nbd, out->shape, &c->b, &c->mb, &c->bb);
  if (!st && copy_out) {
    nb_contiguous_strides(out->ndim, c->out.shape, c->out.strides);
    c->bo = (size_t)nb_kview_numel(out) * nb_dtype_size(out->dtype);
    c->out.data = c->mo = nb_cuda_scratch(ctx, c->bo);
    if (!c->mo) st = nb_last_status();
  }
  return st;
}

/* Copies a scratch output back (when st is NB_OK) and frees the copies. */
static nb_status mm_copy_finish(const nb_cuda_ctx *ctx, const nb_kview *out, mm_copy *c,
                                nb_status st) {
  if (!st && c->mo) st = nb_cuda_copy(out, &c->out);
  nb_cuda_scratch_free(ctx, c->ma, c->ba);
  nb_cuda_scratch_free(ctx, c->mb, c->bb);
  nb_cuda_scratch_free(ctx, c->mo, c->bo);
  return st;
}

/* ---- batches that do not merge ----------------------------------------------
 * Batch axes merge into one stride when each steps exactly over the next
 * for every operand; otherwise the product runs once per index of the
 * outer axes. Attention's q k^T on (B, H, T, D) views of a (B, T, 3, H, D)
 * projection is such a case: B calls of H products each. When those calls
 * are many and small, their fixed cost (a cuBLASLt call's descriptors, a
 * launch) is most of the time, so the operands that do not merge are
 * copied and the product runs as one call. Large products keep the loop:
 * a copy would cost memory and bandwidth for no gain. */
#define MM_FLAT_MIN_CALLS 4             /* up to this many calls: keep the loop */
#define MM_FLAT_MAX_FLOP (1LL << 28)    /* per call: above this, keep the loop */

/* The number of outer batch indices (product calls) over nops views. */
static int64_t mm_calls(const nb_kview *const *v, int nops, const int64_t *shape, int nbd) {
  const int64_t *st[3];
  for (int k = 0; k < nops; k++) st[k] = v[k]->strides;
  nb_iter it;
  nb_iter_make(&it, nbd, shape, nops, st);
  int64_t calls = 1;
  for (int d = 0; d + 1 < it.ndim; d++) calls *= it.size[d];
  return calls;
}

static int mm_merges(const nb_kview *v, const int64_t *shape, int nbd) {
  return mm_calls(&v, 1, shape, nbd) == 1;
}

static int mm_flatten_pays(const nb_mm *p) {
  const nb_kview *out = p->out;
  int nbd = out->ndim - 2;
  if (nbd < 2) return 0; /* one batch axis always merges */
  const nb_kview *v[3] = {out, p->a, p->b};
  int64_t calls = mm_calls(v, 3, out->shape, nbd);
  if (calls <= MM_FLAT_MIN_CALLS) return 0;
  double per_call = 2.0 * (double)p->M * (double)p->N * (double)p->K *
                    (double)(nb_shape_numel(nbd, out->shape) / calls);
  return per_call < (double)MM_FLAT_MAX_FLOP;
}

extern "C" nb_status nb_cuda_matmul(const nb_kview *out, const nb_kview *a, const nb_kview *b) {
  int od = out->ndim;
  if (od < 2) return nb_error_set(NB_ERR_SHAPE, "cuda matmul: out must have 2 or more axes");
  nb_mm p = {out, a, b, out->shape[od - 2], out->shape[od - 1], a->shape[a->ndim - 1]};
  if (nb_kview_numel(out) == 0) return NB_OK;
  if (p.K == 0) return nb_cuda_fill(out, 0.0);
  nb_lt_types t;
  if (!lt_types(out->dtype, &t))
    return nb_error_set(NB_ERR_DTYPE, "cuda matmul: dtype %s (expected f64, f32, f16 or bf16)",
                        nb_dtype_name(out->dtype));
  NB_CUDA_ENTER(ctx, st, out->data, "matmul");
  mm_copy c;
  if (mm_flatten_pays(&p)) { /* copies merge, so this recursion ends */
    int nbd = od - 2;
    st = mm_copy_make(&ctx, out, a, b, !mm_merges(a, out->shape, nbd),
                      !mm_merges(b, out->shape, nbd), !mm_merges(out, out->shape, nbd), &c);
    if (!st) st = nb_cuda_matmul(&c.out, &c.a, &c.b);
    return mm_copy_finish(&ctx, out, &c, st);
  }
  int mode = lt_mode();
  if ((mode == 1 || mode == 2) && nb_sm90_matmul(&ctx, out, a, b, &st)) return st;
  if ((mode == 1 || mode == 3) && nb_sm80_matmul(&ctx, out, a, b, mode == 3 ? 2 : 1, &st)) return st;
  nb_lt_call lc;
  int need_a = 0, need_b = 0, form = lt_plan(&p, &lc, &need_a, &need_b);
  if (form && !need_a && !need_b) return lt_batched(&ctx, &t, &p);
  /* Copy what does not fit: inputs to contiguous buffers; an output that
   * fits neither layout is computed contiguous and copied back. */
  st = mm_copy_make(&ctx, out, a, b, !form || need_a, !form || need_b, !form, &c);
  if (!st) {
    nb_mm q = {&c.out, &c.a, &c.b, p.M, p.N, p.K};
    st = lt_batched(&ctx, &t, &q);
    if (st == NB_ERR_UNSUPPORTED && !nb_error_pending())
      st = nb_error_set(NB_ERR_BACKEND, "cuda matmul: no cuBLASLt layout for the operands");
  }
  return mm_copy_finish(&ctx, out, &c, st);
}

/* ==== GEMM with a fused epilogue (nb_cuda_gemm_ex) ==========================
 * The own sm_90a kernel applies the epilogue in registers before its stores.
 * Elsewhere (other devices, layouts it does not take, f32 operands) the
 * product goes through nb_cuda_matmul into a contiguous buffer of the
 * operands' dtype and one elementwise kernel applies the epilogue. */
#define NB_GEMM_GELU_K 0.79788456080286535588f

/* Strided 2-D view for the epilogue kernel. */
typedef struct {
  void *p;
  int64_t s0, s1;
} gx_view;

static gx_view gx_of(const nb_kview *v) {
  gx_view g = {NULL, 0, 0};
  if (!v) return g;
  g.p = v->data;
  g.s0 = v->ndim == 2 ? v->strides[0] : 0;
  g.s1 = v->strides[v->ndim - 1];
  return g;
}

/* gelu_tanh in the accumulator type: float as the elementwise kernel
 * (standard expf, exact division), double for f64. */
__device__ __forceinline__ float gx_gelu(float v) {
  float u = NB_GEMM_GELU_K * fmaf(0.044715f * v, v * v, v);
  return v / (1.0f + expf(-2.0f * u));
}
__device__ __forceinline__ double gx_gelu(double v) {
  double u = 0.79788456080286535588 * fma(0.044715 * v, v * v, v);
  return v / (1.0 + exp(-2.0 * u));
}

/* A: the accumulator type (float, double for f64). */
template <typename TI, typename TO, typename A>
__global__ void gx_epilogue_kernel(const TI *prod, int64_t M, int64_t N, gx_view out, gx_view aux,
                                   gx_view cin, gx_view bias, float alpha, float beta, int gelu) {
  int64_t n = M * N;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / N, c = i - r * N;
    A v = (A)alpha * (A)nb_to_f(prod[i]);
    if (beta != 0.0f) v += (A)beta * (A)nb_to_f(((const TO *)cin.p)[r * cin.s0 + c * cin.s1]);
    if (bias.p) v += (A)nb_to_f(((const TO *)bias.p)[c * bias.s1]);
    if (aux.p) ((TO *)aux.p)[r * aux.s0 + c * aux.s1] = nb_from_d<TO>(v);
    if (gelu) v = gx_gelu(v);
    ((TO *)out.p)[r * out.s0 + c * out.s1] = nb_from_d<TO>(v);
  }
}

template <typename TI, typename TO, typename A = float>
static nb_status gx_launch(const nb_cuda_ctx *ctx, const void *prod, int64_t M, int64_t N,
                           const nb_kview *out, const nb_gemm_epilogue *ep) {
  unsigned blocks = nb_cuda_blocks(ctx, M * N, NB_CUDA_THREADS);
  gx_epilogue_kernel<TI, TO, A><<<blocks, NB_CUDA_THREADS, 0, ctx->stream>>>(
      (const TI *)prod, M, N, gx_of(out), gx_of(ep->aux), gx_of(ep->beta != 0.0f ? ep->c : NULL),
      gx_of(ep->bias), ep->alpha, ep->beta, ep->gelu);
  return nb_cuda_launch_check("gemm epilogue");
}

static nb_status gx_apply(const nb_cuda_ctx *ctx, nb_dtype in, const void *prod, int64_t M,
                          int64_t N, const nb_kview *out, const nb_gemm_epilogue *ep) {
  if (out->dtype == NB_F64) return gx_launch<double, double, double>(ctx, prod, M, N, out, ep);
  if (out->dtype == NB_F32) {
    if (in == NB_BF16) return gx_launch<__nv_bfloat16, float>(ctx, prod, M, N, out, ep);
    if (in == NB_F16) return gx_launch<__half, float>(ctx, prod, M, N, out, ep);
    return gx_launch<float, float>(ctx, prod, M, N, out, ep);
  }
  if (in == NB_BF16) return gx_launch<__nv_bfloat16, __nv_bfloat16>(ctx, prod, M, N, out, ep);
  return gx_launch<__half, __half>(ctx, prod, M, N, out, ep);
}

/* Shapes and dtypes of the call; an error naming them when they are wrong. */
static nb_status gx_check(const nb_kview *out, const nb_kview *a, const nb_kview *b,
                          const nb_gemm_epilogue *ep) {
  if (out->ndim != 2 || a->ndim != 2 || b->ndim != 2)
    return nb_error_set(NB_ERR_SHAPE, "cuda gemm_ex: out, a, b must be 2-D (got %d, %d, %d axes)",
                        out->ndim, a->ndim, b->ndim);
  int64_t M = out->shape[0], N = out->shape[1], K = a->shape[1];
  if (a->shape[0] != M || b->shape[0] != K || b->shape[1] != N)
    return nb_error_set(NB_ERR_SHAPE, "cuda gemm_ex: (%lld x %lld) @ (%lld x %lld) -> (%lld x %lld)",
                        (long long)a->shape[0], (long long)K, (long long)b->shape[0],
                        (long long)b->shape[1], (long long)M, (long long)N);
  nb_dtype in = a->dtype, od = out->dtype;
  int in_ok = in == NB_BF16 || in == NB_F16 || in == NB_F32 || in == NB_F64;
  int low = in == NB_BF16 || in == NB_F16;
  if (!in_ok || b->dtype != in || (od != in && !(od == NB_F32 && low)))
    return nb_error_set(NB_ERR_DTYPE, "cuda gemm_ex: a %s, b %s -> out %s (operands f16, bf16, "
                        "f32 or f64, alike; out their dtype, or f32 for f16 and bf16)", nb_dtype_name(in),
                        nb_dtype_name(b->dtype), nb_dtype_name(od));
  if (!ep) return NB_OK;
  if (ep->bias && (ep->bias->ndim != 1 || ep->bias->shape[0] != N || ep->bias->dtype != od))
    return nb_error_set(NB_ERR_SHAPE, "cuda gemm_ex: bias must be (%lld,) %s (got %d axes, %s)",
                        (long long)N, nb_dtype_name(od), ep->bias->ndim, nb_dtype_name(ep->bias->dtype));
  const nb_kview *mn[2] = {ep->c, ep->aux};
  const char *what[2] = {"c", "aux"};
  for (int i = 0; i < 2; i++)
    if (mn[i] && (mn[i]->ndim != 2 || mn[i]->shape[0] != M || mn[i]->shape[1] != N ||
                  mn[i]->dtype != od))
      return nb_error_set(NB_ERR_SHAPE, "cuda gemm_ex: %s must be (%lld x %lld) %s (got %lld x %lld %s)",
                          what[i], (long long)M, (long long)N, nb_dtype_name(od),
                          (long long)mn[i]->shape[0], (long long)(mn[i]->ndim > 1 ? mn[i]->shape[1] : 0),
                          nb_dtype_name(mn[i]->dtype));
  if (ep->beta != 0.0f && !ep->c)
    return nb_error_set(NB_ERR_SHAPE, "cuda gemm_ex: beta %g needs c", (double)ep->beta);
  return NB_OK;
}

extern "C" int64_t nb_cuda_gemm_own_launches(int device) { return nb_sm90_launches(device); }
extern "C" const char *nb_cuda_gemm_own_candidate(int i) { return nb_sm90_candidate(i); }

extern "C" int nb_cuda_gemm_own_schedule(int i, int64_t rows, int64_t N, int64_t K, int n_sm,
                                         nb_gemm_own_schedule *out) {
  return nb_sm90_schedule(i, rows, N, K, n_sm, out);
}

extern "C" int nb_cuda_gemm_own_walk(int i, int64_t rows, int64_t N, int64_t K, int n_sm, int cta,
                                     nb_gemm_own_segment *seg, int cap) {
  return nb_sm90_walk(i, rows, N, K, n_sm, cta, seg, cap);
}

extern "C" nb_status nb_cuda_gemm_ex(const nb_kview *out, const nb_kview *a, const nb_kview *b,
                                     const nb_gemm_epilogue *ep) {
  nb_status st = gx_check(out, a, b, ep);
  if (st) return st;
  nb_gemm_epilogue plain = {NULL, NULL, NULL, 1.0f, 0.0f, 0};
  if (!ep) ep = &plain;
  int64_t M = out->shape[0], N = out->shape[1];
  if (M * N == 0) return NB_OK;
  /* no epilogue, one dtype: the plain product's path (no scratch, no pass) */
  if (ep->alpha == 1.0f && ep->beta == 0.0f && !ep->bias && !ep->aux && !ep->gelu &&
      out->dtype == a->dtype)
    return nb_cuda_matmul(out, a, b);
  nb_cuda_ctx ctx;
  st = nb_cuda_enter(out->data, "gemm_ex", &ctx);
  if (st) return st;
  if (a->shape[1] > 0 && lt_mode() != 0 && nb_sm90_gemm_ex(&ctx, out, a, b, ep, &st)) return st;
  /* product in the operands' dtype, contiguous, then the epilogue kernel */
  nb_kview pv = *out;
  pv.dtype = a->dtype;
  pv.strides[0] = N;
  pv.strides[1] = 1;
  size_t bytes = (size_t)(M * N) * nb_dtype_size(a->dtype);
  pv.data = nb_cuda_scratch(&ctx, bytes);
  if (!pv.data) return nb_last_status();
  st = nb_cuda_matmul(&pv, a, b);
  if (!st) st = gx_apply(&ctx, a->dtype, pv.data, M, N, out, ep);
  nb_cuda_scratch_free(&ctx, pv.data, bytes);
  return st;
}
