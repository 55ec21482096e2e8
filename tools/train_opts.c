/* Command-line options of `nabla train`: the option table (parsed by the
 * shared parser of cli.c: every bad input names the option and exits with
 * status 2; a checkpoint's metadata is checked against the same ranges) and
 * the defaults, which depend on the task and the device. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tool.h"
#include "train.h"

void train_usage(FILE *f) {
  fprintf(f,
    "usage: nabla train [options]\n"
    "\n"
    "Trains a GPT-style transformer. Without --data it learns multi-digit addition\n"
    "(generated in code) and reports exact-match accuracy on held-out problems;\n"
    "with --data FILE it is a character-level model of the file and prints a sample;\n"
    "with --tokens FILE it models the file's tokens and reports held-out loss.\n"
    "\n"
    "  --data FILE        character-level training text\n"
    "  --tokens FILE      training tokens in llm.c's format (uint16 after a 1024-byte\n"
    "                     header: magic 20240520, version 1, token count)\n"
    "  --val-tokens FILE  held-out tokens (default: the last 10%% of --tokens)\n"
    "  --vocab-size N     token ids are below N (default 50257, GPT-2's tokenizer);\n"
    "                     the model pads it to a multiple of 64\n"
    "  --model gpt2       GPT-2 small's defaults (12 layers, 12 heads, dim 768,\n"
    "                     context 1024; needs --tokens); options given override them\n"
    "  --max-data SIZE    refuse a --data larger than SIZE bytes (K, M, G suffixes;\n"
    "                     default 1G, or half of this machine's memory if less)\n"
    "  --digits N         addition task: digits per operand (default 3)\n"
    "  --layers N         transformer blocks\n"
    "  --heads N          attention heads (must divide --dim)\n"
    "  --dim N            model width\n"
    "  --context N        longest input sequence (addition: at least 3*digits+2)\n"
    "  --batch N          sequences per step\n"
    "  --precision P      f32, bf16 or f16 (bf16 the default on the GPU; f32 on the\n"
    "                     CPU): bf16 and f16 run the forward under autocast (matrix\n"
    "                     products and attention in the 16-bit dtype with f32\n"
    "                     accumulation, norms, softmax and the loss in f32; f32\n"
    "                     master weights); f16 scales the loss dynamically (2^16,\n"
    "                     halved on overflow, doubled after 2000 good steps); both\n"
    "                     skip a step whose gradients are not finite\n"
    "  --accum N          split each step's batch into N micro-batches whose\n"
    "                     gradients accumulate before the update (default 1)\n"
    "  --steps N          total optimizer steps (the LR schedule's length)\n"
    "  --stop-at N        stop after step N (the schedule still spans --steps)\n"
    "  --lr X             peak learning rate (AdamW, cosine decay to lr/10)\n"
    "  --warmup N         linear warm-up steps\n"
    "  --seed N           initialisation and data seed (default 1)\n"
    "  --device D         cpu, cuda or cuda:N (default: cuda when available)\n"
    "  --save FILE        write a safetensors checkpoint at the end\n"
    "  --save-every N     also every N steps (to the --save file, replaced atomically)\n"
    "  --resume FILE      continue from a checkpoint (bit for bit)\n"
    "  --eval-every N     held-out evaluation every N steps (0: only at the end)\n"
    "  --log-every N      progress line every N steps when stderr is not a terminal\n"
    "  --svg FILE         loss curve (default " TRAIN_DEFAULT_SVG "); --no-svg to skip it\n"
    "  --quiet, -q        no progress output\n"
    "  --profile          time every kernel of the steps after the first and print\n"
    "                     the table at the end (the steps run slower meanwhile)\n"
    "\n"
    "Values go as --opt VALUE or --opt=VALUE; -- ends the options. Output files\n"
    "(--save, --svg) are checked before the first step. Defaults are sized for the\n"
    "device: a small model on the CPU, a larger one on the GPU. Exit status: 0 done,\n"
    "1 run-time failure, 2 bad input.\n");
}

/* The option table, its destinations in o. */
#define TRAIN_BIG 1000000000
#define TRAIN_N_OPTS 30
static int train_opt_rows(train_opts *o, cli_opt *r) {
  const cli_opt rows[TRAIN_N_OPTS] = {
      CLI_OPT_STR("data", &o->data, 0),
      CLI_OPT_STR("tokens", &o->tokens, 0),
      CLI_OPT_STR("val-tokens", &o->val_tokens, 0),
      CLI_OPT_CHOICE("model", &o->model, "gpt2"),
      CLI_OPT_NUM(CLI_INT, "vocab-size", &o->vocab_size, 2, 65536, OPT_VOCAB),
      CLI_OPT_NUM(CLI_SIZE, "max-data", &o->max_data, 1, INT64_MAX, 0),
      CLI_OPT_STR("save", &o->save, 0),
      CLI_OPT_NUM(CLI_I64, "save-every", &o->save_every, 1, TRAIN_BIG, 0),
      CLI_OPT_STR("resume", &o->resume, 0),
      CLI_OPT_STR("svg", &o->svg, OPT_SVG),
      CLI_OPT_STR("device", &o->device, 0),
      CLI_OPT_CHOICE("precision", &o->precision, "f32|bf16|f16"),
      CLI_OPT_NUM(CLI_INT, "digits", &o->digits, 1, 9, OPT_DIGITS),
      CLI_OPT_NUM(CLI_INT, "layers", &o->layers, 1, 256, OPT_LAYERS),
      CLI_OPT_NUM(CLI_INT, "heads", &o->heads, 1, 1024, OPT_HEADS),
      CLI_OPT_NUM(CLI_INT, "dim", &o->dim, 1, 65536, OPT_DIM),
      CLI_OPT_NUM(CLI_INT, "context", &o->context, 1, 1 << 20, OPT_CONTEXT),
      CLI_OPT_NUM(CLI_INT, "batch", &o->batch, 1, 1 << 20, OPT_BATCH),
      CLI_OPT_NUM(CLI_INT, "accum", &o->accum, 1, 1 << 20, OPT_ACCUM),
      CLI_OPT_NUM(CLI_I64, "steps", &o->steps, 1, TRAIN_BIG, OPT_STEPS),
      CLI_OPT_NUM(CLI_I64, "stop-at", &o->stop_at, 1, TRAIN_BIG, 0),
      CLI_OPT_NUM(CLI_I64, "warmup", &o->warmup, 0, TRAIN_BIG, OPT_WARMUP),
      CLI_OPT_NUM(CLI_I64, "eval-every", &o->eval_every, 0, TRAIN_BIG, OPT_EVAL_EVERY),
      CLI_OPT_NUM(CLI_I64, "log-every", &o->log_every, 1, TRAIN_BIG, OPT_LOG_EVERY),
      CLI_OPT_REAL("lr", &o->lr, 0, 10, 1, OPT_LR),
      CLI_OPT_NUM(CLI_U64, "seed", &o->seed, 0, INT64_MAX, OPT_SEED),
      CLI_OPT_FLAG("quiet", 'q', &o->quiet),
      CLI_OPT_FLAG("no-svg", 0, &o->no_svg),
      CLI_OPT_FLAG("profile", 0, &o->profile),
      CLI_OPT_FLAG("help", 'h', &o->help),
  };
  memcpy(r, rows, sizeof rows);
  return TRAIN_N_OPTS;
}

int train_parse(int argc, char **argv, train_opts *o) {
  cli_opt rows[TRAIN_N_OPTS];
  memset(o, 0, sizeof *o);
  o->seed = 1;
  o->digits = 3;
  o->svg = TRAIN_DEFAULT_SVG;
  cli_spec spec = {.prog = "nabla train", .opts = rows, .n_opts = train_opt_rows(o, rows),
                   .set = &o->set};
  return cli_parse(&spec, argc, argv);
}

int train_opt_value(const char *name, const char *what, const char *s, void *dst) {
  train_opts scratch;
  cli_opt rows[TRAIN_N_OPTS];
  int n = train_opt_rows(&scratch, rows);
  const cli_opt *row = cli_find(rows, n, name);
  if (!row) return fprintf(stderr, "nabla train: no option --%s\n", name), CLI_EXIT_USAGE;
  cli_opt one = *row;
  one.dst = dst;
  return cli_value("nabla train", &one, what, s);
}

/* The choices of --precision, in train_precision's order. */
static const char *const precision_names[] = {"f32", "bf16", "f16"};

const char *train_precision_name(train_precision p) { return precision_names[p]; }

train_precision train_precision_of(const char *name) {
  return !strcmp(name, "f16") ? TRAIN_F16 : !strcmp(name, "bf16") ? TRAIN_BF16 : TRAIN_F32;
}

/* Sets *field to v unless the option was given. */
#define DEFAULT(bit, field, v) \
  do {                         \
    if (!(o->set & (bit))) o->field = (v); \
  } while (0)

/* The addition defaults. CPU: 2 layers of width 64, 64 sequences a step,
 * 1,500 steps at peak lr 3e-3 (warm-up 75, cosine to 3e-4): about 30 s on
 * one idle core. The recipe's robustness comes from gpt.c's fan-in
 * initialisation: with it, ten seeds reached 95% held-out accuracy between
 * steps 400 and 800 of a 1,000-step run, so 1,500 steps leave about twice
 * the slowest seed's need (with GPT-2's fixed 0.02, 1,500 steps ended
 * anywhere from 10% to 100% by seed; bench/results/
 * cpu-2026-11-24-default-recipe.md). GPU: twice the depth, 4x the width
 * and batch (3.2M parameters), lr 1e-3 for the wider model, 1,000 steps
 * (the 4x larger batch sees 2.7x the CPU run's examples). */
void train_resolve_defaults(train_opts *o, int is_text, int on_gpu) {
  DEFAULT(OPT_VOCAB, vocab_size, GPT2_VOCAB);
  if (o->model && !strcmp(o->model, "gpt2")) {
    /* GPT-2 small; llm.c's recipe at a batch that fits one GPU: peak lr
     * 6e-4 (warm-up and cosine as for every run) */
    gpt_config g = gpt_preset_gpt2();
    DEFAULT(OPT_LAYERS, layers, g.layers);
    DEFAULT(OPT_HEADS, heads, g.heads);
    DEFAULT(OPT_DIM, dim, g.dim);
    DEFAULT(OPT_CONTEXT, context, g.context);
    DEFAULT(OPT_BATCH, batch, on_gpu ? 16 : 4);
    DEFAULT(OPT_STEPS, steps, on_gpu ? 2000 : 500);
    DEFAULT(OPT_LR, lr, 6e-4);
  } else if (!is_text) {
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
  /* bf16 on the GPU: every device the CUDA build runs on (sm_80 and later)
   * has bf16 tensor cores; f32 on the CPU */
  if (!o->precision) o->precision = on_gpu ? "bf16" : "f32";
  o->prec = train_precision_of(o->precision);
  DEFAULT(OPT_WARMUP, warmup, o->steps / 20 < 100 ? o->steps / 20 : 100);
  DEFAULT(OPT_EVAL_EVERY, eval_every, o->steps >= 10 ? o->steps / 5 : 0);
  DEFAULT(OPT_LOG_EVERY, log_every, o->steps >= 20 ? o->steps / 20 : 1);
}
