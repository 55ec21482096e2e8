/* The kernel profiler (backend/profile.c, nb_profile_* in nabla.h) on the CPU:
 * misuse gets a clear error; a forward and backward pass is counted per
 * kernel and phase (a matmul forward, its two backward matmuls); each
 * kernel's time lies within the host time of the call that ran it; the
 * report lists the kernels; nothing is counted after stop; reset forgets;
 * a paused profile times nothing and stops its wall clock. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

static void test_misuse(void) {
  nb_profile_reset();
  NBT_CHECK(nb_profile_stop() == NB_ERR_VALUE && strstr(nb_last_error(), "nb_profile_stop"),
            "stop without a profile: %s", nb_last_error());
  NBT_CHECK(nb_profile_report(stdout) == NB_ERR_VALUE, "report before any profile");
  NBT_CHECK(nb_profile_start() == NB_OK && nb_profile_running(), "start");
  NBT_CHECK(nb_profile_start() == NB_ERR_VALUE && strstr(nb_last_error(), "already running"),
            "start twice: %s", nb_last_error());
  NBT_CHECK(nb_profile_report(stdout) == NB_ERR_VALUE, "report while running");
  NBT_CHECK(nb_profile_stop() == NB_OK && !nb_profile_running(), "stop");
  NBT_CHECK(nb_profile_report(NULL) == NB_ERR_NULL, "report to NULL");
  nb_clear_error();
}

static void test_counts(void) {
  nb_scope_begin();
  nb_tensor *x = nbt_randn(1, 2, (int64_t[]){96, 80}, NB_F32);
  nb_tensor *w = nbt_randn(2, 2, (int64_t[]){80, 64}, NB_F32);
  nb_set_requires_grad(x, 1);
  nb_set_requires_grad(w, 1);
  NBT_CHECK(nb_profile_start() == NB_OK, "start");
  double t0 = now_ms();
  nb_tensor *y = nb_matmul(x, w);
  double t1 = now_ms();
  nb_tensor *loss = nb_sum(nb_tanh(y), 0, NULL, 0);
  NBT_CHECK(loss && nb_backward(loss, NULL) == NB_OK, "backward: %s", nb_last_error());
  NBT_CHECK(nb_profile_stop() == NB_OK, "stop");
  int64_t calls;
  double ms;
  NBT_CHECK(nb_profile_stat("matmul", 0, &calls, &ms) && calls == 1, "one forward matmul (%lld)",
            (long long)calls);
  NBT_CHECK(ms >= 0 && ms <= t1 - t0, "its time %.4f ms within the call's %.4f ms", ms, t1 - t0);
  NBT_CHECK(nb_profile_stat("matmul", 1, &calls, &ms) && calls == 2, "two backward matmuls (%lld)",
            (long long)calls);
  NBT_CHECK(nb_profile_stat("tanh", 0, &calls, &ms) && calls == 1, "one forward tanh");
  NBT_CHECK(!nb_profile_stat("tanh", 1, &calls, &ms) && calls == 0 && ms == 0,
            "no tanh kernel in backward (its rule uses the saved output)");
  NBT_CHECK(!nb_profile_stat("no such kernel", 0, &calls, &ms), "unknown name");
  FILE *f = tmpfile();
  NBT_CHECK(f && nb_profile_report(f) == NB_OK, "report");
  char text[4096] = "";
  if (f) {
    rewind(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
  }
  NBT_CHECK(strstr(text, "profile: ") && strstr(text, "matmul") && strstr(text, " bwd ") &&
                strstr(text, " fwd ") && strstr(text, "wall clock"),
            "report lists kernels and phases:\n%s", text);
  /* after stop nothing is counted */
  nb_matmul(x, w);
  NBT_CHECK(nb_profile_stat("matmul", 0, &calls, &ms) && calls == 1, "stopped: not counted");
  nb_profile_reset();
  NBT_CHECK(!nb_profile_stat("matmul", 0, &calls, &ms), "reset forgets");
  nb_scope_end();
}

/* A kernel that fails while profiled keeps its own error, and is not counted. */
static void test_failing_kernel(void) {
  nb_scope_begin();
  nb_tensor *x = nbt_randn(3, 2, (int64_t[]){4, 3}, NB_F32);
  int64_t bad[2] = {0, 7};
  nb_tensor *idx = nb_from_buffer(bad, 1, (int64_t[]){2}, NB_I64, NB_DEVICE_CPU);
  NBT_CHECK(nb_profile_start() == NB_OK, "start");
  nb_tensor *y = nb_index_select(x, 0, idx);
  const char *err = nb_last_error();
  NBT_CHECK(!y && nb_last_status() == NB_ERR_INDEX && strstr(err, "7"),
            "out-of-range index while profiling: its own error (%s)", err);
  nb_clear_error();
  NBT_CHECK(nb_profile_stop() == NB_OK, "stop");
  int64_t calls;
  double ms;
  NBT_CHECK(!nb_profile_stat("index_select", 0, &calls, &ms), "the failed kernel is not counted");
  nb_scope_end();
}

/* A paused profile times nothing and its wall clock stops. */
static void test_pause(void) {
  nbt_check_error("pause without a profile", nb_profile_pause(1) != NB_OK, NB_ERR_VALUE,
                  "nb_profile_pause", NULL);
  nb_scope_begin();
  nb_tensor *a = nbt_randn(5, 2, (int64_t[]){64, 64}, NB_F32);
  NBT_CHECK(nb_profile_start() == NB_OK, "start");
  nbt_check_error("resume a running profile", nb_profile_pause(0) != NB_OK, NB_ERR_VALUE,
                  "already running", NULL);
  nb_matmul(a, a);
  NBT_CHECK(nb_profile_pause(1) == NB_OK, "pause");
  nbt_check_error("pause twice", nb_profile_pause(1) != NB_OK, NB_ERR_VALUE, "already paused", NULL);
  nb_tanh(a);
  nb_matmul(a, a);
  for (double t0 = now_ms(); now_ms() - t0 < 50;) {
  } /* 50 ms paused: not in the wall clock */
  NBT_CHECK(nb_profile_pause(0) == NB_OK, "resume");
  nb_exp(a);
  NBT_CHECK(nb_profile_stop() == NB_OK, "stop");
  int64_t calls;
  double ms;
  NBT_CHECK(nb_profile_stat("matmul", 0, &calls, &ms) && calls == 1, "the paused matmul is not counted (%lld)",
            (long long)calls);
  NBT_CHECK(!nb_profile_stat("tanh", 0, &calls, &ms), "the paused tanh is not counted");
  NBT_CHECK(nb_profile_stat("exp", 0, &calls, &ms) && calls == 1, "after resuming: counted");
  char buf[4096] = "";
  FILE *f = tmpfile();
  NBT_CHECK(f && nb_profile_report(f) == NB_OK, "report");
  if (f) {
    rewind(f);
    buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
    fclose(f);
  }
  double wall = -1;
  const char *w = strstr(buf, "ms in kernels, ");
  if (w) wall = atof(w + strlen("ms in kernels, "));
  NBT_CHECK(wall >= 0 && wall < 40, "wall clock without the 50 ms pause: %g ms", wall);
  nb_profile_reset();
  nb_scope_end();
}

int main(void) {
  test_misuse();
  test_counts();
  test_failing_kernel();
  test_pause();
  nb_profile_reset();
  return nbt_finish();
}
