/* attention_qkv (self-attention on a packed (B, T, 3 H D) projection)
 * against scaled_dot_product_attention on the projection's views (reshape
 * to (B, T, 3, H, D), select, permute to (B, H, T, D); the output permuted
 * back and reshaped): the same kernels, so the output and the qkv gradient
 * agree bit for bit, on the CPU and on CUDA (where both take the
 * tensor-core kernels for bf16/f16 at D 64, 96, 128: the strided dq, dk, dv
 * and o views are tested there). Both against the composed attention in
 * float64 (matmul, softmax, matmul, taken with an all-true bool mask) from
 * the same rounded inputs. T in {1, 7, 129} (and 1000 on the GPU), causal
 * and not, D 64 and others, f64/f32/bf16/f16, strided projections; a head
 * dimension over the CUDA kernels' 256 composes; autocast runs it in bf16;
 * bad input names the op, the shape and the heads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const nb_device CPU = {NB_CPU, 0};

typedef struct {
  int64_t B, H, T, D;
  int causal;
  int layout; /* 0 contiguous, 1 rows of a wider tensor, 2 last axis strided */
} qcase;

/* y and the gradient of sum(y * w) with respect to qkv, as float64 arrays. */
typedef struct {
  double *y, *g;
  int64_t ny, ng;
} qresult;

enum { VIA_QKV, VIA_VIEWS, VIA_COMPOSED };

/* Attention on the projection x (B, T, 3 H D) by path via. */
static nb_tensor *attend(const qcase *c, const nb_tensor *x, int via) {
  if (via == VIA_QKV) return nb_attention_qkv(x, (int)c->H, c->causal, 0.0);
  nb_tensor *r = nb_reshape(x, 5, (int64_t[]){c->B, c->T, 3, c->H, c->D});
  const int perm[4] = {0, 2, 1, 3};
  nb_tensor *q = nb_permute(nb_select(r, 2, 0), perm), *k = nb_permute(nb_select(r, 2, 1), perm);
  nb_tensor *v = nb_permute(nb_select(r, 2, 2), perm);
  nb_tensor *mask = via == VIA_COMPOSED ? nb_ones(2, (int64_t[]){c->T, c->T}, NB_BOOL, nb_device_of(x)) : NULL;
  nb_tensor *y = nb_scaled_dot_product_attention(q, k, v, mask, c->causal, 0, NULL, 0);
  return nb_reshape(nb_permute(y, perm), 3, (int64_t[]){c->B, c->T, c->H * c->D});
}

/* The projection from src (f64, CPU) in dtype dt on dev, in c's layout. */
static nb_tensor *make_qkv(const qcase *c, const nb_tensor *src, nb_dtype dt, nb_device dev,
                           nb_tensor **leaf) {
  int64_t C3 = 3 * c->H * c->D;
  nb_tensor *x = nb_to_device(nb_cast(src, dt), dev);
  if (c->layout == 1) { /* the first 3 H D columns of (B, T, 3 H D + 8) */
    nb_tensor *w = nb_zeros(3, (int64_t[]){c->B, c->T, C3 + 8}, dt, dev);
    nb_copy_(nb_narrow(w, 2, 0, C3), x);
    *leaf = nb_detach(w);
    nb_set_requires_grad(*leaf, 1);
    return nb_narrow(*leaf, 2, 0, C3);
  }
  if (c->layout == 2) { /* (B, 3 H D, T) transposed: the last axis of stride T */
    nb_tensor *w = nb_contiguous(nb_transpose(x, 1, 2));
    *leaf = nb_detach(w);
    nb_set_requires_grad(*leaf, 1);
    return nb_transpose(*leaf, 1, 2);
  }
  *leaf = nb_detach(nb_contiguous(x));
  nb_set_requires_grad(*leaf, 1);
  return *leaf;
}

static qresult run(const qcase *c, const nb_tensor *src, nb_dtype dt, nb_device dev, int via) {
  qresult r;
  memset(&r, 0, sizeof r);
  nb_scope_begin();
  nb_tensor *leaf = NULL, *x = make_qkv(c, src, dt, dev, &leaf);
  nb_tensor *y = attend(c, x, via);
  nb_tensor *w = y ? nb_to_device(nbt_randn(99, nb_ndim(y), nb_shape(y), NB_F64), dev) : NULL;
  nb_tensor *loss = y ? nb_sum(nb_mul(nb_cast(y, NB_F64), w), 0, NULL, 0) : NULL;
  if (!loss || nb_backward(loss, NULL) || !nb_grad(leaf)) {
    printf("attention_qkv run failed: %s\n", nb_last_error());
  } else {
    r.y = nbt_f64(y);
    r.ny = nb_numel(y);
    r.g = nbt_f64(nb_grad(leaf));
    r.ng = nb_numel(leaf);
  }
  nb_scope_end();
  return r;
}

static void free_result(qresult *r) { free(r->y), free(r->g); }

static const char *name_of(const qcase *c, nb_dtype dt, const char *dev, char *buf, size_t n) {
  snprintf(buf, n, "%s %s B%lld H%lld T%lld D%lld%s%s", dev, nb_dtype_name(dt), (long long)c->B,
           (long long)c->H, (long long)c->T, (long long)c->D, c->causal ? " causal" : "",
           c->layout == 1 ? " wide rows" : c->layout == 2 ? " strided last axis" : "");
  return buf;
}

static int same_bits(const qresult *a, const qresult *b) {
  return a->y && b->y && a->ny == b->ny && a->ng == b->ng &&
         !memcmp(a->y, b->y, (size_t)a->ny * sizeof(double)) &&
         !memcmp(a->g, b->g, (size_t)a->ng * sizeof(double));
}

/* The same values, where -0 equals +0: the views' gradient goes through
 * adds of zero-filled slices, which turn a -0 (a zero gradient times a
 * negative scale, f16) into +0; attention_qkv writes the kernel's -0. */
static int same_values(const double *a, const double *b, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])))) return 0;
  return 1;
}
static int same_results(const qresult *a, const qresult *b) {
  return a->y && b->y && a->ny == b->ny && a->ng == b->ng && same_values(a->y, b->y, a->ny) &&
         same_values(a->g, b->g, a->ng);
}

/* ||a - b|| / ||b|| */
static double norm_err(const double *a, const double *b, int64_t n) {
  double e = 0, r = 0;
  for (int64_t i = 0; i < n; i++) e += (a[i] - b[i]) * (a[i] - b[i]), r += b[i] * b[i];
  return r > 0 ? sqrt(e / r) : sqrt(e);
}

static double tol_of(nb_dtype dt) {
  return dt == NB_F64 ? 1e-12 : dt == NB_F32 ? 1e-5 : dt == NB_F16 ? 3e-3 : 2e-2;
}

/* One case on dev in dt: attention_qkv against the views (same bits), and
 * against the f64 composition from the same rounded inputs (in norm);
 * on CUDA also two runs with the same bits. */
static void check_case(const qcase *c, nb_dtype dt, nb_device dev, uint64_t seed) {
  char name[160];
  name_of(c, dt, dev.type == NB_CUDA ? "cuda" : "cpu", name, sizeof name);
  nb_scope_begin();
  nb_tensor *src = nbt_randn(seed, 3, (int64_t[]){c->B, c->T, 3 * c->H * c->D}, NB_F64);
  nb_tensor *rounded = nb_cast(nb_cast(src, dt), NB_F64);
  qresult got = run(c, src, dt, dev, VIA_QKV), views = run(c, src, dt, dev, VIA_VIEWS);
  qresult ref = run(c, rounded, NB_F64, CPU, VIA_COMPOSED);
  if (!same_results(&got, &views) && got.y && views.y && got.ny == views.ny && got.ng == views.ng) {
    double dy = 0, dg = 0;
    for (int64_t i = 0; i < got.ny; i++) dy = fmax(dy, fabs(got.y[i] - views.y[i]));
    for (int64_t i = 0; i < got.ng; i++) dg = fmax(dg, fabs(got.g[i] - views.g[i]));
    printf("%s: largest difference to sdpa on views: output %.3g, gradient %.3g\n", name, dy, dg);
  }
  NBT_CHECK(same_results(&got, &views), "%s: attention_qkv differs from sdpa on views", name);
  if (got.y && ref.y) {
    double ey = norm_err(got.y, ref.y, got.ny), eg = norm_err(got.g, ref.g, got.ng);
    NBT_CHECK(ey <= tol_of(dt) && eg <= tol_of(dt),
              "%s: against the f64 composition: output %.3g, gradient %.3g (tolerance %g)", name,
              ey, eg, tol_of(dt));
  } else {
    NBT_CHECK(0, "%s: a run failed", name);
  }
  if (dev.type == NB_CUDA) {
    qresult again = run(c, src, dt, dev, VIA_QKV);
    NBT_CHECK(same_bits(&got, &again), "%s: two runs differ", name);
    free_result(&again);
  }
  free_result(&got), free_result(&views), free_result(&ref);
  nb_scope_end();
}

static void cases_on(nb_device dev, const qcase *cases, int n, const nb_dtype *dts, int nd) {
  for (int i = 0; i < n; i++)
    for (int t = 0; t < nd; t++) check_case(&cases[i], dts[t], dev, 1000 + 10 * (uint64_t)i);
}

static void cpu_cases(void) {
  const qcase cases[] = {
    {2, 2, 7, 64, 1, 0}, {2, 2, 7, 64, 0, 0},  {1, 2, 1, 64, 1, 0},  {1, 1, 129, 64, 1, 0},
    {1, 3, 129, 8, 0, 0}, {2, 3, 7, 12, 1, 1}, {2, 2, 7, 16, 0, 2},  {1, 2, 1, 8, 0, 0},
  };
  const nb_dtype dts[] = {NB_F64, NB_F32, NB_BF16};
  cases_on(CPU, cases, (int)(sizeof cases / sizeof *cases), dts, 3);
}

/* The tensor-core kernels (bf16/f16, D 64, 96, 128), the SIMT kernels
 * (f32, other head dims) and the composition (D over 256). */
static void cuda_cases(void) {
  nb_device gpu = {NB_CUDA, 0};
  const qcase mma[] = {
    {2, 2, 7, 64, 1, 0},    {2, 2, 7, 64, 0, 0},    {1, 2, 1, 64, 1, 0},   {2, 3, 129, 64, 1, 0},
    {1, 2, 129, 96, 0, 0},  {1, 2, 129, 128, 1, 1}, {2, 2, 1000, 64, 1, 0}, {1, 2, 100, 64, 1, 2},
  };
  const nb_dtype low[] = {NB_BF16, NB_F16};
  cases_on(gpu, mma, (int)(sizeof mma / sizeof *mma), low, 2);
  const qcase simt[] = {
    {2, 2, 7, 64, 1, 0}, {1, 3, 129, 8, 0, 0}, {2, 3, 7, 12, 1, 1}, {1, 1, 33, 300, 1, 0},
  };
  const nb_dtype all[] = {NB_F32, NB_F64, NB_BF16};
  cases_on(gpu, simt, (int)(sizeof simt / sizeof *simt), all, 3);
}

/* The output's node is the table's entry; under autocast it runs in bf16. */
static void route_and_autocast(void) {
  nb_scope_begin();
  nb_tensor *x = nb_detach(nbt_randn(3, 3, (int64_t[]){2, 5, 48}, NB_F32));
  nb_set_requires_grad(x, 1);
  nb_tensor *y = nb_attention_qkv(x, 2, 1, 0.0);
  const char *node = y ? nb_grad_fn_name(y) : NULL;
  NBT_CHECK(node && !strcmp(node, "attention_qkv") && nb_dtype_of(y) == NB_F32 &&
                nb_size(y, 2) == 16,
            "attention_qkv: node %s, dtype %s", node ? node : "none",
            y ? nb_dtype_name(nb_dtype_of(y)) : "-");
  nb_autocast_begin(NB_BF16);
  nb_tensor *yl = nb_attention_qkv(x, 2, 1, 0.0);
  nb_autocast_end();
  NBT_CHECK(yl && nb_dtype_of(yl) == NB_BF16, "attention_qkv under bf16 autocast: %s",
            yl ? nb_dtype_name(nb_dtype_of(yl)) : nb_last_error());
  NBT_CHECK(yl && nb_backward(nb_sum(nb_cast(yl, NB_F32), 0, NULL, 0), NULL) == NB_OK &&
                nb_grad(x) && nb_dtype_of(nb_grad(x)) == NB_F32,
            "attention_qkv under autocast: an f32 gradient for the f32 projection (%s)",
            nb_last_error());
  nb_scope_end();
}

static void errors(void) {
  nb_scope_begin();
  nb_tensor *x = nbt_randn(1, 3, (int64_t[]){2, 7, 100}, NB_F32);
  nbt_check_error("attention_qkv 3 H D", !nb_attention_qkv(x, 3, 1, 0), NB_ERR_SHAPE,
                  "attention_qkv", "[2, 7, 100]", "3 heads", NULL);
  nbt_check_error("attention_qkv heads 0", !nb_attention_qkv(x, 0, 1, 0), NB_ERR_SHAPE,
                  "attention_qkv", "0 heads", NULL);
  nb_tensor *v = nbt_randn(1, 1, (int64_t[]){96}, NB_F32);
  nbt_check_error("attention_qkv 1-d", !nb_attention_qkv(v, 2, 1, 0), NB_ERR_SHAPE,
                  "attention_qkv", "[96]", NULL);
  nb_tensor *i = nb_zeros(3, (int64_t[]){2, 7, 96}, NB_I64, CPU);
  nbt_check_error("attention_qkv int", !nb_attention_qkv(i, 2, 1, 0), NB_ERR_DTYPE,
                  "attention_qkv", "i64", NULL);
  nbt_check_error("attention_qkv NULL", !nb_attention_qkv(NULL, 2, 1, 0), NB_ERR_NULL,
                  "attention_qkv", "qkv", NULL);
  nb_scope_end();
}

int main(void) {
  cpu_cases();
  route_and_autocast();
  errors();
  if (nb_cuda_available() > 0) cuda_cases();
  else printf("test_attention_qkv: no CUDA device, CUDA cases skipped\n");
  return nbt_finish();
}
