/* test_cuda sections "nn" (activations, losses, norms, convolution, pooling,
 * a small MLP and attention-shaped views: values and gradients) and "index". */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "cuda_test.h"

nb_tensor *f_softmax(nb_tensor *const *x, void *c) { return nb_softmax(x[0], *(int *)c); }
nb_tensor *f_log_softmax(nb_tensor *const *x, void *c) { return nb_log_softmax(x[0], *(int *)c); }
nb_tensor *f_layer_norm(nb_tensor *const *x, void *c) { return nb_layer_norm(x[0], 1, x[1], x[2], 1e-5); }
nb_tensor *f_rms_norm(nb_tensor *const *x, void *c) { return nb_rms_norm(x[0], 1, x[1], 1e-6); }
static nb_tensor *f_xent(nb_tensor *const *x, void *c) {
  return nb_cross_entropy(x[0], x[1], NB_REDUCE_MEAN, 3, *(double *)c);
}
static nb_tensor *f_embedding(nb_tensor *const *x, void *c) { return nb_embedding(x[0], x[1]); }
static nb_tensor *f_index_select(nb_tensor *const *x, void *c) { return nb_index_select(x[0], 1, x[1]); }
static nb_tensor *f_gather(nb_tensor *const *x, void *c) { return nb_gather(x[0], 1, x[1]); }
static nb_tensor *f_scatter_add(nb_tensor *const *x, void *c) { return nb_scatter_add(x[0], 1, x[1], x[2]); }
static nb_tensor *f_conv(nb_tensor *const *x, void *c) {
  nb_conv2d_params p = nb_conv2d_defaults();
  p.stride[0] = 2; p.stride[1] = 1; p.padding[0] = 1; p.padding[1] = 2;
  return nb_conv2d(x[0], x[1], x[2], p);
}
static nb_tensor *f_maxpool(nb_tensor *const *x, void *c) { return nb_max_pool2d(x[0], 3, 2, 2, 2, 1, 1); }
static nb_tensor *f_avgpool(nb_tensor *const *x, void *c) { return nb_avg_pool2d(x[0], 3, 3, 2, 1, 1, 1); }
static nb_tensor *f_mlp(nb_tensor *const *x, void *c) {
  return nb_gelu(nb_linear(nb_tanh(x[0]), x[1], x[2]));
}
/* q k^T and (q k^T) v on (B, H, T, D) views of one (B, T, 3, H, D) tensor, as
 * attention reads its projection: batch axes that do not merge. */
static nb_tensor *f_qkv_views(nb_tensor *const *x, void *c) {
  (void)c;
  nb_tensor *t = nb_permute(x[0], (int[]){2, 0, 3, 1, 4});
  nb_tensor *q = nb_select(t, 0, 0), *k = nb_select(t, 0, 1), *v = nb_select(t, 0, 2);
  return nb_matmul(nb_matmul(q, nb_transpose(k, -1, -2)), v);
}

void test_nn(void) {
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++) {
    nb_dtype dt = FLOATS[d];
    /* B = 9 products of H each: copied and run as one batch (cuda_gemm.cu's
     * mm_flatten_pays); B = 3: one call per b */
    for (int64_t B = 9; B >= 3; B -= 6) {
      nb_scope_begin();
      nb_tensor *qkv = randn(80 + (int)B, 5, (int64_t[]){B, 7, 3, 2, 8}, dt);
      grad_cmp(B > 4 ? "matmul on attention views, copied" : "matmul on attention views, looped",
               f_qkv_views, NULL, 1, &qkv, dt, 8.0);
      nb_scope_end();
    }
    const int64_t Ds[] = {7, 100, quick ? 1500 : 5000, quick ? 9000 : 20000};
    for (int k = 0; k < 4; k++) {
      nb_scope_begin();
      int64_t R = quick ? 3 : (k < 2 ? 67 : 9);
      nb_tensor *x = randn(70 + k, 2, (int64_t[]){R, Ds[k]}, dt);
      int ax = -1, ax0 = 0;
      char name[64];
      snprintf(name, sizeof name, "softmax D=%lld", (long long)Ds[k]);
      grad_cmp(name, f_softmax, &ax, 1, &x, dt, 2.0);
      snprintf(name, sizeof name, "log_softmax D=%lld", (long long)Ds[k]);
      grad_cmp(name, f_log_softmax, &ax, 1, &x, dt, 2.0);
      if (k < 2) grad_cmp("softmax axis 0", f_softmax, &ax0, 1, &x, dt, 2.0);
      nb_tensor *w = nb_add_scalar(randn(80 + k, 1, &Ds[k], dt), 1.0), *b = randn(90 + k, 1, &Ds[k], dt);
      nb_tensor *in[3] = {x, w, b};
      snprintf(name, sizeof name, "layer_norm D=%lld", (long long)Ds[k]);
      grad_cmp(name, f_layer_norm, NULL, 3, in, dt, 4.0 + Ds[k] / 500.0);
      snprintf(name, sizeof name, "rms_norm D=%lld", (long long)Ds[k]);
      grad_cmp(name, f_rms_norm, NULL, 2, in, dt, 4.0 + Ds[k] / 500.0);
      nb_scope_end();
    }
    for (int k = 0; k < 2; k++) {
      nb_scope_begin();
      int64_t N = quick ? 5 : 29, C = k ? (quick ? 3000 : 50257) : 11;
      nb_tensor *logits = randn(100 + k, 2, (int64_t[]){N, C}, dt);
      nb_rng rng = nb_rng_new(7);
      nb_tensor *tg = nb_randint(&rng, 1, &N, 0, C, NB_I64, NB_DEVICE_CPU);
      nb_fill_(nb_slice(tg, 0, 0, 2, 1), 3); /* rows with ignore_index 3 */
      double sm = k ? 0.1 : 0.0;
      nb_tensor *in[2] = {logits, tg};
      grad_cmp(k ? "cross_entropy C=50257 smoothing" : "cross_entropy C=11", f_xent, &sm, 2, in, dt, 4.0);
      nb_tensor *in2[2] = {nb_transpose(randn(102, 2, (int64_t[]){C, N}, dt), 0, 1), tg};
      grad_cmp("cross_entropy transposed logits", f_xent, &sm, 2, in2, dt, 4.0);
      nb_scope_end();
    }
    nb_scope_begin();
    nb_tensor *x4 = randn(110, 4, (int64_t[]){2, 3, quick ? 7 : 13, quick ? 8 : 17}, dt);
    nb_tensor *cw = randn(111, 4, (int64_t[]){4, 3, 3, 3}, dt), *cb = randn(112, 1, (int64_t[]){4}, dt);
    nb_tensor *cin[3] = {x4, cw, cb};
    grad_cmp("conv2d", f_conv, NULL, 3, cin, dt, 8.0);
    grad_cmp("max_pool2d", f_maxpool, NULL, 1, &x4, dt, 1.0);
    grad_cmp("avg_pool2d", f_avgpool, NULL, 1, &x4, dt, 2.0);
    nb_tensor *mx = randn(113, 2, (int64_t[]){9, 31}, dt), *mw = randn(114, 2, (int64_t[]){19, 31}, dt);
    nb_tensor *mb = randn(115, 1, (int64_t[]){19}, dt);
    nb_tensor *min_[3] = {mx, mw, mb};
    grad_cmp("tanh-linear-gelu", f_mlp, NULL, 3, min_, dt, 8.0);
    nb_scope_end();
  }
}

void test_index(void) {
  for (int det = 1; det >= 0; det--) {
    nb_set_deterministic(det);
    for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++) {
      nb_dtype dt = FLOATS[d];
      nb_scope_begin();
      int64_t V = quick ? 50 : 1000, D = quick ? 9 : 65, J = quick ? 300 : 5000;
      nb_rng rng = nb_rng_new(11);
      nb_tensor *wt = randn(120, 2, (int64_t[]){V, D}, dt);
      nb_tensor *idx = nb_randint(&rng, 1, &J, 0, V / 10, NB_I64, NB_DEVICE_CPU); /* many repeats */
      nb_tensor *in[2] = {wt, idx};
      char name[64];
      snprintf(name, sizeof name, "embedding (det %d)", det);
      /* ~50 repeats per row: the CPU rounds f16/bf16 after each addition,
       * CUDA once after f32 accumulation, so the reference itself drifts */
      double half = dt == NB_F16 || dt == NB_BF16 ? 8.0 : 1.0;
      grad_cmp(name, f_embedding, NULL, 2, in, dt, half * (det ? 1.0 : 4.0));
      nb_tensor *x3 = randn(121, 3, (int64_t[]){3, 17, 5}, dt);
      int64_t j2 = 23;
      nb_tensor *idx2 = nb_randint(&rng, 1, &j2, 0, 17, NB_I64, NB_DEVICE_CPU);
      nb_tensor *in2[2] = {nb_transpose(nb_transpose(x3, 0, 2), 0, 2), idx2};
      snprintf(name, sizeof name, "index_select axis 1 (det %d)", det);
      grad_cmp(name, f_index_select, NULL, 2, in2, dt, det ? 1.0 : 4.0);
      nb_tensor *gi = nb_randint(&rng, 3, (int64_t[]){3, 9, 5}, 0, 17, NB_I64, NB_DEVICE_CPU);
      nb_tensor *in3[2] = {x3, gi};
      snprintf(name, sizeof name, "gather (det %d)", det);
      grad_cmp(name, f_gather, NULL, 2, in3, dt, det ? 1.0 : 4.0);
      nb_tensor *src = randn(122, 3, (int64_t[]){3, 9, 5}, dt);
      nb_tensor *in4[3] = {x3, gi, src};
      snprintf(name, sizeof name, "scatter_add (det %d)", det);
      grad_cmp(name, f_scatter_add, NULL, 3, in4, dt, det ? 1.0 : 4.0);
      nb_scope_end();
    }
  }
  nb_set_deterministic(1);
  /* deterministic embedding gradient repeats bit for bit, and equals the
   * CPU's in f32 (same summation order) */
  nb_scope_begin();
  int64_t V = 64, D = 33, J = quick ? 999 : 20000;
  nb_rng rng = nb_rng_new(5);
  nb_tensor *idx = nb_randint(&rng, 1, &J, 0, 8, NB_I64, NB_DEVICE_CPU);
  nb_tensor *src = randn(123, 2, (int64_t[]){J, D}, NB_F32);
  nb_tensor *z = nb_zeros(2, (int64_t[]){V, D}, NB_F32, NB_DEVICE_CPU);
  nb_tensor *r_cpu = nb_scatter_add(z, 0, nb_expand(nb_unsqueeze(idx, 1), 2, (int64_t[]){J, D}), src);
  nb_tensor *g1 = gpu(z);
  nb_set_requires_grad(g1, 1);
  nb_backward(nb_embedding(g1, gpu(idx)), gpu(src));
  nb_tensor *ga = nb_clone(nb_grad(g1));
  nb_zero_grad(g1);
  nb_backward(nb_embedding(g1, gpu(idx)), gpu(src));
  cmp_bits("deterministic embedding grad repeats", ga, nb_grad(g1));
  cmp_bits("deterministic embedding grad equals cpu (f32)", r_cpu, ga);
  nb_scope_end();
}
