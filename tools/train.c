/* `nabla train`: trains the GPT of gpt.c on the built-in addition task or
 * on a text file, with AdamW, gradient clipping and a cosine schedule; each
 * step runs inside a scope so its intermediates are freed at the end. */
#define _POSIX_C_SOURCE 200809L /* fileno */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cli.h"
#include "tool.h"
#include "train.h"

#define TRAIN_BETA1 0.9
#define TRAIN_BETA2 0.99
#define TRAIN_EPS 1e-8
#define TRAIN_WEIGHT_DECAY 0.1
#define TRAIN_CLIP 1.0
#define TRAIN_EVAL_SEED 0x5eedULL   /* held-out draws: the same every evaluation */
#define TRAIN_DATA_SEED 0xda7aULL   /* mixed into the seed for training draws */
#define TRAIN_ADD_EVAL_N 500        /* held-out problems per intermediate evaluation */
#define TRAIN_ADD_FINAL_N 2000      /* held-out problems at the end */
#define TRAIN_SAMPLE_LEN 300        /* bytes of sample text */

static int train_fail(const char *what) {
  fprintf(stderr, "nabla train: %s: %s\n", what, *nb_last_error() ? nb_last_error() : "failed");
  return NB_TOOL_EXIT_RUNTIME;
}

/* ---- data ------------------------------------------------------------------ */

/* The largest --data accepted: --max-data, else 1 GiB or half of the
 * machine's memory if that is less (the tokens take one byte per input
 * byte; an endless input such as /dev/zero fails in seconds). */
#define TRAIN_MAX_DATA ((int64_t)1 << 30)
static int64_t text_limit(const train_opts *o) {
  if (o->max_data) return o->max_data;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int64_t half = pages > 0 && page > 0 ? (int64_t)pages / 2 * page : TRAIN_MAX_DATA;
  return half < TRAIN_MAX_DATA ? half : TRAIN_MAX_DATA;
}

static int text_too_large(const train_opts *o, int64_t limit) {
  fprintf(stderr, "nabla train: --data '%s' is larger than %lld bytes (%.1f MiB), the limit %s\n",
          o->data, (long long)limit, limit / 1048576.0,
          o->max_data ? "set by --max-data" : "by default (1 GiB, or half this machine's memory "
          "if less; --max-data SIZE sets another)");
  return NB_TOOL_EXIT_USAGE;
}

/* Reads --data whole, refusing more than the limit: a regular file by its
 * size before reading, anything else (a pipe, a device) as it arrives. */
static int text_read(const train_opts *o, unsigned char **bytes, int64_t *n) {
  const char *path = o->data;
  int64_t limit = text_limit(o);
  struct stat st;
  FILE *f = fopen(path, "rb");
  if (!f || fstat(fileno(f), &st)) {
    fprintf(stderr, "nabla train: cannot open --data '%s': %s\n", path, strerror(errno));
    if (f) fclose(f);
    return NB_TOOL_EXIT_USAGE;
  }
  if (S_ISDIR(st.st_mode) || (S_ISREG(st.st_mode) && st.st_size > limit)) {
    fclose(f);
    if (!S_ISDIR(st.st_mode)) return text_too_large(o, limit);
    fprintf(stderr, "nabla train: --data '%s' is a directory; expected a text file\n", path);
    return NB_TOOL_EXIT_USAGE;
  }
  size_t len = 0, got, cap = S_ISREG(st.st_mode) ? (size_t)st.st_size + 1 : 1 << 16;
  if (cap > (size_t)limit + 1) cap = (size_t)limit + 1;
  unsigned char *buf = malloc(cap);
  while (buf && len <= (size_t)limit && (got = fread(buf + len, 1, cap - len, f)) > 0) {
    if ((len += got) < cap) continue;
    size_t grown = cap / 2 * 3 > (size_t)limit + 1 ? (size_t)limit + 1 : cap / 2 * 3;
    unsigned char *nb = grown > cap ? realloc(buf, grown) : buf;
    if (!nb) free(buf);
    buf = nb, cap = grown;
    if (grown == len) break; /* limit + 1 bytes read: too large */
  }
  int err = ferror(f) ? errno : 0;
  fclose(f);
  if (buf && !err && len > (size_t)limit) return free(buf), text_too_large(o, limit);
  if (!buf || err) {
    fprintf(stderr, "nabla train: cannot read --data '%s': %s\n", path,
            buf ? strerror(err ? err : EIO) : "out of memory");
    free(buf);
    return buf ? NB_TOOL_EXIT_USAGE : NB_TOOL_EXIT_RUNTIME;
  }
  *bytes = buf;
  *n = (int64_t)len;
  return 0;
}

/* Loads --data: vocabulary of the distinct bytes, tokens (the bytes
 * replaced by their ids, in place). */
static int text_load(trainer *tr) {
  text_data *t = &tr->text;
  unsigned char *bytes;
  int rc = text_read(&tr->o, &bytes, &t->n);
  if (rc) return rc;
  int present[256] = {0};
  for (int64_t i = 0; i < t->n; i++) present[bytes[i]] = 1;
  for (int b = 0; b < 256; b++) {
    t->byte_to_id[b] = present[b] ? t->vocab : -1;
    if (present[b]) t->id_to_byte[t->vocab++] = (unsigned char)b;
  }
  for (int64_t i = 0; i < t->n; i++) bytes[i] = (uint8_t)t->byte_to_id[bytes[i]];
  t->tokens = bytes;
  if (t->vocab < 2) {
    fprintf(stderr, "nabla train: --data '%s' has %d distinct bytes; need at least 2\n",
            tr->o.data, t->vocab);
    return NB_TOOL_EXIT_USAGE;
  }
  return 0;
}

/* The split depends on the context, so it runs once the options are final. */
static int text_split(trainer *tr) {
  text_data *t = &tr->text;
  int64_t need = (int64_t)tr->o.context + 1, held = t->n / 10 > need ? t->n / 10 : need;
  if (t->n - held < need) {
    fprintf(stderr,
            "nabla train: --data '%s' has %lld bytes; --context %d needs at least %lld "
            "(one context for training and one held out)\n",
            tr->o.data, (long long)t->n, tr->o.context, (long long)(2 * need));
    return NB_TOOL_EXIT_USAGE;
  }
  t->n_train = t->n - held;
  return 0;
}

static void text_batch(const text_data *t, nb_rng *rng, int B, int T, int held_out, int64_t *x,
                       int64_t *y) {
  int64_t lo = held_out ? t->n_train : 0, hi = held_out ? t->n : t->n_train;
  for (int r = 0; r < B; r++) {
    const uint8_t *s = t->tokens + lo + (int64_t)tool_rand_below(rng, (uint64_t)(hi - lo - T));
    for (int i = 0; i < T; i++) {
      x[(int64_t)r * T + i] = s[i];
      y[(int64_t)r * T + i] = s[i + 1];
    }
  }
}

/* ---- token files ---------------------------------------------------------- */

/* Opens one token file (--tokens or --val-tokens), every id checked against
 * the vocabulary; a bad file is bad input. */
static int tokens_open_one(const trainer *tr, const char *opt, const char *path, nb_tokens **out) {
  *out = nb_tokens_open(path, tr->o.vocab_size);
  if (*out) return 0;
  fprintf(stderr, "nabla train: --%s: %s%s\n", opt, nb_last_error(),
          strstr(nb_last_error(), "vocabulary") ? " (--vocab-size sets it)" : "");
  return nb_last_status() == NB_ERR_OOM ? NB_TOOL_EXIT_RUNTIME : NB_TOOL_EXIT_USAGE;
}

static int tokens_load(trainer *tr) {
  token_data *t = &tr->tok;
  t->vocab = tr->o.vocab_size;
  int rc = tokens_open_one(tr, "tokens", tr->o.tokens, &t->train);
  if (!rc && tr->o.val_tokens) rc = tokens_open_one(tr, "val-tokens", tr->o.val_tokens, &t->val);
  return rc;
}

/* Training and held-out ids; each part needs one context plus its target. */
static int tokens_split(trainer *tr) {
  token_data *t = &tr->tok;
  int64_t need = (int64_t)tr->o.context + 1, n = nb_tokens_count(t->train);
  t->ids = nb_tokens_data(t->train);
  if (t->val) {
    t->n_train = n;
    t->held = nb_tokens_data(t->val);
    t->n_held = nb_tokens_count(t->val);
  } else {
    t->n_held = n / 10 > need ? n / 10 : need;
    t->n_train = n - t->n_held;
    t->held = t->ids + (t->n_train > 0 ? t->n_train : 0);
  }
  const char *opt = t->n_train < need ? "tokens" : t->n_held < need ? "val-tokens" : NULL;
  if (!opt) return 0;
  const char *path = t->n_train < need || !t->val ? tr->o.tokens : tr->o.val_tokens;
  fprintf(stderr, "nabla train: --%s '%s' has %lld tokens; --context %d needs at least %lld%s\n",
          opt, path, (long long)(t->val && opt[0] == 'v' ? t->n_held : nb_tokens_count(t->train)),
          tr->o.context, (long long)(t->val ? need : 2 * need),
          t->val ? "" : " (one context for training and one held out)");
  return NB_TOOL_EXIT_USAGE;
}

static void tokens_batch(const token_data *t, nb_rng *rng, int B, int T, int held_out, int64_t *x,
                         int64_t *y) {
  const uint16_t *base = held_out ? t->held : t->ids;
  int64_t n = held_out ? t->n_held : t->n_train;
  for (int r = 0; r < B; r++) {
    const uint16_t *s = base + (int64_t)tool_rand_below(rng, (uint64_t)(n - T));
    for (int i = 0; i < T; i++) {
      x[(int64_t)r * T + i] = s[i];
      y[(int64_t)r * T + i] = s[i + 1];
    }
  }
}

/* The model's vocabulary: the task's, padded for token files. */
static int train_vocab(const trainer *tr) {
  if (tr->is_tokens) return gpt_padded_vocab(tr->tok.vocab);
  return tr->is_text ? tr->text.vocab : TASK_ADD_VOCAB;
}

/* The sequence length of every batch. */
static int train_seq_len(const trainer *tr) {
  return tr->is_text ? tr->o.context : tr->add.context;
}

static void train_batch(const trainer *tr, nb_rng *rng, int B, int held_out, int64_t *x,
                        int64_t *y) {
  if (tr->is_tokens) tokens_batch(&tr->tok, rng, B, tr->o.context, held_out, x, y);
  else if (tr->is_text) text_batch(&tr->text, rng, B, tr->o.context, held_out, x, y);
  else task_add_batch(&tr->add, rng, B, held_out, x, y);
}

/* ---- steps and evaluation ----------------------------------------------------- */

/* Mean loss of the model on (x, y) of shape (B, T); inside the caller's scope. */
static nb_tensor *train_loss_of(const trainer *tr, int B, const int64_t *x, const int64_t *y) {
  int64_t shape[2] = {B, train_seq_len(tr)};
  nb_tensor *xt = nb_from_buffer(x, 2, shape, NB_I64, tr->device);
  nb_tensor *yt = nb_from_buffer(y, 2, shape, NB_I64, tr->device);
  /* --precision bf16/f16: the forward under autocast; backward runs outside
   * it, each rule in the dtypes its forward used, and the f32 parameters get
   * f32 gradients through the casts */
  int low = tr->o.prec != TRAIN_F32;
  if (low && nb_autocast_begin(tr->o.prec == TRAIN_F16 ? NB_F16 : NB_BF16)) return NULL;
  nb_tensor *loss = gpt_loss(tr->model, xt, yt);
  if (low) nb_autocast_end();
  return loss;
}

/* Forward and backward of the batch in o->accum micro-batches of equal size.
 * Each micro-batch's mean loss is scaled by 1/accum, so the gradients that
 * backward accumulates in the leaves sum to the full batch's mean-loss
 * gradient, while only one micro-batch's activations are alive at a time.
 * With f16 backward starts from the loss times the scaler's scale (on the
 * device), so the gradients carry it until the update takes it out. The
 * batch's (unscaled) loss goes into loss_dev[step] on the device: nothing
 * here waits for it. Returns 1 on success. */
static int train_accumulate(trainer *tr, const int64_t *x, const int64_t *y) {
  const train_opts *o = &tr->o;
  int micro = o->batch / o->accum, ok = 1;
  int64_t stride = (int64_t)micro * train_seq_len(tr);
  int scaled = o->prec == TRAIN_F16; /* bf16, f32: scale 1 */
  nb_tensor *sum = NULL;
  for (int m = 0; ok && m < o->accum; m++) {
    nb_scope_begin();
    nb_tensor *loss = train_loss_of(tr, micro, x + m * stride, y + m * stride);
    if (loss && o->accum > 1) loss = nb_mul_scalar(loss, 1.0 / o->accum);
    nb_tensor *seed = loss && scaled ? nb_scaler_scale(tr->scaler, loss) : loss;
    ok = seed && nb_backward(seed, NULL) == NB_OK;
    if (ok) {
      nb_tensor *l = nb_detach(loss), *s = sum ? nb_add(sum, l) : l;
      ok = s != NULL;
      nb_release(sum);
      sum = nb_keep(s);
    }
    nb_scope_end();
  }
  nb_scope_begin();
  ok = ok && nb_copy_(nb_select(tr->loss_dev, 0, tr->step), sum) == NB_OK;
  nb_scope_end();
  nb_release(sum);
  return ok;
}

/* Brings the losses of the steps done so far to loss[] (one read), and the
 * count of skipped steps; says on stderr how many were skipped since the
 * last time. Returns 0, or -1 on a library error. */
static int train_sync(trainer *tr) {
  int64_t n = tr->step - tr->loss_read;
  if (n > 0) {
    nb_scope_begin();
    nb_tensor *part = nb_contiguous(nb_slice(tr->loss_dev, 0, tr->loss_read, tr->step, 1));
    nb_status st = part ? nb_to_host(part, tr->loss + tr->loss_read, (size_t)n * sizeof(float))
                        : nb_last_status();
    nb_scope_end();
    if (st) return -1;
    tr->loss_read = tr->step;
  }
  int64_t skipped = nb_scaler_skipped(tr->scaler);
  if (skipped < 0) return -1;
  if (skipped > tr->skipped && !tr->o.quiet) {
    const char *clear = tr->tty ? "\r\033[K" : "";
    if (tr->o.prec == TRAIN_F16)
      fprintf(stderr, "%sby step %lld: %lld step%s skipped (gradients not finite), loss scale now %g\n",
              clear, (long long)tr->step, (long long)(skipped - tr->skipped),
              skipped - tr->skipped > 1 ? "s" : "", nb_scaler_get_scale(tr->scaler));
    else
      fprintf(stderr, "%sby step %lld: %lld step%s skipped (gradients not finite, %s, no loss "
              "scaling)\n", clear, (long long)tr->step, (long long)(skipped - tr->skipped),
              skipped - tr->skipped > 1 ? "s" : "", train_precision_name(tr->o.prec));
  }
  tr->skipped = skipped;
  return 0;
}

/* One optimizer step: the clip (at TRAIN_CLIP, global norm), the
 * non-finite check and both optimizers' updates through the scaler, all
 * decided on the device (f16: with loss scaling; bf16, f32: at a fixed
 * scale of 1, the check and the skip only): nothing waits for the host.
 * Returns 0, or -1 on a library error. */
static int train_step(trainer *tr, int64_t *x, int64_t *y) {
  const train_opts *o = &tr->o;
  train_batch(tr, &tr->data_rng, o->batch, 0, x, y);
  double lr = nb_lr_cosine(tr->step, o->warmup, o->steps, o->lr, o->lr / 10);
  nb_optim *opts[2] = {tr->opt_decay, tr->opt_plain};
  nb_scope_begin();
  nb_optim_set_lr(tr->opt_decay, lr);
  nb_optim_set_lr(tr->opt_plain, lr);
  int ok = train_accumulate(tr, x, y) &&
           nb_scaler_step(tr->scaler, tr->model->all, TRAIN_CLIP, 2, opts, NULL) == NB_OK;
  nb_params_zero_grad(tr->model->all);
  nb_scope_end();
  return ok ? 0 : -1;
}

/* Held-out loss over a fixed set of batches (the same at every evaluation). */
static double train_eval_loss(const trainer *tr, int64_t *x, int64_t *y) {
  nb_rng rng = nb_rng_new(tr->o.seed ^ TRAIN_EVAL_SEED);
  int batches = tr->is_text ? 4 : 1;
  double sum = 0;
  nb_no_grad_begin();
  for (int i = 0; i < batches && !isnan(sum); i++) {
    train_batch(tr, &rng, tr->o.batch, 1, x, y);
    nb_scope_begin();
    nb_tensor *loss = train_loss_of(tr, tr->o.batch, x, y);
    sum += loss ? nb_item(loss) : NAN;
    nb_scope_end();
  }
  nb_no_grad_end();
  return sum / batches;
}

static double train_accuracy(const trainer *tr, int n, int show) {
  nb_rng rng = nb_rng_new(tr->o.seed ^ TRAIN_EVAL_SEED ^ 1);
  return task_add_accuracy(&tr->add, tr->model, &rng, n, show);
}

/* Evaluates, records the point for the loss curve and prints it. */
static int train_evaluate(trainer *tr, int64_t *x, int64_t *y, int final) {
  double loss = train_eval_loss(tr, x, y), acc = 0;
  if (isnan(loss)) return train_fail("evaluation");
  if (!tr->is_text && (acc = train_accuracy(tr, final ? TRAIN_ADD_FINAL_N : TRAIN_ADD_EVAL_N,
                                            final ? 5 : 0)) < 0)
    return train_fail("evaluation (greedy decoding)");
  if (tr->n_eval < tr->cap_eval && (!tr->n_eval || tr->eval_step[tr->n_eval - 1] != tr->step)) {
    tr->eval_step[tr->n_eval] = tr->step;
    tr->eval_loss[tr->n_eval++] = (float)loss;
  }
  if (final) {
    printf("held-out loss: %.4f\n", loss);
    if (!tr->is_text)
      printf("held-out accuracy: %.2f%% (%d/%d exact answers, greedy decoding)\n", 100 * acc,
             (int)lround(acc * TRAIN_ADD_FINAL_N), TRAIN_ADD_FINAL_N);
  } else if (!tr->o.quiet) {
    /* on a terminal, the progress line is overwritten, not appended to */
    const char *clear = tr->tty ? "\r\033[K" : "";
    if (tr->is_text)
      fprintf(stderr, "%seval step %lld: held-out loss %.4f\n", clear, (long long)tr->step, loss);
    else fprintf(stderr, "%seval step %lld: held-out loss %.4f, accuracy %.1f%% (%d problems)\n",
                 clear, (long long)tr->step, loss, 100 * acc, TRAIN_ADD_EVAL_N);
  }
  return 0;
}

/* ---- progress ---------------------------------------------------------------- */

/* Peak device memory so far in MiB: the CUDA caching allocator's largest
 * allocated total (tensors, not its cache); -1 on the CPU, whose allocator
 * keeps no such figure. */
static double train_peak_mib(const trainer *tr) {
  nb_memory_stats ms;
  if (tr->device.type != NB_CUDA || nb_cuda_memory_stats(tr->device.index, &ms) != NB_OK) {
    nb_clear_error();
    return -1;
  }
  return ms.peak / 1048576.0;
}

/* Model FLOPs utilisation of tps tokens/s, as a fraction of the device's
 * peak (nb_cuda_device_info: tensor-core rate for bf16/f16, FMA rate for
 * f32); -1 on the CPU or a device not in the table. A token costs 6 N
 * FLOPs forward and backward for the N parameters used in products (all
 * but the position table: the token table is also the output head) plus
 * 6 L C T for causal attention's two products at sequence length T (PaLM's
 * 12 L C T, halved for the causal mask, as llm.c counts). The device's
 * description and the peak used go to *info and *peak_out when given. */
static double train_mfu(const trainer *tr, double tps, nb_cuda_info *info, double *peak_out) {
  nb_cuda_info d;
  if (tr->device.type != NB_CUDA || nb_cuda_device_info(tr->device.index, &d) != NB_OK) {
    nb_clear_error();
    return -1;
  }
  double peak = tr->o.prec != TRAIN_F32 ? d.peak_flops_low : d.peak_flops_f32;
  if (info) *info = d;
  if (peak_out) *peak_out = peak;
  const gpt_config *g = &tr->model->cfg;
  double n = (double)(nb_params_numel(tr->model->all) - nb_numel(tr->model->wpe));
  double per_token = 6 * n + 6.0 * g->layers * g->dim * (double)train_seq_len(tr);
  return peak > 0 ? tps * per_token / peak : -1;
}

typedef struct {
  double t0, last_print;
  int64_t first_step; /* step at the start of this run (after a resume) */
  int tty;
} train_clock;

static void train_fmt_time(double s, char *buf, size_t n) {
  if (s < 60) snprintf(buf, n, "%.0fs", s);
  else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
  else snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

/* The progress line, when one is due: the only place a step's loss is read
 * back (train_sync). Returns 0, or -1 on a library error. */
static int train_progress(trainer *tr, train_clock *c, int64_t last) {
  double now = tool_now(), el = now - c->t0;
  int64_t done = tr->step - c->first_step;
  int end = tr->step == last;
  if (tr->o.quiet) return 0;
  if (c->tty ? (!end && now - c->last_print < 0.1) : (!end && tr->step % tr->o.log_every))
    return 0;
  if (train_sync(tr)) return -1;
  double loss = tr->loss[tr->step - 1];
  c->last_print = now;
  double tps = done * (double)tr->o.batch * train_seq_len(tr) / (el > 0 ? el : 1e-9);
  char eta[32], peak[48] = "", mfu[24] = "";
  train_fmt_time(done ? el / done * (double)(last - tr->step) : 0, eta, sizeof eta);
  double mib = train_peak_mib(tr), u = train_mfu(tr, tps, NULL, NULL);
  if (mib >= 0) snprintf(peak, sizeof peak, "  peak %.0f MiB", mib);
  if (u >= 0) snprintf(mfu, sizeof mfu, "  MFU %.1f%%", 100 * u);
  fprintf(stderr, "%sstep %lld/%lld  loss %.4f  lr %.2e  %.1fk tok/s%s%s  ETA %s%s",
          c->tty ? "\r" : "", (long long)tr->step, (long long)last, loss,
          nb_optim_lr(tr->opt_decay), tps / 1000, mfu, peak, eta,
          c->tty ? (end ? "\033[K\n" : "\033[K") : "\n");
  fflush(stderr);
  return 0;
}

/* ---- set-up ------------------------------------------------------------------ */

static int train_pick_device(trainer *tr) {
  int n = nb_cuda_available();
  if (!tr->o.device) {
    tr->device = n > 0 ? nb_device_cuda(0) : NB_DEVICE_CPU;
    return 0;
  }
  if (nb_device_parse(tr->o.device, &tr->device) != NB_OK) {
    fprintf(stderr, "nabla train: --device '%s': expected cpu, cuda or cuda:N\n", tr->o.device);
    return NB_TOOL_EXIT_USAGE;
  }
  if (tr->device.type == NB_CUDA && tr->device.index >= n) {
    fprintf(stderr, "nabla train: --device '%s': %d CUDA device%s available\n", tr->o.device, n,
            n == 1 ? "" : "s");
    return NB_TOOL_EXIT_USAGE;
  }
  return 0;
}

static int train_check_options(trainer *tr) {
  train_opts *o = &tr->o;
  gpt_config cfg = {train_vocab(tr), o->context, o->layers, o->heads, o->dim};
  const char *bad = gpt_config_check(&cfg);
  if (bad) return fprintf(stderr, "nabla train: %s\n", bad), NB_TOOL_EXIT_USAGE;
  if (!tr->is_text && o->context < tr->add.context) {
    fprintf(stderr, "nabla train: --context %d is too short for %d-digit addition (need %d)\n",
            o->context, o->digits, tr->add.context);
    return NB_TOOL_EXIT_USAGE;
  }
  if (o->accum < 1 || o->batch % o->accum) {
    fprintf(stderr, "nabla train: --accum %d must divide --batch %d (micro-batches of equal size)\n",
            o->accum, o->batch);
    return NB_TOOL_EXIT_USAGE;
  }
  if (tr->step >= o->steps) {
    fprintf(stderr, "nabla train: the checkpoint is at step %lld of --steps %lld; pass a larger "
            "--steps to train further\n", (long long)tr->step, (long long)o->steps);
    return NB_TOOL_EXIT_USAGE;
  }
  if (o->stop_at && (o->stop_at > o->steps || o->stop_at <= tr->step)) {
    fprintf(stderr, "nabla train: --stop-at %lld must be in (%lld, %lld]\n",
            (long long)o->stop_at, (long long)tr->step, (long long)o->steps);
    return NB_TOOL_EXIT_USAGE;
  }
  if (tr->is_tokens) return tokens_split(tr);
  return tr->is_text ? text_split(tr) : 0;
}

static int train_build(trainer *tr) {
  train_opts *o = &tr->o;
  gpt_config cfg = {train_vocab(tr), o->context, o->layers, o->heads, o->dim};
  nb_rng init = nb_rng_new(o->seed);
  tr->model = gpt_new(cfg, tr->device, &init);
  if (!tr->model) return train_fail("creating the model");
  tr->opt_decay = nb_adamw_new(tr->model->decay, o->lr, TRAIN_BETA1, TRAIN_BETA2, TRAIN_EPS,
                               TRAIN_WEIGHT_DECAY);
  tr->opt_plain = nb_adamw_new(tr->model->no_decay, o->lr, TRAIN_BETA1, TRAIN_BETA2, TRAIN_EPS, 0.0);
  if (!tr->opt_decay || !tr->opt_plain) return train_fail("creating the optimizer");
  /* f16: GradScaler's defaults; bf16 and f32: a fixed scale of 1 (their
   * range needs no scaling), so that the clip and the non-finite check
   * (a step whose gradients are not finite is skipped) run on the device */
  if (o->prec == TRAIN_F16) tr->scaler = nb_scaler_new(NB_SCALER_DEFAULTS);
  else tr->scaler = nb_scaler_new(1.0, 1.0, 1.0, 1);
  if (!tr->scaler) return train_fail("creating the loss scaler");
  nb_scope_begin(); /* nb_keep takes the one reference the trainer holds */
  tr->loss_dev = nb_keep(nb_zeros(1, (int64_t[]){o->steps}, NB_F32, tr->device));
  nb_scope_end();
  if (!tr->loss_dev) return train_fail("allocating the loss history");
  tr->loss = calloc((size_t)o->steps, sizeof *tr->loss);
  tr->cap_eval = 1024 + (o->eval_every ? (int)(o->steps / o->eval_every) + 2 : 2);
  tr->eval_step = calloc((size_t)tr->cap_eval, sizeof *tr->eval_step);
  tr->eval_loss = calloc((size_t)tr->cap_eval, sizeof *tr->eval_loss);
  if (!tr->loss || !tr->eval_step || !tr->eval_loss)
    return fprintf(stderr, "nabla train: out of memory\n"), NB_TOOL_EXIT_RUNTIME;
  return 0;
}

/* Threads for a CPU run. Below about a million parameters every op is
 * small, and fork/join costs of the kernels' parallel regions outweigh
 * their work (measured: 1 thread ran the default run 1.7x faster than 2 on
 * an idle 2-core machine, 7x under load), so small models use one thread
 * unless OMP_NUM_THREADS says otherwise. Returns the count in use. */
static int train_pick_threads(const trainer *tr) {
#ifdef _OPENMP
  const char *env = getenv("OMP_NUM_THREADS");
  if (tr->device.type == NB_CPU && (!env || !*env) && nb_params_numel(tr->model->all) < 1000000)
    omp_set_num_threads(1);
  return omp_get_max_threads();
#else
  (void)tr;
  return 1;
#endif
}

/* Every output file is checked before the data is read and the first step
 * runs: a bad path is bad input (exit 2), found before the work, not after. */
static int train_check_outputs(const trainer *tr) {
  const train_opts *o = &tr->o;
  int rc = 0;
  if (o->save_every && !o->save) {
    fprintf(stderr, "nabla train: --save-every needs --save FILE (where the checkpoints go)\n");
    return NB_TOOL_EXIT_USAGE;
  }
  if (o->save && (rc = cli_check_output("nabla train", "--save", o->save))) return rc;
  if (o->save && o->data && !cli_utf8_valid(o->data)) {
    fprintf(stderr, "nabla train: --data '%s': the path is not valid UTF-8, and a checkpoint "
            "(--save) records it in its metadata, which must be; rename the file\n", o->data);
    return NB_TOOL_EXIT_USAGE;
  }
  const char *paths[2] = {o->tokens, o->val_tokens}, *names[2] = {"--tokens", "--val-tokens"};
  for (int i = 0; i < 2; i++)
    if (o->save && paths[i] && !cli_utf8_valid(paths[i])) {
      fprintf(stderr, "nabla train: %s '%s': the path is not valid UTF-8, and a checkpoint "
              "(--save) records it in its metadata, which must be; rename the file\n", names[i],
              paths[i]);
      return NB_TOOL_EXIT_USAGE;
    }
  if (o->no_svg) return 0;
  /* the default curve goes under the run directory, made here */
  if (!(o->set & OPT_SVG) && mkdir(TRAIN_DEFAULT_DIR, 0777) && errno != EEXIST) {
    fprintf(stderr, "nabla train: cannot create the directory '%s' for %s: %s (--svg FILE or "
            "--no-svg)\n", TRAIN_DEFAULT_DIR, o->svg, strerror(errno));
    return NB_TOOL_EXIT_USAGE;
  }
  return cli_check_output("nabla train", "--svg", o->svg);
}

/* Which task the options ask for, and the options that need another task. */
static int train_check_task(trainer *tr) {
  const train_opts *o = &tr->o;
  const char *need = !o->tokens && o->val_tokens ? "--val-tokens"
                     : !o->tokens && (o->set & OPT_VOCAB) ? "--vocab-size"
                     : !o->tokens && o->model ? "--model" : NULL;
  if (need) {
    fprintf(stderr, "nabla train: %s needs --tokens FILE (a token file to train on)\n", need);
    return NB_TOOL_EXIT_USAGE;
  }
  if (o->tokens && o->data) {
    fprintf(stderr, "nabla train: --data and --tokens both given; pass one (characters or "
            "tokens)\n");
    return NB_TOOL_EXIT_USAGE;
  }
  tr->is_tokens = o->tokens != NULL;
  tr->is_text = o->data != NULL || tr->is_tokens;
  return 0;
}

static int train_setup(trainer *tr) {
  int rc = train_pick_device(tr);
  if (!rc && tr->o.resume) rc = train_ckpt_open(tr);
  if (!rc) rc = train_check_outputs(tr);
  if (rc) return rc;
  tr->tty = isatty(fileno(stderr));
  if ((rc = train_check_task(tr))) return rc;
  if (tr->o.data && (rc = text_load(tr))) return rc;
  if (tr->o.data && tr->resume && (rc = train_ckpt_check_vocab(tr))) return rc;
  task_add_init(&tr->add, tr->o.digits);
  train_resolve_defaults(&tr->o, tr->is_text, tr->device.type == NB_CUDA);
  if (tr->is_tokens && (rc = tokens_load(tr))) return rc;
  if (!tr->resume) tr->data_rng = nb_rng_new(tr->o.seed ^ TRAIN_DATA_SEED);
  if ((rc = train_check_options(tr)) || (rc = train_build(tr))) return rc;
  return tr->resume ? train_ckpt_restore(tr) : 0;
}

/* ---- the run ----------------------------------------------------------------- */

static void train_describe(const trainer *tr) {
  const train_opts *o = &tr->o;
  char dev[48];
  snprintf(dev, sizeof dev, tr->device.type == NB_CUDA ? "cuda:%d" : "cpu", tr->device.index);
  int threads = train_pick_threads(tr);
  if (tr->device.type == NB_CPU)
    snprintf(dev, sizeof dev, "cpu (%d thread%s)", threads, threads > 1 ? "s" : "");
  char vocab[48];
  snprintf(vocab, sizeof vocab, "%d", tr->model->cfg.vocab);
  if (tr->is_tokens) {
    printf("task: tokens, %s (%lld tokens, ids below %d); held out: ", o->tokens,
           (long long)nb_tokens_count(tr->tok.train), tr->tok.vocab);
    if (tr->tok.val) printf("%s (%lld tokens)\n", o->val_tokens, (long long)tr->tok.n_held);
    else printf("its last %lld tokens\n", (long long)tr->tok.n_held);
    snprintf(vocab, sizeof vocab, "%d (padded to %d)", tr->tok.vocab, tr->model->cfg.vocab);
  } else if (tr->is_text)
    printf("task: character-level text, %s (%lld bytes, %d distinct)\n", o->data,
           (long long)tr->text.n, tr->text.vocab);
  else
    printf("task: %d-digit addition, answer written least significant digit first\n", o->digits);
  printf("model: %s%d layers, %d heads, dim %d, context %d, vocab %s: %lld parameters on %s\n",
         o->model ? "GPT-2 small preset, " : "", o->layers, o->heads, o->dim, o->context, vocab,
         (long long)nb_params_numel(tr->model->all), dev);
  char accum[64] = "";
  if (o->accum > 1) snprintf(accum, sizeof accum, " in %d micro-batches", o->accum);
  printf("training: %lld steps of %d x %d tokens%s, AdamW lr %g (warm-up %lld, cosine), %s%s\n",
         (long long)o->steps, o->batch, train_seq_len(tr), accum, o->lr, (long long)o->warmup,
         o->prec == TRAIN_F16    ? "f16 autocast with loss scaling, f32 weights"
         : o->prec == TRAIN_BF16 ? "bf16 autocast, f32 weights"
                                 : "f32",
         tr->step ? ", resumed" : "");
  if (tr->step) printf("resumed at step %lld from %s\n", (long long)tr->step, o->resume);
  fflush(stdout);
}

/* Ends the profile of --profile and prints its table (steps: run this time). */
static int train_profile_report(int64_t steps) {
  if (!nb_profile_running()) {
    printf("profile: nothing profiled (the first step is left out; this run had %lld)\n",
           (long long)steps);
    return 0;
  }
  if (nb_profile_stop() || nb_profile_report(stdout)) return train_fail("the profile");
  printf("(kernels of %lld steps after the first; held-out evaluations not included)\n",
         (long long)(steps - 1));
  return 0;
}

/* A held-out evaluation between steps; a running profile pauses for it,
 * so that the profile is of training steps only. */
static int train_evaluate_unprofiled(trainer *tr, int64_t *x, int64_t *y) {
  int paused = nb_profile_running() && nb_profile_pause(1) == NB_OK;
  int rc = train_evaluate(tr, x, y, 0);
  if (paused && nb_profile_pause(0)) return train_fail("resuming the profiler");
  return rc;
}

/* --save-every: the checkpoint so far, replacing the last one atomically
 * (the final one is written by train_report). */
static int train_save_periodic(trainer *tr) {
  int paused = nb_profile_running() && nb_profile_pause(1) == NB_OK;
  int rc = train_sync(tr) ? train_fail("reading the loss") : train_ckpt_save(tr, tr->o.save);
  if (!rc && !tr->o.quiet)
    fprintf(stderr, "%scheckpoint: %s (step %lld)\n", tr->tty ? "\r\033[K" : "", tr->o.save,
            (long long)tr->step);
  if (paused && nb_profile_pause(0)) return train_fail("resuming the profiler");
  return rc;
}

static int train_loop(trainer *tr, int64_t *x, int64_t *y, double *seconds) {
  int64_t last = tr->o.stop_at ? tr->o.stop_at : tr->o.steps;
  train_clock c = {tool_now(), 0, tr->step, tr->tty};
  tr->loss_read = tr->step; /* before it: from the checkpoint */
  while (tr->step < last) {
    /* the first step allocates and warms up: profile the ones after it */
    if (tr->o.profile && tr->step == c.first_step + 1 && nb_profile_start())
      return train_fail("starting the profiler");
    if (train_step(tr, x, y)) return train_fail("training step");
    tr->step++;
    if (train_progress(tr, &c, last)) return train_fail("reading the loss");
    if (tr->o.eval_every && tr->step % tr->o.eval_every == 0 && tr->step < last &&
        train_evaluate_unprofiled(tr, x, y))
      return NB_TOOL_EXIT_RUNTIME;
    if (tr->o.save_every && tr->step % tr->o.save_every == 0 && tr->step < last &&
        train_save_periodic(tr))
      return NB_TOOL_EXIT_RUNTIME;
  }
  if (train_sync(tr)) return train_fail("reading the loss"); /* before the clock stops */
  *seconds = tool_now() - c.t0;
  return tr->o.profile ? train_profile_report(tr->step - c.first_step) : 0;
}

/* Mean of the recorded loss over steps [a, b). */
static double train_mean_loss(const trainer *tr, int64_t a, int64_t b) {
  double s = 0;
  for (int64_t i = a; i < b; i++) s += tr->loss[i];
  return b > a ? s / (double)(b - a) : NAN;
}

/* Samples text from the model, starting from the start of the held-out part. */
static int train_sample(const trainer *tr) {
  const text_data *t = &tr->text;
  int V = t->vocab, T = tr->o.context, prompt = T / 2 < 32 ? (T / 2 ? T / 2 : 1) : 32;
  int64_t total = prompt + TRAIN_SAMPLE_LEN, *seq = malloc(sizeof *seq * (size_t)total);
  float *logits = malloc(sizeof *logits * (size_t)V);
  nb_rng rng = nb_rng_new(tr->o.seed ^ TRAIN_EVAL_SEED ^ 2);
  int rc = !seq || !logits;
  for (int i = 0; !rc && i < prompt; i++) seq[i] = t->tokens[t->n_train + i];
  nb_no_grad_begin();
  for (int64_t len = prompt; len < total && !rc; len++) {
    int64_t ctx = len < T ? len : T;
    nb_scope_begin();
    nb_tensor *idx = nb_from_buffer(seq + len - ctx, 2, (int64_t[]){1, ctx}, NB_I64, tr->device);
    nb_tensor *last = nb_select(nb_select(gpt_forward(tr->model, idx), 0, 0), 0, ctx - 1);
    rc = !last || nb_to_host(nb_cast(last, NB_F32), logits, sizeof *logits * (size_t)V) != NB_OK;
    nb_scope_end();
    if (rc) break;
    /* Temperature 0.8: p_i ~ exp((l_i - max) / 0.8). */
    double mx = -INFINITY, sum = 0, u;
    for (int i = 0; i < V; i++) mx = fmax(mx, logits[i]);
    for (int i = 0; i < V; i++) sum += exp((logits[i] - mx) / 0.8);
    u = tool_rand_unit(&rng) * sum;
    int pick = V - 1;
    for (int i = 0; i < V; i++)
      if ((u -= exp((logits[i] - mx) / 0.8)) < 0) { pick = i; break; }
    seq[len] = pick;
  }
  nb_no_grad_end();
  if (!rc) {
    printf("sample (temperature 0.8, after a %d-byte prompt from the held-out text):\n", prompt);
    for (int64_t i = 0; i < total; i++) putchar(t->id_to_byte[seq[i]]);
    printf("\n");
  }
  free(seq);
  free(logits);
  return rc ? train_fail("sampling") : 0;
}

static int train_report(trainer *tr, int64_t *x, int64_t *y, double seconds, int64_t first) {
  int64_t n = tr->step - first, k = n < 10 ? n : 10;
  printf("loss %.4f -> %.4f (mean of the first and last %lld steps of this run)\n",
         train_mean_loss(tr, first, first + k), train_mean_loss(tr, tr->step - k, tr->step),
         (long long)k);
  double tps = n * (double)tr->o.batch * train_seq_len(tr) / (seconds > 0 ? seconds : 1e-9);
  printf("throughput: %.0f tokens/s (%lld steps in %.1f s)\n", tps, (long long)n, seconds);
  nb_cuda_info d;
  double peak = 0, u = train_mfu(tr, tps, &d, &peak);
  if (u >= 0)
    printf("model FLOPs utilisation: %.1f%% of %.0f TFLOP/s (%s peak of %s: %d SMs at %d MHz)\n",
           100 * u, peak / 1e12,
           tr->o.prec != TRAIN_F32 ? "bf16/f16 tensor-core" : "f32 FMA", d.name, d.n_sm,
           d.clock_mhz);
  if (tr->skipped || tr->o.prec == TRAIN_F16) {
    printf("skipped steps: %lld of %lld (gradients not finite)", (long long)tr->skipped, (long long)n);
    if (tr->o.prec == TRAIN_F16) printf("; loss scale now %g", nb_scaler_get_scale(tr->scaler));
    printf("\n");
  }
  double mib = train_peak_mib(tr);
  if (mib >= 0)
    printf("peak device memory: %.1f MiB (cuda:%d, allocated tensors at their peak)\n", mib,
           tr->device.index);
  fflush(stdout);
  int rc = train_evaluate(tr, x, y, 1);
  if (!rc && tr->is_text && !tr->is_tokens) rc = train_sample(tr);
  /* the outputs, each written even if something before it failed */
  int rc_save = tr->o.save ? train_ckpt_save(tr, tr->o.save) : 0;
  if (tr->o.save && !rc_save)
    printf("checkpoint: %s (step %lld)\n", tr->o.save, (long long)tr->step);
  int rc_svg = 0;
  if (!tr->o.no_svg) {
    char title[128];
    snprintf(title, sizeof title, "nabla train: %s, %d layers, dim %d",
             tr->is_tokens ? "tokens" : tr->is_text ? "text" : "addition", tr->o.layers, tr->o.dim);
    if (tool_svg_loss(tr->o.svg, title, tr->loss, tr->step, tr->eval_step, tr->eval_loss,
                      tr->n_eval)) {
      fprintf(stderr, "nabla train: cannot write --svg '%s': %s\n", tr->o.svg, strerror(errno));
      rc_svg = NB_TOOL_EXIT_RUNTIME;
    } else printf("loss curve: %s\n", tr->o.svg);
  }
  return rc ? rc : rc_save ? rc_save : rc_svg;
}

static int train_run(trainer *tr) {
  int T = train_seq_len(tr);
  int B = tr->o.batch;
  int64_t *x = malloc(sizeof *x * (size_t)B * T), *y = malloc(sizeof *y * (size_t)B * T);
  int64_t first = tr->step;
  double seconds = 0;
  int rc = !x || !y ? (fprintf(stderr, "nabla train: out of memory\n"), NB_TOOL_EXIT_RUNTIME) : 0;
  if (!rc) train_describe(tr);
  if (!rc) rc = train_loop(tr, x, y, &seconds);
  if (!rc) rc = train_report(tr, x, y, seconds, first);
  free(x);
  free(y);
  return rc;
}

static void train_cleanup(trainer *tr) {
  nb_optim_free(tr->opt_decay);
  nb_optim_free(tr->opt_plain);
  nb_scaler_free(tr->scaler);
  nb_release(tr->loss_dev);
  gpt_free(tr->model);
  if (tr->resume) nb_st_close(tr->resume);
  free(tr->data_path);
  free(tr->tokens_path);
  free(tr->val_path);
  nb_tokens_close(tr->tok.train);
  nb_tokens_close(tr->tok.val);
  free(tr->text.tokens);
  free(tr->loss);
  free(tr->eval_step);
  free(tr->eval_loss);
}

int nb_tool_train(int argc, char **argv) {
  trainer tr;
  memset(&tr, 0, sizeof tr);
  int rc = train_parse(argc, argv, &tr.o);
  if (rc) return rc;
  if (tr.o.help) {
    train_usage(stdout);
    return 0;
  }
  rc = train_setup(&tr);
  if (!rc) rc = train_run(&tr);
  train_cleanup(&tr);
  return rc;
}
