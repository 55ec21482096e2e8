/* `nabla train`: options, the trainer's state, and the pieces split across
 * train.c (the loop), train_opts.c (command line) and train_ckpt.c
 * (safetensors checkpoints). */
#ifndef NB_TOOL_TRAIN_H
#define NB_TOOL_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "gpt.h"
#include "task.h"

/* Bits of train_opts.set: which options the command line gave explicitly. */
enum {
  OPT_LAYERS = 1 << 0, OPT_HEADS = 1 << 1, OPT_DIM = 1 << 2, OPT_CONTEXT = 1 << 3,
  OPT_BATCH = 1 << 4, OPT_STEPS = 1 << 5, OPT_LR = 1 << 6, OPT_WARMUP = 1 << 7,
  OPT_DIGITS = 1 << 8, OPT_SEED = 1 << 9, OPT_LOG_EVERY = 1 << 10, OPT_EVAL_EVERY = 1 << 11,
  OPT_ACCUM = 1 << 12, OPT_SVG = 1 << 13, OPT_VOCAB = 1 << 14
};

/* The loss curve unless --svg says otherwise: under a run directory that
 * nabla train creates (and .gitignore ignores), not beside the sources. */
#define TRAIN_DEFAULT_DIR "runs"
#define TRAIN_DEFAULT_SVG TRAIN_DEFAULT_DIR "/loss.svg"

/* --precision, parsed once (train_resolve_defaults): f32; bf16 or f16 run
 * the forward under autocast in that dtype (f32 master weights), and f16
 * alone scales the loss. */
typedef enum { TRAIN_F32, TRAIN_BF16, TRAIN_F16 } train_precision;

typedef struct {
  const char *data, *save, *resume, *svg, *device;
  const char *tokens, *val_tokens; /* token files (llm.c's format) */
  const char *model;               /* a preset of model defaults ("gpt2"), or NULL */
  const char *precision;           /* --precision's text ("f32", "bf16", "f16"); NULL: not given */
  train_precision prec;            /* the precision, after defaults and the checkpoint's */
  int vocab_size;                  /* token ids are below it (--tokens) */
  int64_t max_data;   /* largest --data in bytes; 0: the default (train.c) */
  int64_t save_every; /* checkpoint to --save every N steps; 0: only at the end */
  int digits, layers, heads, dim, context, batch;
  int accum; /* micro-batches per step (gradient accumulation); divides batch */
  int64_t steps, stop_at, warmup, eval_every, log_every;
  double lr;
  uint64_t seed;
  int quiet, no_svg, help, profile;
  unsigned set;
} train_opts;

/* Character-level text: the file's distinct bytes are the vocabulary; the
 * last tenth (at least one context) is held out. A vocabulary of bytes has
 * at most 256 ids, so a token is one byte (the file's own size in memory). */
typedef struct {
  uint8_t *tokens;
  int64_t n, n_train;
  int vocab;
  unsigned char id_to_byte[256];
  int byte_to_id[256];
} text_data;

/* Token files (--tokens, --val-tokens): ids below vocab, which the model
 * pads (gpt_padded_vocab). Without --val-tokens the last tenth of --tokens
 * (at least one context) is held out. */
typedef struct {
  nb_tokens *train, *val; /* owned; val NULL without --val-tokens */
  const uint16_t *ids, *held; /* training ids [0, n_train), held-out ids [0, n_held) */
  int64_t n_train, n_held;
  int vocab;
} token_data;

typedef struct {
  train_opts o;
  nb_device device;
  int is_text;   /* a language model of --data or --tokens (context-length sequences) */
  int is_tokens; /* --tokens: token files instead of characters */
  token_data tok;
  task_add add;
  text_data text;
  gpt_model *model;
  nb_optim *opt_decay, *opt_plain; /* AdamW with and without weight decay */
  nb_scaler *scaler;               /* the clip and the non-finite check on the device (f16: loss scaling) */
  int64_t skipped;                 /* steps skipped this run (gradients not finite), as last read */
  nb_tensor *loss_dev;             /* per-step loss on the device (o.steps), read when printed */
  int64_t loss_read;               /* steps whose loss is in loss[] */
  nb_rng data_rng;                 /* draws training batches; checkpointed */
  int64_t step;                    /* optimizer steps done */
  float *loss;                     /* per-step training loss, o.steps entries */
  int64_t *eval_step;
  float *eval_loss;
  int n_eval, cap_eval;
  nb_st_file *resume; /* the checkpoint being resumed, until restored */
  char *data_path;    /* o.data when it came from the checkpoint (owned) */
  char *tokens_path, *val_path; /* o.tokens, o.val_tokens from the checkpoint (owned) */
  int tty;            /* stderr is a terminal: progress on one \r-line */
} trainer;

/* Parses argv into o (defaults for what is not given are filled in later by
 * train_resolve_defaults). Returns 0, or 2 after printing a message. */
int train_parse(int argc, char **argv, train_opts *o);
void train_usage(FILE *f);
/* Checks the text s as a value of the option --name (its type and range)
 * and stores it in dst (of the option's type); what names the source in
 * the message. Returns 0, or 2 after printing a message. */
int train_opt_value(const char *name, const char *what, const char *s, void *dst);
/* Fills unset model and schedule options with defaults for the task and
 * device, and sets o->prec from o->precision (or the device's default). */
void train_resolve_defaults(train_opts *o, int is_text, int on_gpu);
/* The precision's name ("f32", "bf16", "f16"; static), and the precision
 * of a name that the option's choices accept. */
const char *train_precision_name(train_precision p);
train_precision train_precision_of(const char *name);

/* Checkpoints: parameters, both optimizers' state, the loss history, and in
 * __metadata__ the configuration, step and data RNG state. */
int train_ckpt_save(const trainer *tr, const char *path);
/* Opens tr->o.resume and reads its configuration into tr->o (model options
 * given on the command line must agree with it; schedule options given
 * override it), its step and data RNG state. Keeps the file in tr->resume.
 * Returns 0, or 2 after printing a message. */
int train_ckpt_open(trainer *tr);
/* Checks a text task's vocabulary against the checkpoint's. */
int train_ckpt_check_vocab(const trainer *tr);
/* Copies the checkpoint's tensors into the model and optimizers (created
 * from the configuration read above) and closes it. Returns 0, or 2 after a
 * message. */
int train_ckpt_restore(trainer *tr);

#endif
