/* `nabla train`'s inputs and outputs, through the built binary (NABLA_BIN):
 * output files checked before the first step (--save, --svg, a --data path
 * a checkpoint cannot record), the default loss curve under runs/,
 * periodic checkpoints (--save-every) that survive a killed run and resume
 * bit for bit, the evaluation line on a terminal, the size limit and the
 * memory of --data, and checkpoint metadata checked like the options. */
#define _GNU_SOURCE /* posix_openpt, wait4 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

static const char *bin;
static char dir[256];
static char out[64 * 1024];
static char TINY[200];

static int run(const char *args) { return nbt_run(bin, args, dir, out, sizeof out); }

static void bad(const char *args, const char *expect) {
  int st = run(args);
  NBT_CHECK(st == 2, "'%s' exits 2, got %d:\n%s", args, st, out);
  NBT_CHECK(strstr(out, expect) != NULL, "'%s' names '%s' in:\n%s", args, expect, out);
}

/* A bad output is found before the run: nothing trained. */
static void bad_early(const char *args, const char *expect) {
  bad(args, expect);
  NBT_CHECK(!strstr(out, "task:") && !strstr(out, "throughput"),
            "'%s' stops before training:\n%s", args, out);
}

static int exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* ---- processes: argv split at spaces, optionally on a terminal ---------- */

typedef struct {
  pid_t pid;
  int fd; /* the terminal's master side, or -1 */
} child;

static child spawn(const char *args, int on_tty) {
  static char buf[4096];
  char *argv[64];
  int n = 0, master = -1;
  snprintf(buf, sizeof buf, "%s", args);
  argv[n++] = (char *)bin;
  for (char *t = strtok(buf, " "); t && n < 63; t = strtok(NULL, " ")) argv[n++] = t;
  argv[n] = NULL;
  if (on_tty) {
    master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master)) {
      if (master >= 0) close(master);
      return (child){0, -1}; /* no pseudo-terminals here */
    }
  }
  pid_t pid = fork();
  if (pid == 0) {
    int fd = on_tty ? (setsid(), open(ptsname(master), O_RDWR)) : open("/dev/null", O_WRONLY);
    dup2(fd, 1), dup2(fd, 2);
    if (master >= 0) close(master);
    execv(bin, argv);
    _exit(127);
  }
  return (child){pid, master};
}

/* Waits for the child; returns its exit status (-1: killed) and its peak
 * resident memory in KiB. */
static int finish(child c, long *maxrss_kib) {
  int st = 0;
  struct rusage ru;
  memset(&ru, 0, sizeof ru);
  while (wait4(c.pid, &st, 0, &ru) < 0 && errno == EINTR) {}
  if (maxrss_kib) *maxrss_kib = ru.ru_maxrss;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- output files ---------------------------------------------------------- */

static void test_outputs_first(void) {
  char args[2048], path[300];
  snprintf(args, sizeof args, "%s--steps 5 --save %s/missing/ck.safetensors", TINY, dir);
  bad_early(args, "missing/ck.safetensors");
  snprintf(args, sizeof args, "%s--steps 5 --save %s", TINY, dir);
  bad_early(args, "is a directory");
  /* the same rule for the loss curve (it printed an error and exited 0) */
  snprintf(args, sizeof args, "train --device cpu --layers 1 --heads 2 --dim 32 --batch 8 "
           "--quiet --steps 5 --svg %s/missing/loss.svg", dir);
  bad_early(args, "missing/loss.svg");
  snprintf(args, sizeof args, "%s--steps 5 --save-every 2", TINY);
  bad_early(args, "--save-every needs --save");
  snprintf(args, sizeof args, "%s--steps 5 --save-every 0 --save %s/x.safetensors", TINY, dir);
  bad_early(args, "--save-every");
  /* a --data path that is not UTF-8 cannot go into a checkpoint's metadata */
  snprintf(path, sizeof path, "%s/text\xff.txt", dir);
  FILE *f = fopen(path, "w");
  for (int i = 0; f && i < 40; i++) fprintf(f, "abcd efgh ijkl mnop. ");
  if (f) fclose(f);
  snprintf(args, sizeof args, "%s--data %s --context 8 --steps 5 --save %s/t.safetensors", TINY,
           path, dir);
  bad_early(args, "UTF-8");
  snprintf(args, sizeof args, "%s--data %s --context 8 --steps 2", TINY, path);
  NBT_CHECK(run(args) == 0, "without --save the same path trains:\n%s", out);
}

/* Without --svg the curve goes to runs/loss.svg under the working directory
 * (`make run` had left loss.svg beside the sources). */
static void test_default_svg(void) {
  char cwd[4096], work[300], args[1024], path[400];
  snprintf(work, sizeof work, "%s/work", dir);
  NBT_CHECK(mkdir(work, 0777) == 0 && getcwd(cwd, sizeof cwd) && chdir(work) == 0,
            "enter %s", work);
  snprintf(args, sizeof args, "train --device cpu --layers 1 --heads 2 --dim 32 --batch 8 "
           "--quiet --steps 3");
  int st = run(args);
  NBT_CHECK(st == 0, "run with the default --svg exits 0, got %d:\n%s", st, out);
  NBT_CHECK(strstr(out, "loss curve: runs/loss.svg") != NULL, "curve reported:\n%s", out);
  snprintf(path, sizeof path, "%s/runs/loss.svg", work);
  NBT_CHECK(exists(path), "%s written", path);
  snprintf(path, sizeof path, "%s/loss.svg", work);
  NBT_CHECK(!exists(path), "nothing written at %s", path);
  NBT_CHECK(chdir(cwd) == 0, "back to %s", cwd);
}

/* ---- periodic checkpoints ---------------------------------------------------- */

static int64_t ckpt_step(const char *path) {
  nb_st_file *f = nb_safetensors_load(path);
  const char *s = f ? nb_st_metadata(f, "step") : NULL;
  int64_t step = s ? strtoll(s, NULL, 10) : -1;
  nb_st_close(f);
  return step;
}

/* Every tensor of a equals b's (held-out history aside). */
static void same_tensors(const char *pa, const char *pb) {
  nb_st_file *a = nb_safetensors_load(pa), *b = nb_safetensors_load(pb);
  NBT_CHECK(a && b, "checkpoints %s and %s load: %s", pa, pb, nb_last_error());
  int n = a && b ? nb_st_count(a) : 0, same = n > 10 && nb_st_count(b) == n;
  for (int i = 0; i < n && same; i++) {
    const char *name = nb_st_name(a, i);
    if (!strncmp(name, "trainer.eval", 12)) continue;
    nb_tensor *ta = nb_st_tensor(a, name), *tb = nb_st_tensor(b, name);
    size_t bytes = ta ? (size_t)nb_numel(ta) * nb_dtype_size(nb_dtype_of(ta)) : 0;
    char *ba = malloc(bytes + 1), *bb = malloc(bytes + 1);
    same = ta && tb && nb_numel(ta) == nb_numel(tb) && nb_to_host(ta, ba, bytes) == NB_OK &&
           nb_to_host(tb, bb, bytes) == NB_OK && !memcmp(ba, bb, bytes);
    if (!same) printf("tensor %s differs\n", name);
    free(ba), free(bb);
    nb_release(ta), nb_release(tb);
  }
  NBT_CHECK(same, "%s and %s hold the same %d tensors", pa, pb, n);
  nb_st_close(a), nb_st_close(b);
}

/* A long run killed at some point leaves its last periodic checkpoint,
 * whole (written atomically), at a multiple of N; resumed, it continues as
 * an uninterrupted run would. */
static void test_save_every(void) {
  char ck[300], args[2048], p2[300], ref[300];
  snprintf(ck, sizeof ck, "%s/every.safetensors", dir);
  snprintf(args, sizeof args, "%s--steps 1000000 --eval-every 0 --save-every 5 --save %s", TINY, ck);
  child c = spawn(args, 0);
  NBT_CHECK(c.pid > 0, "started a long run");
  double t0 = (double)time(NULL);
  while (c.pid > 0 && !exists(ck) && time(NULL) - t0 < 120) usleep(20000);
  NBT_CHECK(exists(ck), "a periodic checkpoint appeared at %s", ck);
  usleep(300000); /* let it write a few more */
  if (c.pid > 0) kill(c.pid, SIGKILL);
  NBT_CHECK(c.pid > 0 && finish(c, NULL) == -1, "the run was killed");
  int64_t step = ckpt_step(ck);
  NBT_CHECK(step >= 5 && step % 5 == 0, "the checkpoint is whole, at step %lld (a multiple of 5)",
            (long long)step);
  if (step < 5) return;
  snprintf(p2, sizeof p2, "%s/every-resumed.safetensors", dir);
  snprintf(args, sizeof args, "train --device cpu --quiet --no-svg --resume %s --stop-at %lld --save %s",
           ck, (long long)step + 3, p2);
  int st = run(args);
  NBT_CHECK(st == 0, "resumed from the periodic checkpoint, exit %d:\n%s", st, out);
  snprintf(ref, sizeof ref, "%s/every-ref.safetensors", dir);
  snprintf(args, sizeof args, "%s--steps 1000000 --eval-every 0 --stop-at %lld --save %s", TINY,
           (long long)step + 3, ref);
  NBT_CHECK(run(args) == 0, "uninterrupted reference run:\n%s", out);
  same_tensors(ref, p2);
  /* not quiet: each periodic checkpoint is reported */
  snprintf(args, sizeof args, "train --device cpu --layers 1 --heads 2 --dim 32 --batch 8 --no-svg "
           "--steps 7 --save-every 3 --save %s/e2.safetensors", dir);
  NBT_CHECK(run(args) == 0 && strstr(out, "e2.safetensors (step 3)") &&
            strstr(out, "e2.safetensors (step 6)") && strstr(out, "e2.safetensors (step 7)"),
            "checkpoints at steps 3, 6 and 7 reported:\n%s", out);
}

/* ---- the terminal --------------------------------------------------------------- */

/* On a terminal the progress line is rewritten in place with \r; an
 * evaluation line must clear it first, not be appended to it. */
static void test_tty_eval(void) {
  char args[1024];
  snprintf(args, sizeof args, "train --device cpu --layers 1 --heads 2 --dim 32 --batch 8 "
           "--no-svg --steps 30 --eval-every 10");
  child c = spawn(args, 1);
  if (c.pid == 0) {
    printf("note: no pseudo-terminal (posix_openpt failed); the terminal case did not run\n");
    return;
  }
  NBT_CHECK(c.pid > 0 && c.fd >= 0, "started on a terminal");
  if (c.pid <= 0 || c.fd < 0) return;
  size_t n = 0;
  ssize_t got;
  while (n < sizeof out - 1 && ((got = read(c.fd, out + n, sizeof out - 1 - n)) > 0 || (got < 0 && errno == EINTR)))
    n += got > 0 ? (size_t)got : 0;
  out[n] = 0;
  close(c.fd);
  NBT_CHECK(finish(c, NULL) == 0, "run on a terminal exits 0");
  int evals = 0, clean = 0;
  for (const char *p = strstr(out, "eval step"); p; p = strstr(p + 1, "eval step")) {
    evals++;
    clean += (p - out >= 4 && !strncmp(p - 4, "\r\033[K", 4)) || (p > out && p[-1] == '\n');
  }
  NBT_CHECK(strstr(out, "\rstep ") != NULL, "progress written with \\r on a terminal");
  NBT_CHECK(evals == 2 && clean == evals, "%d of %d evaluation lines start a clean line:\n%s",
            clean, evals, out);
}

/* ---- --data ---------------------------------------------------------------------- */

static void write_text(const char *path, int64_t bytes) {
  FILE *f = fopen(path, "wb");
  static const char alpha[] = "etaoin shrdlu.\n";
  char line[4096];
  for (size_t i = 0; i < sizeof line; i++) line[i] = alpha[(i * 7 + i / 13) % (sizeof alpha - 1)];
  for (int64_t left = bytes; f && left > 0; left -= (int64_t)sizeof line)
    fwrite(line, 1, left < (int64_t)sizeof line ? (size_t)left : sizeof line, f);
  if (f) fclose(f);
}

static void test_data_limits(void) {
  char args[2048], path[300];
  /* an endless input: refused at the limit, not read until memory runs out */
  snprintf(args, sizeof args, "%s--data /dev/zero --max-data 1M", TINY);
  bad(args, "larger than 1048576 bytes");
  snprintf(path, sizeof path, "%s/small.txt", dir);
  write_text(path, 4096);
  snprintf(args, sizeof args, "%s--data %s --max-data 2K", TINY, path);
  bad(args, "--max-data");
  snprintf(args, sizeof args, "%s--data %s --max-data 2Q", TINY, path);
  bad(args, "--max-data");
  /* tokens take a byte each: 48 MiB more input, far less than 8 bytes each
   * more memory (it was 8: 384 MiB) */
  char big[300];
  snprintf(big, sizeof big, "%s/big.txt", dir);
  write_text(big, 48 << 20);
  long rss[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    snprintf(args, sizeof args, "%s--data %s --context 16 --steps 2 --eval-every 0", TINY,
             i ? big : path);
    child c = spawn(args, 0);
    NBT_CHECK(c.pid > 0 && finish(c, &rss[i]) == 0, "text run on %s", i ? big : path);
  }
  long more = (rss[1] - rss[0]) / 1024;
  NBT_CHECK(more < 2 * 48, "48 MiB more text costs %ld MiB more memory (peak %ld vs %ld MiB)", more,
            rss[1] / 1024, rss[0] / 1024);
  remove(big);
}

/* ---- checkpoint metadata --------------------------------------------------------- */

static const char *const meta_keys[] = {
    "format", "task", "digits", "vocab", "context", "layers", "heads", "dim", "batch",
    "accum", "steps", "warmup", "lr", "seed", "step", "data_rng_seed", "data_rng_offset",
    "precision"};
#define N_META (int)(sizeof meta_keys / sizeof *meta_keys)

/* Copies checkpoint src to dst with metadata key set to value. */
static int rewrite(const char *src, const char *dst, const char *key, const char *value) {
  nb_st_file *f = nb_safetensors_load(src);
  if (!f) return -1;
  int n = nb_st_count(f), rc;
  const char **names = calloc((size_t)n, sizeof *names), *vals[N_META];
  nb_tensor **ts = calloc((size_t)n, sizeof *ts);
  for (int i = 0; i < n; i++) names[i] = nb_st_name(f, i), ts[i] = nb_st_tensor(f, names[i]);
  for (int i = 0; i < N_META; i++)
    vals[i] = !strcmp(meta_keys[i], key) ? value : nb_st_metadata(f, meta_keys[i]);
  rc = nb_safetensors_save(dst, n, names, ts, N_META, meta_keys, vals) == NB_OK ? 0 : -1;
  for (int i = 0; i < n; i++) nb_release(ts[i]);
  free(names), free(ts);
  nb_st_close(f);
  return rc;
}

static void bad_meta(const char *base, const char *key, const char *value, const char *expect) {
  char path[300], args[1024];
  snprintf(path, sizeof path, "%s/meta-%s.safetensors", dir, key);
  NBT_CHECK(rewrite(base, path, key, value) == 0, "rewrote %s: %s", key, nb_last_error());
  snprintf(args, sizeof args, "train --device cpu --quiet --no-svg --resume %s", path);
  bad_early(args, expect);
}

static void test_metadata(void) {
  char base[300], args[1024];
  snprintf(base, sizeof base, "%s/base.safetensors", dir);
  snprintf(args, sizeof args, "%s--steps 6 --stop-at 2 --save %s", TINY, base);
  NBT_CHECK(run(args) == 0, "base checkpoint:\n%s", out);
  /* trained with NaN losses; failed late */
  bad_meta(base, "batch", "0", "metadata \"batch\" expects an integer in [1, ");
  bad_meta(base, "layers", "99999999999", "metadata \"layers\" expects an integer in [1, 256]");
  bad_meta(base, "lr", "nan", "metadata \"lr\" expects a number in (0, 10]");
  bad_meta(base, "accum", "-3", "metadata \"accum\"");
  bad_meta(base, "heads", "", "metadata \"heads\"");
  bad_meta(base, "step", "18446744073709551615", "metadata \"step\"");
  bad_meta(base, "precision", "fp8", "metadata \"precision\" expects one of f32|bf16|f16, got 'fp8'");
  bad_meta(base, "format", "nablaZZZZ-1",
           "not a nabla train checkpoint (format 'nablaZZZZ-1', expected 'nabla-gpt-1')\n");
  /* the checkpoint as written still resumes */
  snprintf(args, sizeof args, "train --device cpu --quiet --no-svg --resume %s", base);
  NBT_CHECK(run(args) == 0, "the unmodified checkpoint resumes:\n%s", out);
}

int main(void) {
  bin = getenv("NABLA_BIN");
  if (!bin || !*bin || access(bin, X_OK) != 0) {
    printf("FAIL: NABLA_BIN does not name the nabla binary (got '%s'); run through ctest\n", bin ? bin : "");
    return 1;
  }
  snprintf(TINY, sizeof TINY, "train --device cpu --layers 1 --heads 2 --dim 32 --batch 8 --quiet --no-svg ");
  if (!nbt_tmpdir(dir, sizeof dir, "train-io")) return 1;
  test_outputs_first();
  test_default_svg();
  test_save_every();
  test_tty_eval();
  test_data_limits();
  test_metadata();
  nbt_rmtree(dir);
  return nbt_finish();
}
