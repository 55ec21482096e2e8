/* The sm_90a flash attention backward (cuda_attention_sm90_bwd.cu) on a
 * Hopper GPU: each case runs forward and backward with the kernels on,
 * twice (the same bits), then with NABLA_ATTENTION_SM90_BWD=0 (the mma.sync
 * backward; the forward is the same in both), and compares the output and
 * the three gradients, in norm, with the CPU's fused attention in float64
 * from the same rounded inputs, and the two backwards with each other. On
 * a compute capability 9.0 device the launch counter must show that the
 * kernels ran where they apply (bf16, f16; D 64 and 128; views TMA can
 * describe) and not where they do not (D 96, rows of stride D + 1) nor with
 * the switch off. Cases: T in {1, 7, 64, 129, 1000, 4097}, Lq != Lk both
 * ways (causal aligned top-left), causal and not, several (batch, head)
 * pairs, q, k, v as (B, H, T, D) views of a packed (B, T, 3, H, D)
 * projection (their gradients strided views of one buffer).
 * NABLA_TEST_QUICK=1 (the sanitizers) keeps the cases under 1000 rows.
 * Without a CUDA device: skipped (77). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_attention_sm90_bwd.h"
#endif

typedef struct {
  int64_t B, H, Lq, Lk, D;
  int packed; /* 1: views of one (B, T, 3, H, D) tensor (Lq == Lk); 2: rows of stride D + 1 */
  int runs;   /* whether the sm_90a backward takes the case (on a 9.0 device) */
} scase;

static const nb_device CPU = {NB_CPU, 0};
static const nb_device GPU = {NB_CUDA, 0};

static int64_t launches(void) {
#ifdef NABLA_HAVE_CUDA
  return nb_cuda_attn_sm90_bwd_launches(0);
#else
  return -1;
#endif
}

/* Leaves in f64 (packed: one; else q, k, v; padded: D + 1 columns each). */
static int make_leaves(const scase *c, uint64_t seed, nb_tensor **leaf) {
  const int64_t e = c->packed == 2 ? c->D + 1 : c->D;
  if (c->packed == 1) {
    leaf[0] = nbt_randn(seed, 5, (int64_t[]){c->B, c->Lq, 3, c->H, c->D}, NB_F64);
    return 1;
  }
  leaf[0] = nbt_randn(seed, 4, (int64_t[]){c->B, c->H, c->Lq, e}, NB_F64);
  leaf[1] = nbt_randn(seed + 1, 4, (int64_t[]){c->B, c->H, c->Lk, e}, NB_F64);
  leaf[2] = nbt_randn(seed + 2, 4, (int64_t[]){c->B, c->H, c->Lk, e}, NB_F64);
  return 3;
}

typedef struct {
  double *y, *g[3];
  int64_t ny, ng[3];
} sresult;

/* Attention on dev in dtype dt from the leaves (cast, copied, made leaves
 * that require gradients): the output and the gradients of sum(y * w). */
static sresult run(const scase *c, int causal, nb_tensor *const *in, int n, nb_dtype dt, nb_device dev) {
  sresult r;
  memset(&r, 0, sizeof r);
  nb_scope_begin();
  nb_tensor *leaf[3] = {NULL, NULL, NULL}, *q, *k, *v;
  for (int i = 0; i < n; i++) {
    leaf[i] = nb_detach(nb_contiguous(nb_to_device(nb_cast(in[i], dt), dev)));
    nb_set_requires_grad(leaf[i], 1);
  }
  if (c->packed == 1) {
    const int perm[4] = {0, 2, 1, 3}; /* (B, T, H, D) -> (B, H, T, D) */
    q = nb_permute(nb_select(leaf[0], 2, 0), perm);
    k = nb_permute(nb_select(leaf[0], 2, 1), perm);
    v = nb_permute(nb_select(leaf[0], 2, 2), perm);
  } else if (c->packed == 2) {
    q = nb_narrow(leaf[0], 3, 0, c->D);
    k = nb_narrow(leaf[1], 3, 0, c->D);
    v = nb_narrow(leaf[2], 3, 0, c->D);
  } else {
    q = leaf[0], k = leaf[1], v = leaf[2];
  }
  nb_tensor *y = nb_scaled_dot_product_attention(q, k, v, NULL, causal, 0, NULL, 0);
  nb_tensor *w = y ? nb_to_device(nbt_randn(99, nb_ndim(y), nb_shape(y), NB_F64), dev) : NULL;
  nb_tensor *loss = y ? nb_sum(nb_mul(nb_cast(y, NB_F64), w), 0, NULL, 0) : NULL;
  if (!loss || nb_backward(loss, NULL)) {
    printf("attention run failed: %s\n", nb_last_error());
  } else {
    r.y = nbt_f64(y);
    r.ny = nb_numel(y);
    for (int i = 0; i < n; i++) {
      r.g[i] = nbt_f64(nb_grad(leaf[i]));
      r.ng[i] = nb_numel(leaf[i]);
    }
  }
  nb_scope_end();
  return r;
}

static void release(sresult *r) {
  free(r->y);
  for (int i = 0; i < 3; i++) free(r->g[i]);
}

/* ||a - b|| / ||b|| over n elements. */
static double norm_err(const double *a, const double *b, int64_t n) {
  double e = 0, s = 0;
  for (int64_t i = 0; i < n; i++) e += (a[i] - b[i]) * (a[i] - b[i]), s += b[i] * b[i];
  return s > 0 ? sqrt(e / s) : sqrt(e);
}

static void compare(const char *name, const char *what, const sresult *got, const sresult *ref, int n,
                    double tol) {
  if (!got->y || !ref->y) {
    NBT_CHECK(0, "%s: a run failed", name);
    return;
  }
  double e = norm_err(got->y, ref->y, got->ny);
  NBT_CHECK(e <= tol, "%s: output against %s, norm error %.3g (tolerance %g)", name, what, e, tol);
  for (int i = 0; i < n; i++) {
    e = norm_err(got->g[i], ref->g[i], got->ng[i]);
    NBT_CHECK(e <= tol, "%s: gradient %d against %s, norm error %.3g (tolerance %g)", name, i, what, e, tol);
  }
}

static int same_bits(const sresult *a, const sresult *b, int n) {
  int same = a->y && b->y && !memcmp(a->y, b->y, (size_t)a->ny * sizeof(double));
  for (int i = 0; i < n && same; i++) same = !memcmp(a->g[i], b->g[i], (size_t)a->ng[i] * sizeof(double));
  return same;
}

static void check_case(const scase *c, int causal, nb_dtype dt, uint64_t seed) {
  char name[160];
  snprintf(name, sizeof name, "sm90 bwd %s B%lld H%lld Lq%lld Lk%lld D%lld%s%s", nb_dtype_name(dt),
           (long long)c->B, (long long)c->H, (long long)c->Lq, (long long)c->Lk, (long long)c->D,
           causal ? " causal" : "", c->packed == 1 ? " packed" : c->packed == 2 ? " padded rows" : "");
  nb_tensor *in[3], *rounded[3];
  const int n = make_leaves(c, seed, in);
  nb_scope_begin();
  for (int i = 0; i < n; i++) rounded[i] = nb_keep(nb_cast(nb_cast(in[i], dt), NB_F64));
  nb_scope_end();
  const int64_t l0 = launches();
  setenv("NABLA_ATTENTION_SM90_BWD", "1", 1); /* opt-in for now */
  sresult got = run(c, causal, in, n, dt, GPU), again = run(c, causal, in, n, dt, GPU);
  const int64_t l1 = launches();
  setenv("NABLA_ATTENTION_SM90_BWD", "0", 1);
  sresult mma = run(c, causal, in, n, dt, GPU);
  const int64_t l2 = launches();
  unsetenv("NABLA_ATTENTION_SM90_BWD");
  sresult ref = run(c, causal, rounded, n, NB_F64, CPU);
  if (l0 >= 0) {
    NBT_CHECK(c->runs ? l1 == l0 + 2 : l1 == l0, "%s: the sm_90a backward ran %lld times in two calls (%d "
              "expected)", name, (long long)(l1 - l0), c->runs ? 2 : 0);
    NBT_CHECK(l2 == l1, "%s: NABLA_ATTENTION_SM90_BWD=0 still ran it", name);
  }
  const double tol = dt == NB_F16 ? 2e-3 : 1.5e-2;
  compare(name, "float64", &got, &ref, n, tol);
  compare(name, "the mma.sync backward", &got, &mma, n, tol);
  NBT_CHECK(same_bits(&got, &again, n), "%s: two runs differ", name);
  release(&got);
  release(&again);
  release(&mma);
  release(&ref);
  for (int i = 0; i < n; i++) nb_release(in[i]), nb_release(rounded[i]);
}

int main(void) {
  if (nb_cuda_available() <= 0) {
    printf("test_attention_sm90_bwd: no CUDA device, skipped\n");
    return 77;
  }
  setenv("NABLA_ATTENTION", "fused", 1); /* whatever the size (small calls would compose) */
  if (launches() < 0) printf("test_attention_sm90_bwd: not a 9.0 device, the mma.sync path is compared\n");
  const scase cases[] = {
    {2, 3, 1, 1, 64, 0, 1},       {2, 3, 7, 7, 128, 0, 1},       {2, 2, 64, 64, 64, 0, 1},
    {1, 2, 129, 129, 128, 1, 1},  {2, 2, 129, 64, 64, 0, 1},     {2, 1, 64, 129, 128, 0, 1},
    {1, 3, 7, 129, 64, 0, 1},     {1, 1, 129, 7, 128, 0, 1},     {3, 1, 257, 257, 64, 1, 1},
    {1, 2, 1000, 1000, 64, 1, 1}, {1, 1, 1000, 700, 128, 0, 1},  {1, 1, 300, 1000, 64, 0, 1},
    {1, 1, 4097, 4097, 128, 0, 1}, {1, 2, 4097, 4097, 64, 1, 1},
    {1, 2, 100, 100, 96, 0, 0},   {1, 2, 100, 100, 64, 2, 0}, /* D 96; rows of stride 65: not taken */
  };
  const nb_dtype dts[] = {NB_BF16, NB_F16};
  const int quick = getenv("NABLA_TEST_QUICK") != NULL;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (int causal = 0; causal < 2; causal++)
      for (size_t t = 0; t < sizeof dts / sizeof *dts; t++) {
        const scase *c = &cases[i];
        if (quick && (c->Lq >= 1000 || c->Lk >= 1000)) continue;
        if (c->Lq > 4000 && dts[t] != NB_BF16) continue; /* 4097: bf16 only (the f64 reference's time) */
        check_case(c, causal, dts[t], 700 + 10 * i + 2 * causal + t);
      }
  return nbt_finish();
}
