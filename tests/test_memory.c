/* A training loop of 10,000 forward+backward steps on a small MLP whose
 * memory stays flat: live tensors and bytes return to the same level every
 * step, and the loss falls. And a graph keeps only the memory its backward
 * reads: an intermediate consumed only by ops whose rules read its shape
 * (cast, add, sum) is freed while the graph lives; with a scope per layer
 * the forward holds only what backward reads, and backward frees each
 * node's saved tensors and scratch as it goes (its peak is a few tensors
 * above the forward's, not one per node). */
#include <math.h>
#include <stdlib.h>

#include "core/core.h"
#include "testutil.h"

/* A CPU allocator that counts the bytes it holds and their peak. */
static const nb_allocator *counted_base;
static int64_t counted_now, counted_peak;
static void *counted_alloc(nb_device dev, size_t n) {
  void *p = counted_base->alloc(dev, n);
  if (p && (counted_now += (int64_t)n) > counted_peak) counted_peak = counted_now;
  return p;
}
static void counted_free(nb_device dev, void *p, size_t n) {
  counted_now -= (int64_t)n;
  counted_base->free(dev, p, n);
}

/* L layers x = tanh(2 x + 1) of N floats, a scope per layer: after the
 * forward the graph holds the L tanh outputs (their rule reads them) and
 * nothing of the scaled intermediates; backward then runs in a few
 * tensors more than that. Before nodes dropped their references as they
 * ran (and rules' scratch was freed per node), backward's peak grew by
 * about four tensors per layer. */
static void test_layer_scopes_and_backward_free_as_they_go(void) {
  enum { L = 32, N = 1 << 14 };
  const int64_t tb = (int64_t)N * 4;
  static const nb_allocator counted = {counted_alloc, counted_free};
  counted_base = nb_allocator_for(NB_DEVICE_CPU);
  nb_set_allocator(NB_CPU, &counted);
  nb_tensor *x0 = nb_full(1, (int64_t[]){N}, 0.01, NB_F32, NB_DEVICE_CPU);
  nb_set_requires_grad(x0, 1);
  nb_scope_begin();
  int64_t base = counted_now;
  nb_tensor *x = x0;
  for (int l = 0; l < L; l++) {
    nb_scope_begin();
    x = nb_scope_return(nb_tanh(nb_add_scalar(nb_mul_scalar(x, 2.0), 1.0)));
  }
  nb_tensor *s = nb_sum(x, 0, NULL, 0);
  int64_t held = counted_now - base;
  NBT_CHECK(held <= (L + 1) * tb, "after the forward of %d layers %lld bytes are held (expected "
            "at most the %d tanh outputs and a scalar: %lld)", L, (long long)held, L,
            (long long)((L + 1) * tb));
  counted_peak = counted_now;
  NBT_CHECK(nb_backward(s, NULL) == NB_OK, "backward: %s", nb_last_error());
  int64_t extra = counted_peak - base - held;
  NBT_CHECK(extra <= 8 * tb, "backward's peak is %lld bytes above the forward's (expected a few "
            "tensors of %lld bytes, not some per layer)", (long long)extra, (long long)tb);
  /* d x_L / d x_0 by the chain rule in float64 */
  double v = 0.01, d = 1.0;
  for (int l = 0; l < L; l++) {
    double y = tanh(2.0 * (double)(float)v + 1.0);
    d *= 2.0 * (1.0 - y * y);
    v = y;
  }
  double *g = nbt_f64(nb_grad(x0));
  NBT_CHECK(g && fabs(g[0] - d) <= 1e-4 * fabs(d) + 1e-12 && g[N - 1] == g[0],
            "gradient %g (expected %g)", g ? g[0] : 0.0, d);
  free(g);
  nb_scope_end();
  nb_release(x0);
  nb_set_allocator(NB_CPU, NULL);
}

/* h = 2 w (its rule reads w), t = cast(h) + c, s = sum(t): the graph reads
 * neither h nor t's data in backward, so after the forward only w, c and
 * the scalar s hold memory; the gradient is still 2 everywhere. */
static void test_graph_keeps_only_what_backward_reads(void) {
  enum { N = 1 << 18 };
  nb_tensor *w = nb_ones(1, (int64_t[]){N}, NB_F32, NB_DEVICE_CPU);
  nb_tensor *c = nb_ones(1, (int64_t[]){N}, NB_F64, NB_DEVICE_CPU);
  nb_set_requires_grad(w, 1);
  int64_t base = nb_live_bytes(NB_DEVICE_CPU);
  nb_scope_begin();
  nb_tensor *h = nb_mul_scalar(w, 2.0);
  nb_tensor *t = nb_add(nb_cast(h, NB_F64), c);
  nb_tensor *s = nb_keep(nb_sum(t, 0, NULL, 0));
  nb_scope_end();
  int64_t held = nb_live_bytes(NB_DEVICE_CPU) - base;
  /* h (1 MiB), cast(h) and t (2 MiB each) would be 5 MiB kept by the nodes */
  NBT_CHECK(held < 64 * 1024, "after the forward the graph holds %lld bytes beyond its leaves "
            "(expected a few: the scalars)", (long long)held);
  NBT_CHECK(nb_backward(s, NULL) == NB_OK, "backward: %s", nb_last_error());
  nb_tensor *g = nb_grad(w);
  double *v = g ? nbt_f64(g) : NULL;
  int ok = v != NULL;
  for (int64_t i = 0; ok && i < N; i++) ok = v[i] == 2.0;
  NBT_CHECK(ok, "d sum(cast(2 w) + c) / dw = 2 everywhere");
  free(v);
  nb_release(s);
  nb_release(w);
  nb_release(c);
}

int main(void) {
  test_graph_keeps_only_what_backward_reads();
  test_layer_scopes_and_backward_free_as_they_go();
  nb_rng rng = nb_rng_new(7);
  nb_tensor *w1 = nb_randn(&rng, 2, (int64_t[]){8, 16}, 0, 0.3, NB_F32, NB_DEVICE_CPU);
  nb_tensor *w2 = nb_randn(&rng, 2, (int64_t[]){16, 1}, 0, 0.3, NB_F32, NB_DEVICE_CPU);
  nb_tensor *x = nb_randn(&rng, 2, (int64_t[]){32, 8}, 0, 1, NB_F32, NB_DEVICE_CPU);
  nb_scope_begin();
  nb_tensor *y = nb_keep(nb_sum(nb_sin(x), 1, (int[]){1}, 1)); /* target (32, 1) */
  nb_scope_end();
  nb_set_requires_grad(w1, 1);
  nb_set_requires_grad(w2, 1);
  int64_t tensors0 = 0, bytes0 = 0;
  double first = 0, last = 0;
  int flat = 1;
  for (int step = 0; step < 10000; step++) {
    nb_scope_begin();
    nb_tensor *h = nb_tanh(nb_matmul(x, w1));
    nb_tensor *loss = nb_mean(nb_square(nb_sub(nb_matmul(h, w2), y)), 0, NULL, 0);
    if (nb_backward(loss, NULL)) { NBT_CHECK(0, "backward failed: %s", nb_last_error()); nb_scope_end(); break; }
    last = nb_item(loss);
    if (step == 0) first = last;
    nb_no_grad_begin();
    nb_tensor *ws[2] = {w1, w2};
    for (int i = 0; i < 2; i++) {
      nb_copy_(ws[i], nb_sub(ws[i], nb_mul_scalar(nb_grad(ws[i]), 0.05)));
      nb_zero_grad(ws[i]);
    }
    nb_no_grad_end();
    nb_scope_end();
    if (step == 10) { tensors0 = nb_live_tensors(); bytes0 = nb_live_bytes(NB_DEVICE_CPU); }
    if (step > 10 && (nb_live_tensors() != tensors0 || nb_live_bytes(NB_DEVICE_CPU) != bytes0)) flat = 0;
  }
  NBT_CHECK(flat, "memory stays flat over 10,000 steps (tensors %lld -> %lld, bytes %lld -> %lld)",
            (long long)tensors0, (long long)nb_live_tensors(), (long long)bytes0,
            (long long)nb_live_bytes(NB_DEVICE_CPU));
  NBT_CHECK(last < 0.2 * first, "loss falls (%g -> %g)", first, last);
  nb_release(w1); nb_release(w2); nb_release(x); nb_release(y);
  NBT_CHECK(nb_live_tensors() == 0, "nothing left alive (%lld tensors)", (long long)nb_live_tensors());
  return nbt_finish();
}
