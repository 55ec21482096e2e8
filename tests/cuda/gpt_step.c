#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "cuda_test.h"

/* ==== a whole training step (tools/gpt.c) ====================================
 * The main job's model, small: the same weights on the CPU and the GPU, one
 * forward, backward, gradient clipping and AdamW step on each, every loss,
 * gradient and updated parameter compared. Ops that pass alone can still
 * fail together (a view the op tests never make, a shape such as vocab 12, the
 * ignored targets of the addition task); this is where that shows. */
#include "gpt.h"

static void gpt_copy_weights(const gpt_model *dst, const gpt_model *src) {
  nb_no_grad_begin();
  for (int i = 0; i < nb_params_count(src->all); i++)
    NBT_CHECK(nb_copy_(nb_params_get(dst->all, i), nb_params_get(src->all, i)) == NB_OK,
              "gpt: copying %s: %s", nb_params_name(src->all, i), nb_last_error());
  nb_no_grad_end();
}

/* Loss and gradients of one batch (NAN on error). */
static double gpt_grads(gpt_model *m, const int64_t *x, const int64_t *y, int B, int T) {
  nb_scope_begin();
  nb_tensor *idx = nb_from_buffer(x, 2, (int64_t[]){B, T}, NB_I64, m->device);
  nb_tensor *tgt = nb_from_buffer(y, 2, (int64_t[]){B, T}, NB_I64, m->device);
  nb_tensor *loss = gpt_loss(m, idx, tgt);
  double value = loss && nb_backward(loss, NULL) == NB_OK ? nb_item(loss) : NAN;
  nb_scope_end();
  return value;
}

/* Clipping and one AdamW step; returns the norm before clipping (NAN on error). */
static double gpt_update(gpt_model *m) {
  double norm = nb_clip_grad_norm(m->all, 1.0);
  nb_optim *opt = nb_adamw_new(m->all, 1e-3, 0.9, 0.95, 1e-8, 0.1);
  if (!opt || nb_optim_step(opt) != NB_OK) norm = NAN;
  nb_optim_free(opt);
  return norm;
}

/* Every parameter's gradient (grads) or value, CUDA against CPU. */
static void gpt_cmp_params(const gpt_model *mc, const gpt_model *mg, int grads, const char *what) {
  for (int i = 0; i < nb_params_count(mc->all); i++) {
    char name[128];
    snprintf(name, sizeof name, "gpt step (vocab %d): %s of %s", mc->cfg.vocab, what,
             nb_params_name(mc->all, i));
    nb_tensor *c = nb_params_get(mc->all, i), *g = nb_params_get(mg->all, i);
    /* summed over many rows in another order (and through tensor cores) */
    cmp(name, NB_F32, grads ? nb_grad(c) : c, grads ? nb_grad(g) : g, 5.0);
  }
}

static void gpt_step_case(gpt_config cfg, int B, int ignored, uint64_t seed) {
  nb_rng r1 = nb_rng_new(seed), r2 = nb_rng_new(seed);
  gpt_model *mc = gpt_new(cfg, NB_DEVICE_CPU, &r1), *mg = gpt_new(cfg, G, &r2);
  NBT_CHECK(mc && mg, "gpt (vocab %d, dim %d): model: %s", cfg.vocab, cfg.dim, nb_last_error());
  if (!mc || !mg) {
    gpt_free(mc);
    gpt_free(mg);
    nb_clear_error();
    return;
  }
  gpt_copy_weights(mg, mc);
  int T = cfg.context;
  int64_t *x = malloc(sizeof *x * (size_t)(B * T)), *y = malloc(sizeof *y * (size_t)(B * T));
  uint64_t s = seed * 2654435761u + 1;
  for (int i = 0; i < B * T; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (int64_t)((s >> 33) % (uint64_t)cfg.vocab);
    y[i] = i % T < ignored ? -1 : (int64_t)((s >> 17) % (uint64_t)cfg.vocab);
  }
  double lc = gpt_grads(mc, x, y, B, T), lg = gpt_grads(mg, x, y, B, T);
  NBT_CHECK(isfinite(lg) && fabs(lg - lc) <= 1e-3 * fabs(lc),
            "gpt (vocab %d, dim %d): loss cuda %.7g vs cpu %.7g (%s)", cfg.vocab, cfg.dim, lg, lc,
            nb_last_error());
  nb_clear_error();
  gpt_cmp_params(mc, mg, 1, "gradient");
  double nc = gpt_update(mc), ng = gpt_update(mg);
  NBT_CHECK(isfinite(ng) && fabs(ng - nc) <= 1e-2 * fabs(nc),
            "gpt (vocab %d, dim %d): gradient norm cuda %.7g vs cpu %.7g (%s)", cfg.vocab, cfg.dim,
            ng, nc, nb_last_error());
  nb_clear_error();
  gpt_cmp_params(mc, mg, 0, "updated value");
  free(x);
  free(y);
  gpt_free(mc);
  gpt_free(mg);
}

/* ||a - b|| / ||b|| over two tensors of one shape (as f64 on the host). */
static double rel_l2(const nb_tensor *a, const nb_tensor *b) {
  if (!a || !b || nb_numel(a) != nb_numel(b)) return INFINITY;
  double *x = nbt_f64(a), *y = nbt_f64(b), d = 0, n = 0;
  int64_t len = nb_numel(b);
  for (int64_t i = 0; x && y && i < len; i++) {
    d += (x[i] - y[i]) * (x[i] - y[i]);
    n += y[i] * y[i];
  }
  free(x);
  free(y);
  return len ? sqrt(d) / (sqrt(n) + 1e-30) : INFINITY;
}

/* GPT-2 small's preset (12 layers, width 768, vocabulary 50,304) at context
 * 64, batch 2, under bf16 autocast on both devices: the loss and every
 * parameter's gradient, CUDA against the CPU. Both round to bf16 at the same
 * points; they differ in summation order (tensor cores, blocked reductions),
 * which moves a bf16 rounding now and then: the stated tolerance is a
 * relative L2 error of 2% per gradient and 1e-2 relative on the loss. */
static void gpt2_preset_bf16_case(void) {
  gpt_config cfg = gpt_preset_gpt2();
  cfg.vocab = gpt_padded_vocab(cfg.vocab);
  cfg.context = 64;
  enum { B = 2 };
  nb_rng r1 = nb_rng_new(903), r2 = nb_rng_new(903);
  gpt_model *mc = gpt_new(cfg, NB_DEVICE_CPU, &r1), *mg = gpt_new(cfg, G, &r2);
  NBT_CHECK(mc && mg, "gpt2 preset bf16: model: %s", nb_last_error());
  int T = cfg.context;
  int64_t x[B * 64], y[B * 64];
  uint64_t s = 903;
  for (int i = 0; i < B * T; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (int64_t)((s >> 33) % 50257);
    y[i] = (int64_t)((s >> 17) % 50257);
  }
  double lc = NAN, lg = NAN;
  if (mc && mg) {
    gpt_copy_weights(mg, mc);
    nb_autocast_begin(NB_BF16);
    lc = gpt_grads(mc, x, y, B, T);
    lg = gpt_grads(mg, x, y, B, T);
    nb_autocast_end();
  }
  NBT_CHECK(isfinite(lc) && isfinite(lg) && fabs(lg - lc) <= 1e-2 * fabs(lc),
            "gpt2 preset bf16: loss cuda %.7g vs cpu %.7g (%s)", lg, lc, nb_last_error());
  nb_clear_error();
  double worst = 0;
  const char *worst_name = "";
  for (int i = 0; mc && mg && i < nb_params_count(mc->all); i++) {
    double e = rel_l2(nb_grad(nb_params_get(mg->all, i)), nb_grad(nb_params_get(mc->all, i)));
    if (!(e <= worst)) worst = e, worst_name = nb_params_name(mc->all, i);
  }
  NBT_CHECK(mc && mg && worst <= 2e-2, "gpt2 preset bf16: largest relative L2 gradient error "
            "%.3g (%s; expected at most 2e-2)", worst, worst_name);
  gpt_free(mc);
  gpt_free(mg);
}

void test_gpt_step(void) {
  /* GPT-2 small itself, bf16 (a few seconds of CPU work: not in quick runs) */
  if (!quick) gpt2_preset_bf16_case();
  /* the addition task's shape (vocab 12, context 11, prompt targets ignored) */
  gpt_step_case((gpt_config){12, 11, 2, 4, 64}, quick ? 4 : 32, 5, 901);
  /* the text task's (vocab 95, no ignored targets), odd batch */
  gpt_step_case((gpt_config){95, 32, 2, 6, 96}, quick ? 3 : 9, 0, 902);
}
