/* Autotuning cache (backend/autotune.c): keys and shape classes, picking
 * with a fake timer, the cache file's round trip and its bad forms, tuning
 * off, forcing a candidate by name, and the CPU GEMM's tuned blocking
 * against a float64 reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/autotune.h"
#include "testutil.h"

static char g_path[256];

/* Fake timer: candidate i takes times[i] seconds; counts calls. */
typedef struct {
  const double *times;
  int calls;
} fake;

static double fake_time(void *ctx, int i) {
  fake *f = ctx;
  f->calls++;
  return f->times[i];
}

static void write_file(const char *text) {
  FILE *f = fopen(g_path, "w");
  fputs(text, f);
  fclose(f);
}

static void test_keys(void) {
  char buf[128];
  NBT_CHECK(nb_tune_pow2(0) == 1 && nb_tune_pow2(1) == 1 && nb_tune_pow2(3) == 4 &&
                nb_tune_pow2(64) == 64 && nb_tune_pow2(257) == 512, "pow2");
  const char *k = nb_tune_key(buf, sizeof buf, "cpu", "matmul", "f32", "rr", 3,
                              (int64_t[]){257, 129, 300});
  NBT_CHECK(k && strcmp(k, "cpu/matmul/f32/rr/512x256x512") == 0, "key %s", k ? k : "(null)");
  char other[128];
  nb_tune_key(other, sizeof other, "cpu", "matmul", "f32", "rr", 3, (int64_t[]){300, 200, 260});
  NBT_CHECK(strcmp(k, other) == 0, "one shape class");
  NBT_CHECK(!nb_tune_key(buf, 8, "cpu", "matmul", "f32", "rr", 1, (int64_t[]){1}), "too long");
  NBT_CHECK(!nb_tune_key(buf, sizeof buf, NULL, "matmul", "f32", "rr", 0, NULL), "NULL device");
  nb_tune_key(buf, sizeof buf, "my dev\t1", "op", "f32", "x", 0, NULL);
  NBT_CHECK(!strchr(buf, '\t') && !strchr(buf, ' '), "no tabs or spaces in a key: %s", buf);
}

static void test_pick(void) {
  unsetenv("NABLA_AUTOTUNE");
  nb_tune_reset();
  fake f = {(const double[]){3, 1, 2}, 0};
  NBT_CHECK(nb_tune_pick("k/off", 3, NULL, fake_time, &f, 2) == 2 && f.calls == 0,
            "tuning off: heuristic, no timing (%d calls)", f.calls);
  NBT_CHECK(nb_tune_pick(NULL, 3, NULL, fake_time, &f, 1) == 1, "NULL key: heuristic");
  NBT_CHECK(!nb_tune_active(), "off and nothing cached: not active");
  NBT_CHECK(nb_tune_pick("k", 0, NULL, fake_time, &f, 1) == 0, "no candidates: 0");
  NBT_CHECK(nb_tune_pick("k/h", 3, NULL, fake_time, &f, 7) == 0, "heuristic out of range: 0");
  setenv("NABLA_AUTOTUNE", "1", 1);
  nb_tune_reset();
  NBT_CHECK(nb_tune_active() && nb_tune_enabled(), "on: active");
  NBT_CHECK(nb_tune_pick("k/a", 3, NULL, fake_time, &f, 0) == 1 && f.calls > 0, "fastest");
  f.calls = 0;
  NBT_CHECK(nb_tune_pick("k/a", 3, NULL, fake_time, &f, 0) == 1 && f.calls == 0, "cached");
  fake g = {(const double[]){-1, 5, -1, 4}, 0};
  NBT_CHECK(nb_tune_pick("k/b", 4, NULL, fake_time, &g, 0) == 3, "negative skipped");
  fake h = {(const double[]){-1, -1}, 0};
  NBT_CHECK(nb_tune_pick("k/c", 2, NULL, fake_time, &h, 1) == 1, "all negative: heuristic");
  NBT_CHECK(nb_tune_pick("k/d", 2, NULL, NULL, NULL, 1) == 1, "no timer: heuristic");
  nb_tune_force(2);
  NBT_CHECK(nb_tune_pick("k/a", 3, NULL, fake_time, &f, 0) == 2, "forced");
  NBT_CHECK(nb_tune_pick("k/a", 2, NULL, fake_time, &f, 1) == 1, "forced out of range");
  nb_tune_force(-1);
}

/* A timer whose every run is 3% slower than the one before (a GPU whose
 * clock falls as it warms), recording the order of the candidates run. */
typedef struct {
  const double *base;
  int calls;
  int order[64];
} drift;

static double drift_time(void *ctx, int i) {
  drift *d = ctx;
  if (d->calls < 64) d->order[d->calls] = i;
  double t = d->base[i] < 0 ? -1 : d->base[i] * (1.0 + 0.03 * d->calls);
  d->calls++;
  return t;
}

/* Candidates are timed in rounds (a warm-up of each, then one run of each
 * per round), so a drifting clock does not favour the first: run one after
 * another, candidate 0 (base 1.00, runs 1-3 of 8) would beat candidate 1
 * (base 0.95, runs 5-7). A candidate that fails is dropped from the rounds. */
static void test_rounds(void) {
  setenv("NABLA_AUTOTUNE", "1", 1);
  nb_tune_reset();
  drift d = {(const double[]){1.00, 0.95}, 0, {0}};
  NBT_CHECK(nb_tune_pick("r/a", 2, NULL, drift_time, &d, 0) == 1, "drift: the faster candidate");
  int want[] = {0, 1, 0, 1, 0, 1, 0, 1};
  NBT_CHECK(d.calls == 8 && memcmp(d.order, want, sizeof want) == 0, "rounds: %d runs, order %d %d %d %d ...",
            d.calls, d.order[0], d.order[1], d.order[2], d.order[3]);
  drift e = {(const double[]){2.0, -1, 1.5}, 0, {0}};
  NBT_CHECK(nb_tune_pick("r/b", 3, NULL, drift_time, &e, 0) == 2 && e.calls == 9,
            "a failing candidate: run once, skipped (%d runs)", e.calls);
  unsetenv("NABLA_AUTOTUNE");
  nb_tune_reset();
}

/* NABLA_AUTOTUNE_SAMPLE_US: microseconds of launches per timing sample. */
static void test_sample(void) {
  const struct { const char *env; double s; } cases[] = {
      {NULL, 1e-3}, {"", 1e-3}, {"250", 250e-6}, {"0", 0.0}, {"-5", 1e-3}, {"2ms", 1e-3},
      {"nan", 1e-3}, {"1e9", 1e-3}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    if (cases[i].env) setenv("NABLA_AUTOTUNE_SAMPLE_US", cases[i].env, 1);
    else unsetenv("NABLA_AUTOTUNE_SAMPLE_US");
    double s = nb_tune_sample_seconds();
    NBT_CHECK(fabs(s - cases[i].s) <= 1e-12, "NABLA_AUTOTUNE_SAMPLE_US=%s: %g s, expected %g",
              cases[i].env ? cases[i].env : "(unset)", s, cases[i].s);
  }
  unsetenv("NABLA_AUTOTUNE_SAMPLE_US");
}

static void test_file(void) {
  remove(g_path);
  setenv("NABLA_AUTOTUNE", "1", 1);
  nb_tune_reset();
  fake f = {(const double[]){3, 2, 1}, 0};
  const char *names[] = {"x", "y", "z"};
  NBT_CHECK(nb_tune_pick("f/a", 3, names, fake_time, &f, 0) == 2, "tuned");
  FILE *fp = fopen(g_path, "r");
  char line[128] = "";
  NBT_CHECK(fp && fgets(line, sizeof line, fp) && strncmp(line, "nabla-autotune", 14) == 0, "header");
  NBT_CHECK(fp && fgets(line, sizeof line, fp) && strcmp(line, "f/a\t2\tz\n") == 0, "line %s", line);
  if (fp) fclose(fp);
  /* round trip: a fresh table reads the choice, tuning off, no timing */
  unsetenv("NABLA_AUTOTUNE");
  nb_tune_reset();
  f.calls = 0;
  NBT_CHECK(nb_tune_pick("f/a", 3, names, fake_time, &f, 0) == 2 && f.calls == 0, "reloaded");
  NBT_CHECK(nb_tune_active() && !nb_tune_enabled(), "off with a cached choice: active");
  NBT_CHECK(nb_tune_pick("f/a", 2, names, fake_time, &f, 1) == 1, "index out of range ignored");
  const char *bad[] = {"garbage\n", "nabla-autotune 999\nf/a\t2\tz\n",
                       "nabla-autotune 1\nf/a\tnotanumber\tz\n", "nabla-autotune 1\nno tab\n", ""};
  for (int i = 0; i < 5; i++) {
    write_file(bad[i]);
    nb_tune_reset();
    NBT_CHECK(nb_tune_pick("f/a", 3, names, fake_time, &f, 1) == 1 && f.calls == 0,
              "bad file %d ignored", i);
  }
  /* a repeated header (two first writers) and a repeated key (the later wins) */
  write_file("nabla-autotune 1\nf/c\t0\tx\nnabla-autotune 1\nf/c\t1\ty\n");
  nb_tune_reset();
  NBT_CHECK(nb_tune_pick("f/c", 3, names, fake_time, &f, 2) == 1 && f.calls == 0,
            "repeated header and key");
  /* a choice is its name's candidate (a list that gained candidates keeps it); a name no
   * longer listed is no choice; a line without a name goes by its index */
  write_file("nabla-autotune 1\nf/d\t0\ty\nf/e\t1\tgone\nf/g\t2\t\nf/h\t1\nf/i\t7\n"
             "f/j\t0\tz\r\nf/k\t0\ty\textra\n"
             "f/l\t1\tyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\n");
  nb_tune_reset();
  NBT_CHECK(nb_tune_pick("f/d", 3, names, fake_time, &f, 2) == 1 && f.calls == 0, "by name, not index 0");
  NBT_CHECK(nb_tune_pick("f/e", 3, names, fake_time, &f, 2) == 2 && f.calls == 0, "unknown name: heuristic");
  NBT_CHECK(nb_tune_pick("f/g", 3, names, fake_time, &f, 0) == 2 && f.calls == 0, "empty name: index");
  NBT_CHECK(nb_tune_pick("f/h", 3, names, fake_time, &f, 0) == 1 && f.calls == 0, "no name field: index");
  NBT_CHECK(nb_tune_pick("f/i", 3, names, fake_time, &f, 1) == 1 && f.calls == 0,
            "no name, index out of range: heuristic");
  NBT_CHECK(nb_tune_pick("f/j", 3, names, fake_time, &f, 1) == 2 && f.calls == 0, "a CRLF line's name");
  NBT_CHECK(nb_tune_pick("f/k", 3, names, fake_time, &f, 0) == 1 && f.calls == 0, "a further field");
  NBT_CHECK(nb_tune_pick("f/l", 3, names, fake_time, &f, 0) == 0 && f.calls == 0,
            "an over-long name: no choice, not index 1");
  /* a new choice replaces an ignored file */
  write_file("garbage\n");
  setenv("NABLA_AUTOTUNE", "1", 1);
  nb_tune_reset();
  NBT_CHECK(nb_tune_pick("f/b", 3, names, fake_time, &f, 0) == 2, "tuned over a bad file");
  unsetenv("NABLA_AUTOTUNE");
  nb_tune_reset();
  f.calls = 0;
  NBT_CHECK(nb_tune_pick("f/b", 3, names, fake_time, &f, 0) == 2 && f.calls == 0,
            "the replaced file reads back");
  /* an unwritable path: tuning still works, nothing crashes */
  setenv("NABLA_AUTOTUNE_CACHE", "/nonexistent-dir/x/autotune.txt", 1);
  setenv("NABLA_AUTOTUNE", "1", 1);
  nb_tune_reset();
  NBT_CHECK(nb_tune_pick("f/a", 3, names, fake_time, &f, 0) == 2, "unwritable cache");
  setenv("NABLA_AUTOTUNE_CACHE", g_path, 1);
  unsetenv("NABLA_AUTOTUNE");
  remove(g_path);
  nb_tune_reset();
}

/* NABLA_AUTOTUNE_FORCE=NAME: a kernel with a candidate of that name runs
 * it, with no timing and nothing cached, even with tuning on; a kernel
 * without one (or with no names) goes on as before; nb_tune_force wins; an
 * over-long name is ignored. */
static void test_force_name(void) {
  remove(g_path);
  const char *names[] = {"a", "b", "c"}, *others[] = {"x", "y", "z"};
  fake f = {(const double[]){3, 2, 1}, 0};
  unsetenv("NABLA_AUTOTUNE");
  setenv("NABLA_AUTOTUNE_FORCE", "b", 1);
  nb_tune_reset();
  NBT_CHECK(nb_tune_forced_name() && strcmp(nb_tune_forced_name(), "b") == 0, "forced name read");
  NBT_CHECK(nb_tune_active(), "a forced name makes picks active");
  NBT_CHECK(nb_tune_pick("n/a", 3, names, fake_time, &f, 0) == 1 && f.calls == 0, "forced by name");
  NBT_CHECK(nb_tune_pick("n/a", 3, others, fake_time, &f, 2) == 2, "no such name: heuristic");
  NBT_CHECK(nb_tune_pick("n/a", 3, NULL, fake_time, &f, 2) == 2, "no names: heuristic");
  setenv("NABLA_AUTOTUNE", "1", 1);
  nb_tune_reset();
  NBT_CHECK(nb_tune_pick("n/b", 3, names, fake_time, &f, 0) == 1 && f.calls == 0,
            "forced by name with tuning on: no timing");
  NBT_CHECK(nb_tune_pick("n/b", 3, others, fake_time, &f, 0) == 2 && f.calls > 0,
            "tuning on, no such name: tuned");
  FILE *fp = fopen(g_path, "r");
  char line[128];
  int forced_cached = 0;
  while (fp && fgets(line, sizeof line, fp)) forced_cached |= strncmp(line, "n/b	1", 5) == 0;
  if (fp) fclose(fp);
  NBT_CHECK(!forced_cached, "a forced choice is not cached");
  nb_tune_force(0);
  NBT_CHECK(nb_tune_pick("n/b", 3, names, fake_time, &f, 2) == 0, "nb_tune_force wins");
  nb_tune_force(-1);
  setenv("NABLA_AUTOTUNE_FORCE", "a-name-longer-than-any-candidate-name-could-be-in-nabla-at-all-x", 1);
  nb_tune_reset();
  NBT_CHECK(!nb_tune_forced_name(), "over-long name ignored");
  unsetenv("NABLA_AUTOTUNE_FORCE");
  unsetenv("NABLA_AUTOTUNE");
  remove(g_path); /* the tuned n/b line would make picks active */
  nb_tune_reset();
  NBT_CHECK(!nb_tune_forced_name() && !nb_tune_active(), "unset: nothing forced");
}

/* out = a @ b^T-view in f64 from the same values, for a float64 reference. */
static double *ref_product(const double *a, const double *bt, int64_t M, int64_t N, int64_t K) {
  double *r = malloc((size_t)(M * N) * sizeof *r);
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += a[i * K + k] * bt[j * K + k];
      r[i * N + j] = s;
    }
  return r;
}

static void test_gemm(nb_dtype dt) {
  const int64_t M = 257, N = 129, K = 300;
  double rtol = dt == NB_F64 ? 1e-12 : 1e-4, atol = dt == NB_F64 ? 1e-12 : 1e-4;
  nb_scope_begin();
  nb_tensor *a = nbt_randn(11, 2, (int64_t[]){M, K}, dt);
  nb_tensor *bt = nbt_randn(12, 2, (int64_t[]){N, K}, dt); /* b = bt^T: a transposed view */
  nb_tensor *b = nb_transpose(bt, 0, 1);
  double *av = nbt_f64(a), *bv = nbt_f64(bt), *ref = ref_product(av, bv, M, N, K);
  unsetenv("NABLA_AUTOTUNE");
  nb_tune_reset();
  double *plain = nbt_f64(nb_matmul(a, b));
  nbt_check_close("untuned", nb_matmul(a, b), ref, rtol, atol);
  setenv("NABLA_AUTOTUNE", "1", 1);
  nb_tune_reset();
  nb_tensor *tuned = nb_matmul(a, b);
  nbt_check_close("tuned vs f64", tuned, ref, rtol, atol);
  nbt_check_close("tuned vs untuned", tuned, plain, rtol, atol);
  FILE *fp = fopen(g_path, "r");
  char line[256] = "";
  int found = 0;
  while (fp && fgets(line, sizeof line, fp)) found |= strstr(line, "/matmul/") != NULL;
  if (fp) fclose(fp);
  NBT_CHECK(found, "the GEMM's choice is in the cache file (%s)", nb_dtype_name(dt));
  for (int i = 0; i < 5; i++) {
    nb_tune_force(i);
    char name[32];
    snprintf(name, sizeof name, "forced config %d", i);
    nbt_check_close(name, nb_matmul(a, b), ref, rtol, atol);
  }
  nb_tune_force(-1);
  unsetenv("NABLA_AUTOTUNE");
  free(av);
  free(bv);
  free(ref);
  free(plain);
  nb_scope_end();
}

int main(void) {
  snprintf(g_path, sizeof g_path, "/tmp/nabla-autotune-test-%ld.txt", (long)getpid());
  setenv("NABLA_AUTOTUNE_CACHE", g_path, 1);
  test_keys();
  test_pick();
  test_rounds();
  test_sample();
  test_file();
  test_force_name();
  test_gemm(NB_F32);
  test_gemm(NB_F64);
  remove(g_path);
  nb_tune_reset();
  return nbt_finish();
}
