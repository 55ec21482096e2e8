/* GPT model: parameters, initialisation and the forward pass. Only the
 * public API is used, so the same code runs on every device. */
#include "gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define GPT_LN_EPS 1e-5
#define GPT_EMB_STD 0.02 /* token and position embeddings */

/* Standard deviation of the matrices that read the residual stream (qkv,
 * fc): 1/sqrt(dim), the fan-in scale, so that q.k and the MLP's
 * pre-activations start at order one whatever the width. GPT-2's fixed 0.02
 * is that scale at width 2500; at the CPU default's width 64 it is 6x
 * smaller, every attention score starts near zero, attention is uniform,
 * and the gradient of the bilinear q.k vanishes with it: the addition task
 * then sat on loss plateaus whose length depended on the seed (and on
 * rounding), and the default run ended at 10% for seed 1 (bench/results/
 * cpu-2026-11-24-default-recipe.md). */
static double gpt_init_std(const gpt_config *c) { return 1.0 / sqrt((double)c->dim); }

gpt_config gpt_preset_gpt2(void) {
  return (gpt_config){.vocab = GPT2_VOCAB, .context = 1024, .layers = 12, .heads = 12, .dim = 768};
}

int gpt_padded_vocab(int vocab) {
  return (vocab + GPT_VOCAB_ALIGN - 1) / GPT_VOCAB_ALIGN * GPT_VOCAB_ALIGN;
}

const char *gpt_config_check(const gpt_config *c) {
  static char msg[160];
  if (c->vocab < 2) snprintf(msg, sizeof msg, "vocabulary of %d tokens (need >= 2)", c->vocab);
  else if (c->context < 1) snprintf(msg, sizeof msg, "context %d (need >= 1)", c->context);
  else if (c->layers < 1) snprintf(msg, sizeof msg, "%d layers (need >= 1)", c->layers);
  else if (c->heads < 1) snprintf(msg, sizeof msg, "%d heads (need >= 1)", c->heads);
  else if (c->dim < 1 || c->dim % c->heads)
    snprintf(msg, sizeof msg, "--dim %d is not a positive multiple of --heads %d", c->dim,
             c->heads);
  else return NULL;
  return msg;
}

typedef enum { GPT_INIT_NORMAL, GPT_INIT_ZERO, GPT_INIT_ONE } gpt_init;

/* Creates one f32 parameter, initialises it, and registers it in m->all and
 * in group. The tensor is owned by the parameter lists. */
static nb_tensor *gpt_param(gpt_model *m, nb_params *group, const char *name, int ndim,
                            const int64_t *shape, gpt_init init, double std, nb_rng *rng) {
  nb_tensor *t = nb_zeros(ndim, shape, NB_F32, m->device);
  if (!t) return NULL;
  nb_status st = NB_OK;
  if (init == GPT_INIT_NORMAL) st = nb_init_normal_(t, rng, 0.0, std);
  else if (init == GPT_INIT_ONE) st = nb_fill_(t, 1.0);
  if (st != NB_OK) return NULL;
  if (!nb_params_add(m->all, name, t)) return NULL;
  return nb_params_add(group, name, t);
}

/* A layer norm's weight (ones) and bias (zeros), both without decay. */
static int gpt_norm_params(gpt_model *m, const char *prefix, nb_tensor **w, nb_tensor **b) {
  char name[64];
  int64_t c = m->cfg.dim;
  snprintf(name, sizeof name, "%s.weight", prefix);
  *w = gpt_param(m, m->no_decay, name, 1, &c, GPT_INIT_ONE, 0, NULL);
  snprintf(name, sizeof name, "%s.bias", prefix);
  *b = gpt_param(m, m->no_decay, name, 1, &c, GPT_INIT_ZERO, 0, NULL);
  return *w && *b;
}

/* A linear layer's weight (out, in) with normal(std) and zero bias (out). */
static int gpt_linear_params(gpt_model *m, const char *prefix, int64_t out, int64_t in,
                             double std, nb_rng *rng, nb_tensor **w, nb_tensor **b) {
  char name[64];
  int64_t ws[2] = {out, in};
  snprintf(name, sizeof name, "%s.weight", prefix);
  *w = gpt_param(m, m->decay, name, 2, ws, GPT_INIT_NORMAL, std, rng);
  snprintf(name, sizeof name, "%s.bias", prefix);
  *b = gpt_param(m, m->no_decay, name, 1, &out, GPT_INIT_ZERO, 0, NULL);
  return *w && *b;
}

static int gpt_block_params(gpt_model *m, int l, nb_rng *rng) {
  gpt_block *b = &m->blocks[l];
  int64_t c = m->cfg.dim;
  /* Residual projections are scaled down so the residual stream's variance
   * does not grow with depth (GPT-2's 1/sqrt(2 * layers)). */
  double std = gpt_init_std(&m->cfg), res_std = std / sqrt(2.0 * m->cfg.layers);
  char p[48];
  int ok = 1;
  snprintf(p, sizeof p, "h.%d.ln1", l);
  ok = ok && gpt_norm_params(m, p, &b->ln1_w, &b->ln1_b);
  snprintf(p, sizeof p, "h.%d.attn.qkv", l);
  ok = ok && gpt_linear_params(m, p, 3 * c, c, std, rng, &b->qkv_w, &b->qkv_b);
  snprintf(p, sizeof p, "h.%d.attn.proj", l);
  ok = ok && gpt_linear_params(m, p, c, c, res_std, rng, &b->proj_w, &b->proj_b);
  snprintf(p, sizeof p, "h.%d.ln2", l);
  ok = ok && gpt_norm_params(m, p, &b->ln2_w, &b->ln2_b);
  snprintf(p, sizeof p, "h.%d.mlp.fc", l);
  ok = ok && gpt_linear_params(m, p, 4 * c, c, std, rng, &b->fc_w, &b->fc_b);
  snprintf(p, sizeof p, "h.%d.mlp.proj", l);
  ok = ok && gpt_linear_params(m, p, c, 4 * c, res_std, rng, &b->out_w, &b->out_b);
  return ok;
}

static int gpt_all_params(gpt_model *m, nb_rng *rng) {
  int64_t te[2] = {m->cfg.vocab, m->cfg.dim}, pe[2] = {m->cfg.context, m->cfg.dim};
  /* Embeddings get no decay: the tied head reads wte too, and decaying rare
   * tokens' rows toward zero only hurts. */
  m->wte = gpt_param(m, m->no_decay, "wte", 2, te, GPT_INIT_NORMAL, GPT_EMB_STD, rng);
  m->wpe = gpt_param(m, m->no_decay, "wpe", 2, pe, GPT_INIT_NORMAL, GPT_EMB_STD, rng);
  if (!m->wte || !m->wpe) return 0;
  for (int l = 0; l < m->cfg.layers; l++)
    if (!gpt_block_params(m, l, rng)) return 0;
  return gpt_norm_params(m, "ln_f", &m->lnf_w, &m->lnf_b);
}

gpt_model *gpt_new(gpt_config cfg, nb_device dev, nb_rng *rng) {
  gpt_model *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->cfg = cfg;
  m->device = dev;
  m->blocks = calloc((size_t)cfg.layers, sizeof *m->blocks);
  m->all = nb_params_new();
  m->decay = nb_params_new();
  m->no_decay = nb_params_new();
  if (!m->blocks || !m->all || !m->decay || !m->no_decay) {
    gpt_free(m);
    return NULL;
  }
  /* The scope drops the creation references; the parameter lists keep theirs. */
  nb_scope_begin();
  int ok = gpt_all_params(m, rng);
  nb_scope_end();
  if (!ok) {
    gpt_free(m);
    return NULL;
  }
  return m;
}

void gpt_free(gpt_model *m) {
  if (!m) return;
  nb_params_free(m->all);
  nb_params_free(m->decay);
  nb_params_free(m->no_decay);
  free(m->blocks);
  free(m);
}

/* Causal multi-head self-attention on x (B, T, C). */
static nb_tensor *gpt_attention(const gpt_model *m, const gpt_block *b, const nb_tensor *x) {
  nb_tensor *qkv = nb_linear(x, b->qkv_w, b->qkv_b); /* (B,T,3C): q, k, v, each (H,D) */
  nb_tensor *y = nb_attention_qkv(qkv, m->cfg.heads, 1, 0.0); /* (B,T,C), no copies */
  return nb_linear(y, b->proj_w, b->proj_b);
}

static nb_tensor *gpt_mlp(const gpt_block *b, const nb_tensor *x) {
  nb_tensor *h = nb_gelu_tanh(nb_linear(x, b->fc_w, b->fc_b)); /* (B,T,4C) */
  return nb_linear(h, b->out_w, b->out_b);
}

nb_tensor *gpt_forward(const gpt_model *m, const nb_tensor *idx) {
  if (!idx) return NULL;
  int64_t T = nb_size(idx, 1);
  nb_tensor *x = nb_add(nb_embedding(m->wte, idx), nb_narrow(m->wpe, 0, 0, T)); /* (B,T,C) */
  /* a scope per block: its intermediates are freed when the block is done,
   * except what the graph keeps for backward (as in a language with
   * reference counting; the caller's scope would otherwise hold them all) */
  for (int l = 0; l < m->cfg.layers; l++) {
    const gpt_block *b = &m->blocks[l];
    nb_scope_begin();
    x = nb_add(x, gpt_attention(m, b, nb_layer_norm(x, 1, b->ln1_w, b->ln1_b, GPT_LN_EPS)));
    x = nb_scope_return(nb_add(x, gpt_mlp(b, nb_layer_norm(x, 1, b->ln2_w, b->ln2_b, GPT_LN_EPS))));
  }
  x = nb_layer_norm(x, 1, m->lnf_w, m->lnf_b, GPT_LN_EPS);
  return nb_linear(x, m->wte, NULL); /* (B,T,V): the head is wte itself (tied), read as (V, C) */
}

nb_tensor *gpt_loss(const gpt_model *m, const nb_tensor *idx, const nb_tensor *targets) {
  nb_scope_begin(); /* the logits go once the loss has what it needs */
  nb_tensor *logits = gpt_forward(m, idx);
  nb_tensor *flat = nb_reshape(logits, 2, (int64_t[]){-1, m->cfg.vocab});
  nb_tensor *tflat = nb_reshape(targets, 1, (int64_t[]){-1});
  return nb_scope_return(nb_cross_entropy(flat, tflat, NB_REDUCE_MEAN, -1, 0.0));
}
