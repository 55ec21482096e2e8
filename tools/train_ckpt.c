/* Checkpoints of `nabla train` as safetensors: every parameter under its
 * own name, the AdamW moments as "opt.decay.*" and "opt.plain.*", the loss
 * history as "trainer.*", and in __metadata__ the model configuration, the
 * schedule, the step and the data RNG state, the precision, the optimizers'
 * step count (below the trainer's after skipped steps) and for f16 the loss
 * scaler's scale and growth counter. Restoring all of it makes a resumed
 * run continue bit for bit. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool.h"
#include "train.h"

#define CKPT_FORMAT "nabla-gpt-1"
#define CKPT_MAX_META 32

typedef struct {
  const char *keys[CKPT_MAX_META];
  const char *vals[CKPT_MAX_META];
  char buf[CKPT_MAX_META][80];
  int n;
} ckpt_meta;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void meta_put(ckpt_meta *m, const char *key, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->buf[m->n], sizeof m->buf[m->n], fmt, ap);
  va_end(ap);
  m->keys[m->n] = key;
  m->vals[m->n] = m->buf[m->n];
  m->n++;
}

static void ckpt_fill_meta(const trainer *tr, ckpt_meta *m, char *vocab_hex) {
  const train_opts *o = &tr->o;
  m->n = 0;
  meta_put(m, "format", "%s", CKPT_FORMAT);
  meta_put(m, "task", "%s", tr->is_tokens ? "tokens" : tr->is_text ? "text" : "addition");
  meta_put(m, "digits", "%d", o->digits);
  meta_put(m, "vocab", "%d", tr->model->cfg.vocab);
  meta_put(m, "context", "%d", o->context);
  meta_put(m, "layers", "%d", o->layers);
  meta_put(m, "heads", "%d", o->heads);
  meta_put(m, "dim", "%d", o->dim);
  meta_put(m, "batch", "%d", o->batch);
  meta_put(m, "accum", "%d", o->accum);
  meta_put(m, "steps", "%lld", (long long)o->steps);
  meta_put(m, "warmup", "%lld", (long long)o->warmup);
  meta_put(m, "lr", "%.17g", o->lr);
  meta_put(m, "seed", "%llu", (unsigned long long)o->seed);
  meta_put(m, "step", "%lld", (long long)tr->step);
  meta_put(m, "data_rng_seed", "%llu", (unsigned long long)tr->data_rng.seed);
  meta_put(m, "data_rng_offset", "%llu", (unsigned long long)tr->data_rng.offset);
  meta_put(m, "precision", "%s", train_precision_name(o->prec));
  meta_put(m, "optim_steps", "%lld", (long long)nb_optim_steps(tr->opt_decay));
  if (o->prec == TRAIN_F16) {
    meta_put(m, "scaler_scale", "%.17g", nb_scaler_get_scale(tr->scaler));
    meta_put(m, "scaler_growth", "%lld", (long long)nb_scaler_growth_tracker(tr->scaler));
  }
  if (tr->is_tokens) {
    meta_put(m, "vocab_size", "%d", tr->tok.vocab);
    m->keys[m->n] = "tokens";
    m->vals[m->n++] = o->tokens;
    if (o->val_tokens) m->keys[m->n] = "val_tokens", m->vals[m->n++] = o->val_tokens;
  } else if (tr->is_text) {
    for (int i = 0; i < tr->text.vocab; i++) sprintf(vocab_hex + 2 * i, "%02x", tr->text.id_to_byte[i]);
    m->keys[m->n] = "vocab_bytes";
    m->vals[m->n++] = vocab_hex;
    m->keys[m->n] = "data";
    m->vals[m->n++] = o->data;
  }
}

/* Appends the optimizer's state tensors as prefix + state name. */
static int ckpt_add_optim(const nb_optim *opt, const char *prefix, int n, char **names,
                          nb_tensor **ts) {
  for (int i = 0; i < nb_optim_state_count(opt); i++) {
    const char *sn = NULL;
    ts[n] = nb_optim_state_get(opt, i, &sn);
    size_t len = strlen(prefix) + strlen(sn ? sn : "?") + 1;
    names[n] = malloc(len);
    if (names[n]) snprintf(names[n], len, "%s%s", prefix, sn ? sn : "?");
    n++;
  }
  return n;
}

static int ckpt_add_history(const trainer *tr, int n, char **names, nb_tensor **ts) {
  if (tr->step > 0) {
    names[n] = strdup("trainer.loss");
    ts[n++] = nb_from_buffer(tr->loss, 1, (int64_t[]){tr->step}, NB_F32, NB_DEVICE_CPU);
  }
  if (tr->n_eval > 0) {
    names[n] = strdup("trainer.eval_step");
    ts[n++] = nb_from_buffer(tr->eval_step, 1, (int64_t[]){tr->n_eval}, NB_I64, NB_DEVICE_CPU);
    names[n] = strdup("trainer.eval_loss");
    ts[n++] = nb_from_buffer(tr->eval_loss, 1, (int64_t[]){tr->n_eval}, NB_F32, NB_DEVICE_CPU);
  }
  return n;
}

int train_ckpt_save(const trainer *tr, const char *path) {
  const nb_params *all = tr->model->all;
  int cap = nb_params_count(all) + nb_optim_state_count(tr->opt_decay) +
            nb_optim_state_count(tr->opt_plain) + 3;
  char **names = calloc((size_t)cap, sizeof *names);
  nb_tensor **ts = calloc((size_t)cap, sizeof *ts);
  char *vocab_hex = malloc(2 * 256 + 1);
  ckpt_meta meta;
  int n = 0, rc = NB_TOOL_EXIT_RUNTIME;
  nb_scope_begin();
  if (names && ts && vocab_hex) {
    for (; n < nb_params_count(all); n++) {
      names[n] = strdup(nb_params_name(all, n));
      ts[n] = nb_params_get(all, n);
    }
    n = ckpt_add_optim(tr->opt_decay, "opt.decay.", n, names, ts);
    n = ckpt_add_optim(tr->opt_plain, "opt.plain.", n, names, ts);
    n = ckpt_add_history(tr, n, names, ts);
    ckpt_fill_meta(tr, &meta, vocab_hex);
    int ok = 1;
    for (int i = 0; i < n; i++) ok = ok && names[i] && ts[i];
    if (ok && nb_safetensors_save(path, n, (const char *const *)names, ts, meta.n, meta.keys,
                                  meta.vals) == NB_OK)
      rc = 0;
  }
  if (rc) fprintf(stderr, "nabla train: cannot save checkpoint '%s': %s\n", path,
                  *nb_last_error() ? nb_last_error() : strerror(ENOMEM));
  nb_scope_end();
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
  free(ts);
  free(vocab_hex);
  return rc;
}

/* ---- resume --------------------------------------------------------------- */

static int ckpt_fail(const trainer *tr, const char *what, const char *detail) {
  fprintf(stderr, "nabla train: --resume %s: %s%s\n", tr->o.resume, what, detail);
  return NB_TOOL_EXIT_USAGE;
}

/* The metadata entry key, or NULL after a message. */
static const char *ckpt_entry(const trainer *tr, const char *key) {
  const char *s = nb_st_metadata(tr->resume, key);
  if (!s) ckpt_fail(tr, "missing metadata entry ", key);
  return s;
}

/* The entry key checked as a value of the option of that name (the same
 * type and range as on the command line) into dst. */
static int ckpt_meta_opt(const trainer *tr, const char *key, void *dst) {
  const char *s = ckpt_entry(tr, key);
  char what[512];
  if (!s) return NB_TOOL_EXIT_USAGE;
  snprintf(what, sizeof what, "--resume %s: metadata \"%s\"", tr->o.resume, key);
  return train_opt_value(key, what, s, dst) ? NB_TOOL_EXIT_USAGE : 0;
}

static int ckpt_meta_u64(const trainer *tr, const char *key, uint64_t *out) {
  const char *s = ckpt_entry(tr, key);
  char *end;
  if (!s) return NB_TOOL_EXIT_USAGE;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (!*s || *end || errno || *s == '-') return ckpt_fail(tr, "bad number in metadata entry ", key);
  *out = v;
  return 0;
}

/* A model option: the checkpoint's value, which an explicit option must match. */
static int ckpt_model_int(trainer *tr, const char *key, unsigned bit, int *field) {
  int v;
  if (ckpt_meta_opt(tr, key, &v)) return NB_TOOL_EXIT_USAGE;
  if ((tr->o.set & bit) && *field != v) {
    fprintf(stderr, "nabla train: --%s %d disagrees with the checkpoint '%s' (%s %d)\n", key,
            *field, tr->o.resume, key, v);
    return NB_TOOL_EXIT_USAGE;
  }
  *field = v;
  tr->o.set |= bit;
  return 0;
}

/* A schedule option: the checkpoint's value unless given explicitly. The
 * entry is checked either way (a damaged checkpoint is refused). */
static int ckpt_sched(trainer *tr, const char *key, unsigned bit, void *field, size_t size) {
  int64_t v[2]; /* room for the widest option value */
  if (ckpt_meta_opt(tr, key, v)) return NB_TOOL_EXIT_USAGE;
  if (!(tr->o.set & bit)) memcpy(field, v, size), tr->o.set |= bit;
  return 0;
}

/* A path recorded in the metadata, copied (the metadata is freed once the
 * checkpoint is restored; the path is used to the end). */
static int ckpt_path(trainer *tr, const char *key, int required, char **own, const char **dst) {
  const char *s = nb_st_metadata(tr->resume, key);
  if (!s || !*s) return required ? ckpt_fail(tr, "missing metadata entry ", key) : 0;
  if (!(*own = strdup(s))) return fprintf(stderr, "nabla train: out of memory\n"), NB_TOOL_EXIT_RUNTIME;
  *dst = *own;
  return 0;
}

/* A token checkpoint: its files unless --tokens is given, and its
 * vocabulary, which --vocab-size must match. */
static int ckpt_read_tokens(trainer *tr) {
  train_opts *o = &tr->o;
  int v, rc;
  if (o->data) return ckpt_fail(tr, "the checkpoint is of token files, but --data was given", "");
  if (!o->tokens && ((rc = ckpt_path(tr, "tokens", 1, &tr->tokens_path, &o->tokens)) ||
                     (rc = ckpt_path(tr, "val_tokens", 0, &tr->val_path, &o->val_tokens))))
    return rc;
  const char *s = ckpt_entry(tr, "vocab_size");
  char what[512];
  snprintf(what, sizeof what, "--resume %s: metadata \"vocab_size\"", o->resume);
  if (!s || train_opt_value("vocab-size", what, s, &v)) return NB_TOOL_EXIT_USAGE;
  if ((o->set & OPT_VOCAB) && o->vocab_size != v) {
    fprintf(stderr, "nabla train: --vocab-size %d disagrees with the checkpoint '%s' "
            "(vocab_size %d)\n", o->vocab_size, o->resume, v);
    return NB_TOOL_EXIT_USAGE;
  }
  o->vocab_size = v;
  o->set |= OPT_VOCAB;
  return 0;
}

static int ckpt_read_task(trainer *tr) {
  const char *task = nb_st_metadata(tr->resume, "task");
  if (!task || (strcmp(task, "text") && strcmp(task, "addition") && strcmp(task, "tokens")))
    return ckpt_fail(tr, "missing or unknown task in the metadata", "");
  if (!strcmp(task, "tokens")) return ckpt_read_tokens(tr);
  if (tr->o.tokens)
    return ckpt_fail(tr, "--tokens was given, but the checkpoint is of the task ", task);
  int text = !strcmp(task, "text");
  if (!text && tr->o.data)
    return ckpt_fail(tr, "the checkpoint is of the addition task, but --data was given", "");
  if (text && !tr->o.data) {
    const char *data = nb_st_metadata(tr->resume, "data");
    if (!data || !*data) return ckpt_fail(tr, "text checkpoint without a data path", "");
    /* the metadata is freed once the checkpoint is restored; the path is
     * used to the end (the description, the next checkpoint) */
    if (!(tr->data_path = strdup(data)))
      return fprintf(stderr, "nabla train: out of memory\n"), NB_TOOL_EXIT_RUNTIME;
    tr->o.data = tr->data_path;
  }
  return 0;
}

static int ckpt_read_schedule(trainer *tr) {
  train_opts *o = &tr->o;
  uint64_t seed;
  if (ckpt_sched(tr, "steps", OPT_STEPS, &o->steps, sizeof o->steps) ||
      ckpt_sched(tr, "warmup", OPT_WARMUP, &o->warmup, sizeof o->warmup) ||
      ckpt_sched(tr, "batch", OPT_BATCH, &o->batch, sizeof o->batch) ||
      ckpt_sched(tr, "lr", OPT_LR, &o->lr, sizeof o->lr) || ckpt_meta_opt(tr, "seed", &seed))
    return NB_TOOL_EXIT_USAGE;
  /* micro-batches per step; checkpoints written before --accum have none (1) */
  if (!(o->set & OPT_ACCUM)) o->accum = 1;
  if (nb_st_metadata(tr->resume, "accum") && ckpt_sched(tr, "accum", OPT_ACCUM, &o->accum, sizeof o->accum))
    return NB_TOOL_EXIT_USAGE;
  o->set |= OPT_ACCUM;
  if (!(o->set & OPT_SEED)) o->seed = seed;
  /* the checkpoint's precision unless --precision is given (weights are
   * f32 in every precision; checkpoints before f16 have none) */
  const char *prec = nb_st_metadata(tr->resume, "precision"), *p = NULL;
  char what[512];
  snprintf(what, sizeof what, "--resume %s: metadata \"precision\"", o->resume);
  if (prec && train_opt_value("precision", what, prec, &p)) return NB_TOOL_EXIT_USAGE;
  /* the static name: the metadata's text goes when the checkpoint is closed */
  if (prec && !o->precision) o->precision = train_precision_name(train_precision_of(p));
  return 0;
}

int train_ckpt_open(trainer *tr) {
  tr->resume = nb_safetensors_load(tr->o.resume);
  if (!tr->resume) return ckpt_fail(tr, "", nb_last_error());
  const char *fmt = nb_st_metadata(tr->resume, "format");
  if (!fmt || strcmp(fmt, CKPT_FORMAT)) {
    fprintf(stderr, "nabla train: --resume %s: not a nabla train checkpoint (format %s%s%s, "
            "expected '%s')\n", tr->o.resume, fmt ? "'" : "", fmt ? fmt : "missing",
            fmt ? "'" : "", CKPT_FORMAT);
    return NB_TOOL_EXIT_USAGE;
  }
  uint64_t step, rs, ro;
  if (ckpt_read_task(tr) || ckpt_model_int(tr, "digits", OPT_DIGITS, &tr->o.digits) ||
      ckpt_model_int(tr, "context", OPT_CONTEXT, &tr->o.context) ||
      ckpt_model_int(tr, "layers", OPT_LAYERS, &tr->o.layers) ||
      ckpt_model_int(tr, "heads", OPT_HEADS, &tr->o.heads) ||
      ckpt_model_int(tr, "dim", OPT_DIM, &tr->o.dim) || ckpt_read_schedule(tr) ||
      ckpt_meta_u64(tr, "step", &step) || ckpt_meta_u64(tr, "data_rng_seed", &rs) ||
      ckpt_meta_u64(tr, "data_rng_offset", &ro))
    return NB_TOOL_EXIT_USAGE;
  if (step > 1000000000) /* beyond any --steps: damaged */
    return ckpt_fail(tr, "metadata \"step\" is beyond 1000000000 (the largest --steps)", "");
  tr->step = (int64_t)step;
  tr->data_rng.seed = rs;
  tr->data_rng.offset = ro;
  return 0;
}

int train_ckpt_check_vocab(const trainer *tr) {
  const char *hex = nb_st_metadata(tr->resume, "vocab_bytes");
  char mine[2 * 256 + 1] = {0};
  for (int i = 0; i < tr->text.vocab; i++) sprintf(mine + 2 * i, "%02x", tr->text.id_to_byte[i]);
  if (!hex || strcmp(hex, mine))
    return ckpt_fail(tr, "the vocabulary (distinct bytes) of --data differs from the checkpoint's",
                     "");
  return 0;
}

/* Copies the checkpoint entry name into dst (same shape). */
static int ckpt_copy_into(trainer *tr, const char *name, nb_tensor *dst) {
  nb_tensor *src = nb_st_tensor(tr->resume, name);
  if (!src) return ckpt_fail(tr, "missing tensor ", name);
  char a[128], b[128];
  int same = nb_ndim(src) == nb_ndim(dst) &&
             !memcmp(nb_shape(src), nb_shape(dst), sizeof(int64_t) * (size_t)nb_ndim(dst));
  if (!same) {
    fprintf(stderr, "nabla train: --resume %s: tensor %s is %s, the model needs %s\n",
            tr->o.resume, name, nb_describe(src, a, sizeof a), nb_describe(dst, b, sizeof b));
    return NB_TOOL_EXIT_USAGE;
  }
  if (nb_copy_(dst, src) != NB_OK) return ckpt_fail(tr, "", nb_last_error());
  return 0;
}

static int ckpt_restore_optim(trainer *tr, const nb_optim *opt, const char *prefix) {
  for (int i = 0; i < nb_optim_state_count(opt); i++) {
    const char *sn = NULL;
    nb_tensor *t = nb_optim_state_get(opt, i, &sn);
    char name[256];
    snprintf(name, sizeof name, "%s%s", prefix, sn ? sn : "?");
    if (ckpt_copy_into(tr, name, t)) return NB_TOOL_EXIT_USAGE;
  }
  return 0;
}

/* The loss history, so that the curve of a resumed run covers all steps. */
static void ckpt_restore_history(trainer *tr) {
  nb_tensor *loss = nb_st_tensor(tr->resume, "trainer.loss");
  if (loss && nb_numel(loss) == tr->step && tr->step <= tr->o.steps)
    nb_to_host(nb_cast(loss, NB_F32), tr->loss, sizeof(float) * (size_t)tr->step);
  nb_tensor *es = nb_st_tensor(tr->resume, "trainer.eval_step");
  nb_tensor *el = nb_st_tensor(tr->resume, "trainer.eval_loss");
  int64_t n = nb_numel(es);
  if (es && el && n == nb_numel(el) && n <= 1024 && tr->eval_step && tr->eval_loss &&
      nb_to_host(nb_cast(es, NB_I64), tr->eval_step, sizeof(int64_t) * (size_t)n) == NB_OK &&
      nb_to_host(nb_cast(el, NB_F32), tr->eval_loss, sizeof(float) * (size_t)n) == NB_OK)
    tr->n_eval = (int)n;
  nb_clear_error();
}

/* The optimizers' step count (the trainer's when absent: checkpoints
 * before skipped steps existed) and, when both run f16, the scaler's
 * state; an f16 run from another precision's checkpoint starts a fresh
 * scaler. */
static int ckpt_restore_counters(trainer *tr, int64_t *osteps) {
  uint64_t v, growth;
  if (nb_st_metadata(tr->resume, "optim_steps")) {
    if (ckpt_meta_u64(tr, "optim_steps", &v)) return NB_TOOL_EXIT_USAGE;
    if (v > (uint64_t)tr->step)
      return ckpt_fail(tr, "metadata \"optim_steps\" is beyond the step", "");
    *osteps = (int64_t)v;
  }
  const char *s = nb_st_metadata(tr->resume, "scaler_scale");
  if (!s || tr->o.prec != TRAIN_F16) return 0;
  char *end;
  errno = 0;
  double scale = strtod(s, &end);
  if (ckpt_meta_u64(tr, "scaler_growth", &growth)) return NB_TOOL_EXIT_USAGE;
  if (!*s || *end || errno || growth > (uint64_t)INT64_MAX ||
      nb_scaler_set_state(tr->scaler, scale, (int64_t)growth) != NB_OK) {
    nb_clear_error();
    return ckpt_fail(tr, "bad loss scaler state in the metadata (scaler_scale, scaler_growth)", "");
  }
  return 0;
}

int train_ckpt_restore(trainer *tr) {
  int rc = 0;
  nb_params *all = tr->model->all;
  nb_scope_begin();
  nb_no_grad_begin();
  for (int i = 0; i < nb_params_count(all) && !rc; i++)
    rc = ckpt_copy_into(tr, nb_params_name(all, i), nb_params_get(all, i));
  if (!rc) rc = ckpt_restore_optim(tr, tr->opt_decay, "opt.decay.");
  if (!rc) rc = ckpt_restore_optim(tr, tr->opt_plain, "opt.plain.");
  if (!rc) ckpt_restore_history(tr);
  nb_no_grad_end();
  nb_scope_end();
  int64_t osteps = tr->step;
  if (!rc) rc = ckpt_restore_counters(tr, &osteps);
  nb_optim_set_steps(tr->opt_decay, osteps);
  nb_optim_set_steps(tr->opt_plain, osteps);
  nb_st_close(tr->resume);
  tr->resume = NULL;
  return rc;
}
