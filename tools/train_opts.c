/* Command-line options of `nabla train`: parsing with strict checks (every
 * bad input names the option and exits with status 2) and the defaults,
 * which depend on the task and the device. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool.h"
#include "train.h"

void train_usage(FILE *f) {
  fprintf(f,
    "usage: nabla train [options]\n"
    "\n"
    "Trains a GPT-style transformer. Without --data it learns multi-digit addition\n"
    "(generated in code) and reports exact-match accuracy on held-out problems;\n"
    "with --data FILE it is a character-level model of the file and prints a sample.\n"
    "\n"
    "  --data FILE        character-level training text\n"
    "  --digits N         addition task: digits per operand (default 3)\n"
    "  --layers N         transformer blocks\n"
    "  --heads N          attention heads (must divide --dim)\n"
    "  --dim N            model width\n"
    "  --context N        longest input sequence (addition: at least 3*digits+2)\n"
    "  --batch N          sequences per step\n"
    "  --accum N          split each step's batch into N micro-batches whose\n"
    "                     gradients accumulate before the update (default 1)\n"
    "  --steps N          total optimizer steps (the LR schedule's length)\n"
    "  --stop-at N        stop after step N (the schedule still spans --steps)\n"
    "  --lr X             peak learning rate (AdamW, cosine decay to lr/10)\n"
    "  --warmup N         linear warm-up steps\n"
    "  --seed N           initialisation and data seed (default 1)\n"
    "  --device D         cpu, cuda or cuda:N (default: cuda when available)\n"
    "  --save FILE        write a safetensors checkpoint at the end\n"
    "  --resume FILE      continue from a checkpoint (bit for bit)\n"
    "  --eval-every N     held-out evaluation every N steps (0: only at the end)\n"
    "  --log-every N      progress line every N steps when stderr is not a terminal\n"
    "  --svg FILE         loss curve (default loss.svg); --no-svg to skip it\n"
    "  --quiet            no progress output\n"
    "  --profile          time every kernel of the steps after the first and print\n"
    "                     the table at the end (the steps run slower meanwhile)\n"
    "\n"
    "Defaults are sized for the device: a small model on the CPU, a larger one on\n"
    "the GPU. Exit status: 0 done, 1 run-time failure, 2 bad input.\n");
}

static int opt_fail(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "nabla train: ");
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, "\n(nabla help train lists the options)\n");
  return NB_TOOL_EXIT_USAGE;
}

/* Parses a whole decimal integer in [lo, hi]. */
static int opt_int(const char *name, const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || errno || v < lo || v > hi) {
    fprintf(stderr, "nabla train: %s expects an integer in [%lld, %lld], got '%s'\n", name,
            (long long)lo, (long long)hi, s);
    return NB_TOOL_EXIT_USAGE;
  }
  *out = v;
  return 0;
}

static int opt_small_int(const char *name, const char *s, int lo, int hi, int *out) {
  int64_t v;
  if (opt_int(name, s, lo, hi, &v)) return NB_TOOL_EXIT_USAGE;
  *out = (int)v;
  return 0;
}

/* Parses a finite number in (0, hi]. */
static int opt_pos_real(const char *name, const char *s, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || *end || errno || !isfinite(v) || v <= 0 || v > hi) {
    fprintf(stderr, "nabla train: %s expects a number in (0, %g], got '%s'\n", name, hi, s);
    return NB_TOOL_EXIT_USAGE;
  }
  *out = v;
  return 0;
}

/* Handles an option that takes a value; returns -1 if name is not one. */
static int opt_value(train_opts *o, const char *name, const char *v) {
  const int64_t BIG = 1000000000;
  int64_t i64;
  int r;
#define OPT_IS(s) (!strcmp(name, s))
  if (OPT_IS("--data")) return o->data = v, 0;
  if (OPT_IS("--save")) return o->save = v, 0;
  if (OPT_IS("--resume")) return o->resume = v, 0;
  if (OPT_IS("--svg")) return o->svg = v, 0;
  if (OPT_IS("--device")) return o->device = v, 0;
  if (OPT_IS("--digits")) return o->set |= OPT_DIGITS, opt_small_int(name, v, 1, 9, &o->digits);
  if (OPT_IS("--layers")) return o->set |= OPT_LAYERS, opt_small_int(name, v, 1, 256, &o->layers);
  if (OPT_IS("--heads")) return o->set |= OPT_HEADS, opt_small_int(name, v, 1, 1024, &o->heads);
  if (OPT_IS("--dim")) return o->set |= OPT_DIM, opt_small_int(name, v, 1, 65536, &o->dim);
  if (OPT_IS("--context"))
    return o->set |= OPT_CONTEXT, opt_small_int(name, v, 1, 1 << 20, &o->context);
  if (OPT_IS("--batch")) return o->set |= OPT_BATCH, opt_small_int(name, v, 1, 1 << 20, &o->batch);
  if (OPT_IS("--accum")) return o->set |= OPT_ACCUM, opt_small_int(name, v, 1, 1 << 20, &o->accum);
  if (OPT_IS("--steps")) return o->set |= OPT_STEPS, opt_int(name, v, 1, BIG, &o->steps);
  if (OPT_IS("--stop-at")) return opt_int(name, v, 1, BIG, &o->stop_at);
  if (OPT_IS("--warmup")) return o->set |= OPT_WARMUP, opt_int(name, v, 0, BIG, &o->warmup);
  if (OPT_IS("--eval-every"))
    return o->set |= OPT_EVAL_EVERY, opt_int(name, v, 0, BIG, &o->eval_every);
  if (OPT_IS("--log-every"))
    return o->set |= OPT_LOG_EVERY, opt_int(name, v, 1, BIG, &o->log_every);
  if (OPT_IS("--lr")) return o->set |= OPT_LR, opt_pos_real(name, v, 10.0, &o->lr);
  if (OPT_IS("--seed")) {
    o->set |= OPT_SEED;
    if ((r = opt_int(name, v, 0, INT64_MAX, &i64))) return r;
    return o->seed = (uint64_t)i64, 0;
  }
#undef OPT_IS
  return -1;
}

static int opt_flag(train_opts *o, const char *name) {
  if (!strcmp(name, "--quiet") || !strcmp(name, "-q")) return o->quiet = 1, 0;
  if (!strcmp(name, "--no-svg")) return o->no_svg = 1, 0;
  if (!strcmp(name, "--profile")) return o->profile = 1, 0;
  if (!strcmp(name, "--help") || !strcmp(name, "-h")) return o->help = 1, 0;
  return -1;
}

static int opt_takes_value(const char *name) {
  static const char *const names[] = {
      "--data", "--save", "--resume", "--svg", "--device", "--digits", "--layers",
      "--heads", "--dim", "--context", "--batch", "--accum", "--steps", "--stop-at", "--warmup",
      "--eval-every", "--log-every", "--lr", "--seed"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (!strcmp(name, names[i])) return 1;
  return 0;
}

int train_parse(int argc, char **argv, train_opts *o) {
  memset(o, 0, sizeof *o);
  o->seed = 1;
  o->digits = 3;
  o->svg = "loss.svg";
  for (int i = 1; i < argc; i++) {
    char name[64];
    const char *arg = argv[i], *eq = strchr(arg, '='), *val;
    if (strncmp(arg, "--", 2) && strcmp(arg, "-q") && strcmp(arg, "-h"))
      return opt_fail("unexpected argument '%s'%s", arg, "");
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    if (len >= sizeof name) return opt_fail("unknown option '%s'%s", arg, "");
    memcpy(name, arg, len);
    name[len] = 0;
    if (!eq && opt_flag(o, name) == 0) continue;
    if (!opt_takes_value(name))
      return opt_fail(eq ? "unknown option '%s' (in '%s')" : "unknown option '%s'%s", name,
                      eq ? arg : "");
    if (eq) val = eq + 1;
    else if (i + 1 < argc) val = argv[i + 1];
    else return opt_fail("%s needs a value%s", name, "");
    int r = opt_value(o, name, val);
    if (r) return r;
    if (!eq) i++;
  }
  return 0;
}

/* Sets *field to v unless the option was given. */
#define DEFAULT(bit, field, v) \
  do {                         \
    if (!(o->set & (bit))) o->field = (v); \
  } while (0)

void train_resolve_defaults(train_opts *o, int is_text, int on_gpu) {
  if (!is_text) {
    DEFAULT(OPT_LAYERS, layers, on_gpu ? 4 : 2);
    DEFAULT(OPT_HEADS, heads, 4);
    DEFAULT(OPT_DIM, dim, on_gpu ? 256 : 64);
    DEFAULT(OPT_BATCH, batch, on_gpu ? 256 : 64);
    DEFAULT(OPT_STEPS, steps, on_gpu ? 1000 : 1500);
    DEFAULT(OPT_LR, lr, on_gpu ? 1e-3 : 3e-3);
    DEFAULT(OPT_CONTEXT, context, 3 * o->digits + 2);
  } else {
    DEFAULT(OPT_LAYERS, layers, on_gpu ? 6 : 4);
    DEFAULT(OPT_HEADS, heads, on_gpu ? 6 : 4);
    DEFAULT(OPT_DIM, dim, on_gpu ? 384 : 128);
    DEFAULT(OPT_BATCH, batch, on_gpu ? 64 : 16);
    DEFAULT(OPT_STEPS, steps, on_gpu ? 2000 : 500);
    DEFAULT(OPT_LR, lr, 1e-3);
    DEFAULT(OPT_CONTEXT, context, on_gpu ? 256 : 64);
  }
  DEFAULT(OPT_ACCUM, accum, 1);
  DEFAULT(OPT_WARMUP, warmup, o->steps / 20 < 100 ? o->steps / 20 : 100);
  DEFAULT(OPT_EVAL_EVERY, eval_every, o->steps >= 10 ? o->steps / 5 : 0);
  DEFAULT(OPT_LOG_EVERY, log_every, o->steps >= 20 ? o->steps / 20 : 1);
}
