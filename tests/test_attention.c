/* scaled_dot_product_attention as one op (flash attention): the fused
 * kernels against the composed attention (matmul, softmax, matmul; taken
 * here with NABLA_ATTENTION=composed, the composition that test_nn_ops
 * checks against float64 and finite differences; masks, dropout and
 * grouped heads: test_attention_mask), forward and the three gradients, on the CPU and, when a GPU
 * is present, on CUDA against the CPU. Cases: T in {1, 7, 64, 129, 1000,
 * 4097} (the large ones on the GPU only), Lq != Lk with causal aligned
 * top-left, head dims 8..256 and Dv != D, q/k/v as (B, H, T, D) views of a
 * (B, T, 3, H, D) projection (no copy), every float dtype; deterministic
 * bits on CUDA; a head dim over the CUDA kernels' 256 falls back to the
 * composition. The tensor-core kernels (bf16, f16; D 64, 96, 128) get their
 * own sweep: T in {1, 17, 64, 100, 257, 1000}, Lq != Lk both ways, causal
 * and not, packed views, rows whose stride is not a multiple of 8 (the SIMT
 * fallback), two runs with the same bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention_testutil.h"
#include "testutil.h"

typedef struct {
  int64_t B, H, Lq, Lk, D, Dv;
  int causal, packed; /* packed: q, k, v are views of one (B, T, 3, H, D) tensor;
                        PAD_ROWS: each the first D columns of a (B, H, T, D + 1) tensor */
} acase;

#define PAD_ROWS 2

static const nb_device CPU = {NB_CPU, 0};

/* The inputs' leaves (f64 on the CPU): packed, one x; else q, k, v. */
typedef struct {
  nb_tensor *leaf[3];
  int n;
} ainputs;

static ainputs make_inputs(const acase *c, uint64_t seed) {
  ainputs in = {{NULL, NULL, NULL}, 0};
  if (c->packed == PAD_ROWS) {
    in.leaf[0] = nbt_randn(seed, 4, (int64_t[]){c->B, c->H, c->Lq, c->D + 1}, NB_F64);
    in.leaf[1] = nbt_randn(seed + 1, 4, (int64_t[]){c->B, c->H, c->Lk, c->D + 1}, NB_F64);
    in.leaf[2] = nbt_randn(seed + 2, 4, (int64_t[]){c->B, c->H, c->Lk, c->Dv + 1}, NB_F64);
    in.n = 3;
  } else if (c->packed) {
    in.leaf[0] = nbt_randn(seed, 5, (int64_t[]){c->B, c->Lq, 3, c->H, c->D}, NB_F64);
    in.n = 1;
  } else {
    in.leaf[0] = nbt_randn(seed, 4, (int64_t[]){c->B, c->H, c->Lq, c->D}, NB_F64);
    in.leaf[1] = nbt_randn(seed + 1, 4, (int64_t[]){c->B, c->H, c->Lk, c->D}, NB_F64);
    in.leaf[2] = nbt_randn(seed + 2, 4, (int64_t[]){c->B, c->H, c->Lk, c->Dv}, NB_F64);
    in.n = 3;
  }
  return in; /* outside a scope: owned by the caller */
}

/* Runs attention on dev in dtype dt (fused, or composed when composed) and
 * returns, as float64 arrays, the output and the gradients of sum(y * w)
 * with respect to each leaf (cast from the leaves' rounded copies). */
typedef atest_result aresult;

static aresult run(const acase *c, const ainputs *in, nb_dtype dt, nb_device dev, int composed) {
  aresult r;
  memset(&r, 0, sizeof r);
  nb_scope_begin();
  nb_tensor *leaf[3] = {NULL, NULL, NULL};
  for (int i = 0; i < in->n; i++) {
    leaf[i] = nb_to_device(nb_cast(in->leaf[i], dt), dev);
    leaf[i] = nb_contiguous(leaf[i]);
    leaf[i] = nb_detach(leaf[i]);
    nb_set_requires_grad(leaf[i], 1);
  }
  nb_tensor *q, *k, *v;
  if (c->packed == PAD_ROWS) { /* row stride D + 1: not 16-byte aligned rows */
    q = nb_narrow(leaf[0], 3, 0, c->D);
    k = nb_narrow(leaf[1], 3, 0, c->D);
    v = nb_narrow(leaf[2], 3, 0, c->Dv);
  } else if (c->packed) {
    const int perm[4] = {0, 2, 1, 3}; /* (B, T, H, D) -> (B, H, T, D) */
    q = nb_permute(nb_select(leaf[0], 2, 0), perm);
    k = nb_permute(nb_select(leaf[0], 2, 1), perm);
    v = nb_permute(nb_select(leaf[0], 2, 2), perm);
  } else {
    q = leaf[0], k = leaf[1], v = leaf[2];
  }
  setenv("NABLA_ATTENTION", composed ? "composed" : "fused", 1);
  nb_tensor *y = nb_scaled_dot_product_attention(q, k, v, NULL, c->causal, 0, NULL, 0);
  setenv("NABLA_ATTENTION", "fused", 1);
  nb_tensor *w = y ? nb_to_device(nbt_randn(99, nb_ndim(y), nb_shape(y), NB_F64), dev) : NULL;
  nb_tensor *loss = y ? nb_sum(nb_mul(nb_cast(y, NB_F64), w), 0, NULL, 0) : NULL;
  if (!loss || nb_backward(loss, NULL)) {
    printf("attention run failed: %s\n", nb_last_error());
  } else {
    atest_read(&r, y, leaf, in->n);
  }
  nb_scope_end();
  return r;
}

/* Two runs of one case give the same bits: output and every gradient. */
static void check_same_bits(const char *name, const aresult *a, const aresult *b, int n) {
  int same = a->y && b->y && !memcmp(a->y, b->y, (size_t)a->ny * sizeof(double));
  for (int j = 0; j < n && same; j++)
    same = !memcmp(a->g[j], b->g[j], (size_t)a->ng[j] * sizeof(double));
  NBT_CHECK(same, "%s: two runs differ", name);
}

static const char *case_name(const acase *c, nb_dtype dt, const char *dev, char *buf, size_t n) {
  snprintf(buf, n, "%s %s B%lld H%lld Lq%lld Lk%lld D%lld Dv%lld%s%s", dev, nb_dtype_name(dt),
           (long long)c->B, (long long)c->H, (long long)c->Lq, (long long)c->Lk, (long long)c->D,
           (long long)c->Dv, c->causal ? " causal" : "",
           c->packed == PAD_ROWS ? " padded rows" : c->packed ? " packed" : "");
  return buf;
}

/* Compares a result with a reference: output and every gradient. */
static void compare(const char *name, const aresult *got, const aresult *ref, int n, double rtol,
                    double atol) {
  if (!got->y || !ref->y) {
    NBT_CHECK(0, "%s: a run failed", name);
    return;
  }
  double e = nbt_close_ratio(got->y, ref->y, got->ny, rtol, atol);
  NBT_CHECK(e <= 1, "%s: output off by %.3g of tolerance", name, e);
  for (int i = 0; i < n; i++) {
    e = nbt_close_ratio(got->g[i], ref->g[i], got->ng[i], rtol, atol);
    NBT_CHECK(e <= 1, "%s: gradient %d off by %.3g of tolerance", name, i, e);
  }
}

/* 16-bit results on the GPU: the output and the gradients within tol in
 * norm (o is stored in 16 bits and its rounding enters delta = dout.o, as
 * in every flash attention; elementwise bounds would be set by the
 * smallest entries). */
static void compare_norm(const char *name, const aresult *got, const aresult *ref, int n, double tol) {
  if (!got->y || !ref->y) {
    NBT_CHECK(0, "%s: a run failed", name);
    return;
  }
  double e = atest_norm_err(got->y, ref->y, got->ny);
  NBT_CHECK(e <= tol, "%s: output norm error %.3g (tolerance %g)", name, e, tol);
  for (int i = 0; i < n; i++) {
    e = atest_norm_err(got->g[i], ref->g[i], got->ng[i]);
    NBT_CHECK(e <= tol, "%s: gradient %d norm error %.3g (tolerance %g)", name, i, e, tol);
  }
}

static double rtol_of(nb_dtype dt) {
  return dt == NB_F64 ? 1e-10 : dt == NB_F32 ? 2e-5 : dt == NB_F16 ? 1e-2 : 4e-2;
}

/* Fused against composed on the CPU, both from the same rounded inputs. */
static void cpu_cases(void) {
  const acase cases[] = {
    {2, 3, 7, 7, 8, 8, 0, 0},      {2, 3, 7, 7, 8, 8, 1, 0},     {1, 2, 1, 1, 16, 16, 1, 0},
    {1, 2, 64, 64, 64, 64, 1, 1},  {1, 2, 129, 129, 32, 32, 1, 1}, {2, 1, 5, 9, 12, 20, 1, 0},
    {2, 1, 9, 5, 12, 6, 1, 0},     {1, 1, 9, 5, 12, 6, 0, 0},    {1, 2, 33, 33, 96, 96, 0, 1},
  };
  const nb_dtype dts[] = {NB_F64, NB_F32, NB_BF16, NB_F16};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (size_t t = 0; t < sizeof dts / sizeof *dts; t++) {
      const acase *c = &cases[i];
      ainputs in = make_inputs(c, 100 + i);
      /* the reference: composed in f64 from the inputs rounded to dt */
      ainputs r64 = in;
      nb_tensor *rounded[3];
      nb_scope_begin();
      for (int j = 0; j < in.n; j++) r64.leaf[j] = rounded[j] = nb_keep(nb_cast(nb_cast(in.leaf[j], dts[t]), NB_F64));
      nb_scope_end();
      aresult ref = run(c, &r64, NB_F64, CPU, 1), got = run(c, &in, dts[t], CPU, 0);
      char name[160];
      compare(case_name(c, dts[t], "cpu", name, sizeof name), &got, &ref, in.n, rtol_of(dts[t]),
              dts[t] == NB_F64 ? 1e-12 : rtol_of(dts[t]) * 0.1);
      atest_free(&ref);
      atest_free(&got);
      for (int j = 0; j < in.n; j++) nb_release(rounded[j]), nb_release(in.leaf[j]);
    }
}

/* No (Lq, Lk) tensor on the fused path: forward and backward at the
 * issue's memory shape, B1 H16 T32768 D128 bf16 causal (one T x T f32
 * matrix per head would be 4 GiB, 64 GiB for the 16 heads), raise the GPU's
 * peak by a few times the inputs' 128 MiB each, not by anything of T^2.
 * Runs first, while the peak is that of this call alone. */
static void cuda_memory(void) {
  nb_device gpu = {NB_CUDA, 0};
  enum { H = 16, T = 32768, D = 128 };
  nb_scope_begin();
  nb_rng rng = nb_rng_new(7);
  nb_tensor *in[3];
  for (int i = 0; i < 3; i++) {
    in[i] = nb_randn(&rng, 4, (int64_t[]){1, H, T, D}, 0.0, 1.0, NB_BF16, gpu);
    nb_set_requires_grad(in[i], 1);
  }
  const int64_t bytes = (int64_t)H * T * D * 2;
  nb_memory_stats before = {0}, after = {0};
  nb_cuda_memory_stats(0, &before);
  nb_tensor *y = nb_scaled_dot_product_attention(in[0], in[1], in[2], NULL, 1, 0, NULL, 0);
  nb_status st = y ? nb_backward(nb_sum(nb_cast(y, NB_F32), 0, NULL, 0), NULL) : nb_last_status();
  nb_cuda_memory_stats(0, &after);
  NBT_CHECK(st == NB_OK, "attention B1 H16 T32768 D128 on cuda: %s", nb_last_error());
  /* o, its f32 cast, dout, dq, dk, dv, the f32 lse and delta: under 10 x the input */
  NBT_CHECK(after.peak - before.allocated < 10 * bytes,
            "attention B1 H16 T32768 D128 on cuda: peak %lld bytes over the inputs (at most %lld "
            "expected; one T x T f32 matrix is 4 GiB)", (long long)(after.peak - before.allocated),
            (long long)(10 * bytes));
  printf("attention B1 H16 T32768 D128 bf16 causal fwd+bwd on cuda: peak %.1f MiB over the "
         "inputs (%.1f MiB each)\n", (after.peak - before.allocated) / 1048576.0, bytes / 1048576.0);
  nb_scope_end();
}

/* CUDA against the CPU's fused result from the same rounded inputs. */
static void cuda_cases(void) {
  nb_device gpu = {NB_CUDA, 0};
  const acase cases[] = {
    {2, 3, 7, 7, 8, 8, 0, 0},       {2, 3, 7, 7, 8, 8, 1, 0},        {1, 2, 1, 1, 64, 64, 1, 0},
    {2, 2, 64, 64, 64, 64, 1, 1},   {1, 2, 129, 129, 128, 128, 1, 1}, {2, 1, 5, 9, 12, 20, 1, 0},
    {2, 1, 9, 5, 12, 6, 1, 0},      {1, 3, 100, 37, 96, 96, 0, 0},   {1, 2, 1000, 1000, 64, 64, 1, 1},
    {1, 1, 77, 77, 256, 256, 1, 0}, {1, 1, 33, 33, 300, 300, 1, 0},  {1, 2, 4097, 4097, 64, 64, 1, 1},
  };
  const nb_dtype dts[] = {NB_F32, NB_BF16, NB_F16, NB_F64};
  int quick = getenv("NABLA_TEST_QUICK") != NULL;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (size_t t = 0; t < sizeof dts / sizeof *dts; t++) {
      const acase *c = &cases[i];
      if (c->Lq > 1000 && t) continue; /* 4097: f32 only */
      if (c->Lq >= 1000 && quick) continue; /* NABLA_TEST_QUICK (sanitizers): small cases */
      ainputs in = make_inputs(c, 300 + i);
      ainputs rin = in;
      nb_tensor *rounded[3];
      nb_scope_begin();
      for (int j = 0; j < in.n; j++) rin.leaf[j] = rounded[j] = nb_keep(nb_cast(in.leaf[j], dts[t]));
      nb_scope_end();
      aresult ref = run(c, &rin, NB_F64, CPU, 0);
      aresult got = run(c, &in, dts[t], gpu, 0), again = run(c, &in, dts[t], gpu, 0);
      char name[160];
      case_name(c, dts[t], "cuda", name, sizeof name);
      if (dts[t] == NB_F16 || dts[t] == NB_BF16)
        compare_norm(name, &got, &ref, in.n, dts[t] == NB_F16 ? 2e-3 : 1.5e-2);
      else
        compare(name, &got, &ref, in.n, dts[t] == NB_F32 ? 1e-4 : rtol_of(dts[t]),
                dts[t] == NB_F32 ? 1e-5 : 1e-11);
      check_same_bits(name, &got, &again, in.n);
      atest_free(&ref);
      atest_free(&got);
      atest_free(&again);
      for (int j = 0; j < in.n; j++) nb_release(rounded[j]), nb_release(in.leaf[j]);
    }
}

/* One CUDA case against the CPU's fused result in f64 from the same rounded
 * inputs, in norm (tol per dtype), and two runs compared bit for bit. */
static void cuda_check(const acase *c, nb_dtype dt, uint64_t seed, double tol) {
  nb_device gpu = {NB_CUDA, 0};
  ainputs in = make_inputs(c, seed);
  ainputs rin = in;
  nb_tensor *rounded[3];
  nb_scope_begin();
  for (int j = 0; j < in.n; j++) rin.leaf[j] = rounded[j] = nb_keep(nb_cast(in.leaf[j], dt));
  nb_scope_end();
  aresult ref = run(c, &rin, NB_F64, CPU, 0);
  aresult got = run(c, &in, dt, gpu, 0), again = run(c, &in, dt, gpu, 0);
  char name[160];
  case_name(c, dt, "cuda mma", name, sizeof name);
  compare_norm(name, &got, &ref, in.n, tol);
  check_same_bits(name, &got, &again, in.n);
  atest_free(&ref);
  atest_free(&got);
  atest_free(&again);
  for (int j = 0; j < in.n; j++) nb_release(rounded[j]), nb_release(in.leaf[j]);
}

/* The tensor-core kernels: bf16 and f16, head dims 64, 96, 128, tails of
 * every kind (T not a multiple of the 64-row tiles, one row, Lq < Lk and
 * Lq > Lk with causal aligned top-left), several (batch, head) pairs, the
 * packed (B, T, 3, H, D) views (batch stride T 3 H D, head stride D, row
 * stride 3 H D) and rows of stride D + 1 (the SIMT fallback). The error is
 * in norm against f64: P and dS are rounded to the input dtype before their
 * products, as in every flash attention. */
static void cuda_mma_cases(void) {
  const acase cases[] = {
    {2, 3, 1, 1, 64, 64, 0, 0},        {2, 3, 17, 17, 96, 96, 0, 0},
    {1, 2, 64, 64, 128, 128, 0, 0},    {2, 2, 100, 257, 64, 64, 0, 0},
    {2, 2, 257, 100, 128, 128, 0, 0},  {1, 2, 1000, 1000, 96, 96, 0, 1},
    {2, 2, 17, 1000, 128, 128, 0, 0},  {1, 3, 1000, 17, 64, 64, 0, 0},
    {2, 2, 257, 257, 128, 128, 0, 1},  {2, 4, 64, 100, 96, 96, 0, 0},
    {1, 2, 100, 100, 64, 64, 0, PAD_ROWS}, {1, 1, 1000, 1000, 128, 128, 0, 0},
  };
  const nb_dtype dts[] = {NB_BF16, NB_F16};
  int quick = getenv("NABLA_TEST_QUICK") != NULL;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (int causal = 0; causal < 2; causal++)
      for (size_t t = 0; t < sizeof dts / sizeof *dts; t++) {
        acase c = cases[i];
        c.causal = causal;
        if (quick && (c.Lq >= 1000 || c.Lk >= 1000)) continue; /* sanitizers: small cases */
        cuda_check(&c, dts[t], 500 + 10 * i + causal, dts[t] == NB_F16 ? 2e-3 : 1.5e-2);
      }
}

/* Bad input still names the op, whichever path the call would take. */
static void errors(void) {
  nb_scope_begin();
  nb_tensor *q = nbt_randn(1, 3, (int64_t[]){2, 4, 8}, NB_F32);
  nb_tensor *k6 = nbt_randn(2, 3, (int64_t[]){2, 4, 6}, NB_F32);
  nb_tensor *q16 = nb_cast(q, NB_F16);
  nbt_check_error("attention head dims", !nb_scaled_dot_product_attention(q, k6, k6, NULL, 0, 0, NULL, 0),
                  NB_ERR_SHAPE, "scaled_dot_product_attention", "[2, 4, 6]", NULL);
  nb_tensor *y = nb_scaled_dot_product_attention(q16, q, q, NULL, 1, 0, NULL, 0);
  NBT_CHECK(y && nb_dtype_of(y) == NB_F32, "attention mixed dtypes: composes with promotion (%s)",
            nb_last_error());
  nb_scope_end();
}

int main(void) {
  /* the fused kernels whatever the size (on CUDA small calls compose) */
  setenv("NABLA_ATTENTION", "fused", 1);
  cpu_cases();
  errors();
  if (nb_cuda_available() > 0) {
    if (!getenv("NABLA_TEST_QUICK")) cuda_memory();
    cuda_cases();
    cuda_mma_cases();
  }
  else printf("test_attention: no CUDA device, CUDA cases skipped\n");
  return nbt_finish();
}
