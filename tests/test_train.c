/* `nabla train` end to end, through the built binary (NABLA_BIN, set by the
 * test environment): a short run whose loss falls, bad options that exit
 * with status 2 and a message naming the problem, gradient accumulation
 * (--accum) against the plain run, each --precision (and a resumed run's),
 * a text run, and resumed runs (of either task; text without --data) that
 * match uninterrupted ones bit for bit. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

static const char *bin;
static char dir[256];
static char out[64 * 1024]; /* output of the last command */

/* Runs `nabla ARGS` with stdout and stderr captured in out; returns the exit
 * status (-1 if it did not exit normally). */
static int run(const char *args) { return nbt_run(bin, args, dir, out, sizeof out); }

/* A tiny model that trains in well under a second per step, on the device
 * NABLA_TRAIN_DEVICE names (default cpu; the GPU machine sets cuda). */
static char TINY[200];

static void test_loss_falls(void) {
  char args[2048];
  snprintf(args, sizeof args, "%s --steps 60 --lr 3e-3 --eval-every 30 --svg %s/loss.svg",
           "train --device cpu --layers 1 --heads 2 --dim 32 --batch 32 --quiet", dir);
  int st = run(args);
  NBT_CHECK(st == 0, "short run exits 0, got %d:\n%s", st, out);
  double first = 0, last = 0;
  const char *p = strstr(out, "\nloss ");
  NBT_CHECK(p && sscanf(p, "\nloss %lf -> %lf", &first, &last) == 2, "loss line in:\n%s", out);
  NBT_CHECK(last < first - 0.3, "loss falls: %g -> %g", first, last);
  NBT_CHECK(strstr(out, "held-out accuracy:") != NULL, "accuracy reported:\n%s", out);
  NBT_CHECK(strstr(out, "tokens/s") != NULL, "throughput reported");
  char path[300], head[256] = {0};
  snprintf(path, sizeof path, "%s/loss.svg", dir);
  FILE *f = fopen(path, "rb");
  NBT_CHECK(f != NULL, "SVG written at %s", path);
  if (f) {
    size_t n = fread(head, 1, sizeof head - 1, f);
    head[n] = 0;
    fclose(f);
    NBT_CHECK(strstr(head, "<svg") != NULL, "SVG header: %s", head);
  }
}

/* Each bad input: exit status 2 and a message containing expect. */
static void bad(const char *args, const char *expect) {
  int st = run(args);
  NBT_CHECK(st == 2, "'%s' exits 2, got %d:\n%s", args, st, out);
  NBT_CHECK(strstr(out, expect) != NULL, "'%s' names '%s' in:\n%s", args, expect, out);
}

static void test_bad_input(void) {
  char args[600];
  bad("train --bogus", "--bogus");
  bad("train --steps abc", "--steps");
  bad("train --steps -5", "--steps");
  bad("train --steps", "needs a value");
  bad("train --lr 0", "--lr");
  bad("train --lr nan", "--lr");
  bad("train --device tpu", "tpu");
  bad("train --device cuda:99", "cuda:99");
  bad("train --heads 3 --dim 32 --device cpu", "--heads 3");
  bad("train --context 4 --device cpu", "--context 4");
  bad("train extra", "extra");
  bad("frobnicate", "frobnicate");
  bad("train --batch 32 --accum 3 --device cpu", "--accum 3");
  bad("train --accum 0", "--accum");
  bad("train --precision fp16", "--precision expects one of f32|bf16|f16, got 'fp16'");
  bad("train --precision F32", "--precision expects one of f32|bf16|f16, got 'F32'");
  bad("train --precision", "needs a value");
  snprintf(args, sizeof args, "train --data %s/missing.txt", dir);
  bad(args, "missing.txt");
  snprintf(args, sizeof args, "train --data %s", dir); /* a directory */
  bad(args, "is a directory");
  snprintf(args, sizeof args, "train --resume %s/missing.st", dir);
  bad(args, "missing.st");
}

/* Gradient accumulation: the same batch in 4 micro-batches trains the same
 * model up to rounding, so the mean losses agree to the printed digits. */
static double loss_line(const char *what, double *first) {
  double a = NAN, b = NAN;
  const char *p = strstr(out, "\nloss ");
  NBT_CHECK(p && sscanf(p, "\nloss %lf -> %lf", &a, &b) == 2, "%s: loss line in:\n%s", what, out);
  *first = a;
  return b;
}

static void test_accumulation(void) {
  char args[1024];
  double f1, f4;
  snprintf(args, sizeof args, "%s--steps 20 --eval-every 0", TINY);
  NBT_CHECK(run(args) == 0, "run without accumulation:\n%s", out);
  double l1 = loss_line("accum 1", &f1);
  snprintf(args, sizeof args, "%s--steps 20 --eval-every 0 --accum 4", TINY);
  NBT_CHECK(run(args) == 0, "run with --accum 4:\n%s", out);
  NBT_CHECK(strstr(out, "in 4 micro-batches") != NULL, "accumulation reported:\n%s", out);
  double l4 = loss_line("accum 4", &f4);
  NBT_CHECK(fabs(f1 - f4) <= 2e-4 && fabs(l1 - l4) <= 2e-4,
            "losses with and without accumulation agree: %.4f -> %.4f vs %.4f -> %.4f", f1, l1, f4, l4);
}

/* Each --precision as the run describes it, the CPU's default (f32), and
 * a resumed run's precision: the checkpoint's unless --precision is given. */
static void test_precision(void) {
  static const char *const names[] = {"f32", "bf16", "f16", NULL};
  static const char *const lines[] = {"cosine), f32", "cosine), bf16 autocast, f32 weights",
                                      "cosine), f16 autocast with loss scaling, f32 weights",
                                      "cosine), f32"};
  char args[1024], ck[300];
  snprintf(ck, sizeof ck, "%s/f16.safetensors", dir);
  for (int i = 0; i < 4; i++) {
    int f16 = names[i] && !strcmp(names[i], "f16");
    snprintf(args, sizeof args, "%s--steps 4 --stop-at 2 --eval-every 0%s%s%s%s", TINY,
             names[i] ? " --precision " : "", names[i] ? names[i] : "", f16 ? " --save " : "",
             f16 ? ck : "");
    int st = run(args);
    NBT_CHECK(st == 0, "--precision %s exits 0, got %d:\n%s", names[i] ? names[i] : "(default)", st,
              out);
    NBT_CHECK(strstr(out, lines[i]) != NULL, "'%s' in:\n%s", lines[i], out);
    NBT_CHECK(!f16 == !strstr(out, "; loss scale now "), "loss scale reported for f16 only:\n%s", out);
  }
  snprintf(args, sizeof args, "train --device %s --quiet --no-svg --resume %s",
           getenv("NABLA_TRAIN_DEVICE") ? getenv("NABLA_TRAIN_DEVICE") : "cpu", ck);
  NBT_CHECK(run(args) == 0 && strstr(out, lines[2]), "resumed as f16:\n%s", out);
  strcat(args, " --precision bf16");
  NBT_CHECK(run(args) == 0 && strstr(out, lines[1]), "resumed as bf16:\n%s", out);
}

static void compare_checkpoints(const char *pa, const char *pb);

/* A text run resumed without --data: the path comes from the checkpoint
 * and must outlive it (it was read from the checkpoint's metadata after the
 * file was closed: a garbled task line, then a failed save). The halves
 * must match an uninterrupted run bit for bit. */
static void test_text_resume(const char *path) {
  char args[2048], a[300], b1[300], b2[300];
  snprintf(a, sizeof a, "%s/text-a.safetensors", dir);
  snprintf(b1, sizeof b1, "%s/text-b1.safetensors", dir);
  snprintf(b2, sizeof b2, "%s/text-b2.safetensors", dir);
  snprintf(args, sizeof args, "%s--data %s --steps 12 --context 16 --batch 8 --eval-every 0 --save %s",
           TINY, path, a);
  NBT_CHECK(run(args) == 0, "uninterrupted text run:\n%s", out);
  snprintf(args, sizeof args, "%s--data %s --steps 12 --stop-at 6 --context 16 --batch 8 --save %s",
           TINY, path, b1);
  NBT_CHECK(run(args) == 0, "first half of the text run:\n%s", out);
  snprintf(args, sizeof args, "train --device %s --quiet --no-svg --resume %s --save %s",
           getenv("NABLA_TRAIN_DEVICE") ? getenv("NABLA_TRAIN_DEVICE") : "cpu", b1, b2);
  int st = run(args);
  NBT_CHECK(st == 0, "text run resumed without --data exits 0, got %d:\n%s", st, out);
  char task[512];
  snprintf(task, sizeof task, "task: character-level text, %s (", path);
  NBT_CHECK(strstr(out, task) != NULL, "the task line names the data file '%s':\n%s", path, out);
  NBT_CHECK(strstr(out, "checkpoint: ") != NULL, "the resumed run saved its checkpoint:\n%s", out);
  compare_checkpoints(a, b2);
  nb_st_file *f = nb_safetensors_load(b2);
  const char *data = f ? nb_st_metadata(f, "data") : NULL;
  NBT_CHECK(data && !strcmp(data, path), "the new checkpoint records the data path: %s", data ? data : "(none)");
  nb_st_close(f);
}

static void test_text(void) {
  char path[300], args[1024];
  snprintf(path, sizeof path, "%s/text.txt", dir);
  FILE *f = fopen(path, "w");
  for (int i = 0; f && i < 60; i++) fprintf(f, "the quick brown fox jumps over the lazy dog. ");
  if (f) fclose(f);
  snprintf(args, sizeof args, "%s--data %s --steps 30 --context 16 --batch 8", TINY, path);
  int st = run(args);
  NBT_CHECK(st == 0, "text run exits 0, got %d:\n%s", st, out);
  NBT_CHECK(strstr(out, "sample") != NULL, "a sample is printed:\n%s", out);
  snprintf(args, sizeof args, "%s--data %s --context 4000", TINY, path);
  bad(args, "--context 4000");
  test_text_resume(path);
}

/* Every tensor of a equals b's bit for bit (the eval history aside, which
 * depends on --eval-every, not on the training). */
static void compare_checkpoints(const char *pa, const char *pb) {
  nb_st_file *a = nb_safetensors_load(pa), *b = nb_safetensors_load(pb);
  NBT_CHECK(a && b, "checkpoints load: %s", nb_last_error());
  if (!a || !b) {
    nb_st_close(a), nb_st_close(b);
    return;
  }
  int n = nb_st_count(a), compared = 0, params = 0, moments = 0;
  for (int i = 0; i < n; i++) {
    const char *name = nb_st_name(a, i);
    if (!strncmp(name, "trainer.eval", 12)) continue;
    nb_tensor *ta = nb_st_tensor(a, name), *tb = nb_st_tensor(b, name);
    size_t bytes = (size_t)nb_numel(ta) * nb_dtype_size(nb_dtype_of(ta));
    void *ba = malloc(bytes ? bytes : 1), *bb = malloc(bytes ? bytes : 1);
    int same = ta && tb && nb_numel(ta) == nb_numel(tb) && nb_dtype_of(ta) == nb_dtype_of(tb) &&
               nb_to_host(ta, ba, bytes) == NB_OK && nb_to_host(tb, bb, bytes) == NB_OK &&
               !memcmp(ba, bb, bytes);
    NBT_CHECK(same, "tensor %s identical after resume", name);
    compared++;
    params += !strchr(name, '.') || !strncmp(name, "h.", 2) || !strncmp(name, "ln_f", 4);
    moments += !strncmp(name, "opt.", 4);
    free(ba), free(bb);
    nb_release(ta), nb_release(tb);
  }
  NBT_CHECK(params > 10 && moments > 10, "compared %d tensors (%d parameters, %d moments)",
            compared, params, moments);
  NBT_CHECK(!strcmp(nb_st_metadata(a, "step"), nb_st_metadata(b, "step")) &&
            !strcmp(nb_st_metadata(a, "data_rng_offset"), nb_st_metadata(b, "data_rng_offset")),
            "same step and data RNG state");
  nb_st_close(a), nb_st_close(b);
}

static void test_resume(void) {
  char args[2048], a[300], b1[300], b2[300];
  snprintf(a, sizeof a, "%s/a.safetensors", dir);
  snprintf(b1, sizeof b1, "%s/b1.safetensors", dir);
  snprintf(b2, sizeof b2, "%s/b2.safetensors", dir);
  /* with 2 micro-batches per step: the resumed run takes --accum from the
   * checkpoint (a different split would change the bits) */
  snprintf(args, sizeof args, "%s--steps 16 --accum 2 --eval-every 0 --save %s", TINY, a);
  int st = run(args);
  NBT_CHECK(st == 0, "uninterrupted run exits 0, got %d:\n%s", st, out);
  /* Half, with evaluations on (they must not disturb the training draws)... */
  snprintf(args, sizeof args, "%s--steps 16 --accum 2 --stop-at 8 --eval-every 3 --save %s", TINY, b1);
  st = run(args);
  NBT_CHECK(st == 0, "first half exits 0, got %d:\n%s", st, out);
  /* ...then the rest in a new process, configuration from the checkpoint. */
  snprintf(args, sizeof args, "train --device %s --quiet --no-svg --resume %s --save %s",
           getenv("NABLA_TRAIN_DEVICE") ? getenv("NABLA_TRAIN_DEVICE") : "cpu", b1, b2);
  st = run(args);
  NBT_CHECK(st == 0, "resumed half exits 0, got %d:\n%s", st, out);
  NBT_CHECK(strstr(out, "resumed at step 8") != NULL, "resume reported:\n%s", out);
  compare_checkpoints(a, b2);
  /* The model's shape comes from the checkpoint: a different one is refused. */
  snprintf(args, sizeof args, "train --device cpu --quiet --resume %s --layers 3", b1);
  bad(args, "--layers 3");
  snprintf(args, sizeof args, "train --device cpu --quiet --resume %s", b2);
  bad(args, "--steps");
}

int main(void) {
  bin = getenv("NABLA_BIN");
  if (!bin || !*bin || access(bin, X_OK) != 0) {
    /* ctest sets it; a missing binary must not pass as a skipped test */
    printf("FAIL: NABLA_BIN does not name the nabla binary (got '%s'); run through ctest\n", bin ? bin : "");
    return 1;
  }
  const char *dev = getenv("NABLA_TRAIN_DEVICE");
  snprintf(TINY, sizeof TINY, "train --device %s --layers 1 --heads 2 --dim 32 --batch 32 "
           "--quiet --no-svg ", dev && *dev ? dev : "cpu");
  if (!nbt_tmpdir(dir, sizeof dir, "train")) return 1;
  test_bad_input();
  test_loss_falls();
  test_accumulation();
  test_precision();
  test_text();
  test_resume();
  nbt_rmtree(dir);
  return nbt_finish();
}
