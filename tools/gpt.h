/* A GPT-style decoder-only transformer written against the public API:
 * token and position embeddings, pre-norm blocks (causal self-attention and
 * a GELU MLP, each with a residual), a final layer norm and an output head
 * tied to the token embedding. */
#ifndef NB_TOOL_GPT_H
#define NB_TOOL_GPT_H

#include "nabla.h"

typedef struct {
  int vocab;   /* number of token ids */
  int context; /* longest input sequence */
  int layers;
  int heads;
  int dim;     /* model width; a multiple of heads */
} gpt_config;

typedef struct {
  nb_tensor *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
  nb_tensor *ln2_w, *ln2_b, *fc_w, *fc_b, *out_w, *out_b;
} gpt_block;

typedef struct {
  gpt_config cfg;
  nb_device device;
  /* Every parameter, for clipping and checkpoints; and the same tensors split
   * into those that get weight decay (matrices) and those that do not
   * (biases, norms, embeddings), one AdamW for each. */
  nb_params *all, *decay, *no_decay;
  nb_tensor *wte, *wpe, *lnf_w, *lnf_b; /* borrowed from all */
  gpt_block *blocks;
} gpt_model;

/* GPT-2 small (124M parameters with the padded vocabulary): 12 layers, 12
 * heads, width 768, context 1024 and the GPT-2 tokenizer's 50,257 ids. */
#define GPT2_VOCAB 50257
gpt_config gpt_preset_gpt2(void);

/* The model's vocabulary (rows of the token embedding and of the tied
 * output head, columns of the logits) for token ids below vocab: vocab
 * rounded up to a multiple of 64 (GPT-2's 50,257 becomes 50,304), so the
 * head's matrix products run on whole tiles. The padding ids are never
 * inputs or targets; their logits enter the softmax's normalisation and
 * training pushes them down (nanoGPT's padding). */
#define GPT_VOCAB_ALIGN 64
int gpt_padded_vocab(int vocab);

/* Checks a configuration; returns NULL or a message naming the problem. */
const char *gpt_config_check(const gpt_config *cfg);
/* A model with freshly initialised f32 weights on dev (NULL + library error
 * on failure). */
gpt_model *gpt_new(gpt_config cfg, nb_device dev, nb_rng *rng);
void gpt_free(gpt_model *m);
/* idx: i64 (B, T) with T <= context. Returns logits (B, T, vocab). */
nb_tensor *gpt_forward(const gpt_model *m, const nb_tensor *idx);
/* Mean cross-entropy of the next-token predictions against targets (B, T)
 * i64; targets equal to -1 are ignored. */
nb_tensor *gpt_loss(const gpt_model *m, const nb_tensor *idx, const nb_tensor *targets);

#endif
