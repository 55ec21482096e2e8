/* The MNIST example end to end (NABLA_MNIST_BIN, set by the test
 * environment): small synthetic IDX files whose classes are simple patterns
 * plus noise, on which the MLP and the CNN must both learn; and malformed
 * files, which must be refused with status 2 and a clear message. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define SIDE 12
#define CLASSES 10

static const char *bin;
static char dir[256];
static char out[64 * 1024];

static int run(const char *args) { return nbt_run(bin, args, dir, out, sizeof out); }

static void put_be32(FILE *f, uint32_t v) {
  unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                        (unsigned char)(v >> 8), (unsigned char)v};
  fwrite(b, 1, 4, f);
}

/* Writes an IDX file: magic 0x0000 08 ndim, sizes, then n_data bytes. */
static void write_idx(const char *name, uint32_t magic, int ndim, const uint32_t *dims,
                      const unsigned char *data, size_t n_data) {
  char path[300];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return;
  put_be32(f, magic);
  for (int i = 0; i < ndim; i++) put_be32(f, dims[i]);
  if (n_data) fwrite(data, 1, n_data, f); /* data may be NULL for an empty file body */
  fclose(f);
}

/* Class k: a bright bar, horizontal at row k+1 for k < 5, vertical at
 * column 2k-9 otherwise... all distinct, plus uniform noise. */
static void make_set(const char *prefix, int n, uint64_t seed) {
  unsigned char *img = malloc((size_t)n * SIDE * SIDE), *lab = malloc((size_t)n);
  nb_rng rng = nb_rng_new(seed);
  for (int i = 0; i < n; i++) {
    uint32_t r[4];
    nb_philox4x32(rng.seed, rng.offset++, r);
    int k = (int)(r[0] % CLASSES);
    lab[i] = (unsigned char)k;
    for (int p = 0; p < SIDE * SIDE; p++) {
      uint32_t q[4];
      nb_philox4x32(rng.seed, rng.offset++, q);
      int y = p / SIDE, x = p % SIDE;
      int on = k < 5 ? (y == 2 * k + 1 || y == 2 * k + 2) : (x == 2 * (k - 5) + 1 || x == 2 * (k - 5) + 2);
      img[(size_t)i * SIDE * SIDE + p] = (unsigned char)((on ? 170 : 0) + q[0] % 80);
    }
  }
  char name[64];
  snprintf(name, sizeof name, "%s-images", prefix);
  write_idx(name, 0x803, 3, (uint32_t[]){(uint32_t)n, SIDE, SIDE}, img, (size_t)n * SIDE * SIDE);
  snprintf(name, sizeof name, "%s-labels", prefix);
  write_idx(name, 0x801, 1, (uint32_t[]){(uint32_t)n}, lab, (size_t)n);
  free(img);
  free(lab);
}

static double accuracy_of(const char *model) {
  char key[64];
  double acc = -1;
  snprintf(key, sizeof key, "%s test accuracy: ", model);
  const char *p = strstr(out, key);
  if (p) sscanf(p + strlen(key), "%lf", &acc);
  return acc;
}

static void test_learns(void) {
  char args[2048];
  snprintf(args, sizeof args, "--epochs 4 --batch 16 --lr 3e-3 %s/train-images %s/train-labels "
           "%s/test-images %s/test-labels", dir, dir, dir, dir);
  int st = run(args);
  NBT_CHECK(st == 0, "mnist exits 0, got %d:\n%s", st, out);
  double mlp = accuracy_of("mlp"), cnn = accuracy_of("cnn");
  NBT_CHECK(mlp >= 90, "MLP test accuracy %.2f%% >= 90%%:\n%s", mlp, out);
  NBT_CHECK(cnn >= 90, "CNN test accuracy %.2f%% >= 90%%:\n%s", cnn, out);
}

static void bad(const char *args, const char *expect) {
  int st = run(args);
  NBT_CHECK(st == 2, "'%s' exits 2, got %d:\n%s", args, st, out);
  NBT_CHECK(strstr(out, expect) != NULL, "'%s' names '%s' in:\n%s", args, expect, out);
}

/* Runs the example with one of the four files replaced by `name`. */
static void bad_file(int slot, const char *name, const char *expect) {
  const char *files[4] = {"train-images", "train-labels", "test-images", "test-labels"};
  char args[2048], p[4][300];
  for (int i = 0; i < 4; i++) snprintf(p[i], sizeof p[i], "%s/%s", dir, i == slot ? name : files[i]);
  snprintf(args, sizeof args, "--model mlp %s %s %s %s", p[0], p[1], p[2], p[3]);
  bad(args, expect);
}

static void test_bad_files(void) {
  unsigned char bytes[SIDE * SIDE * 3] = {0}, labels[5] = {0, 1, 2, 3, 4}, big[3] = {1, 2, 11};
  write_idx("wrong-magic", 0x802, 3, (uint32_t[]){3, SIDE, SIDE}, bytes, sizeof bytes);
  write_idx("truncated", 0x803, 3, (uint32_t[]){4, SIDE, SIDE}, bytes, sizeof bytes);
  write_idx("five-labels", 0x801, 1, (uint32_t[]){5}, labels, sizeof labels);
  write_idx("big-label", 0x801, 1, (uint32_t[]){3}, big, sizeof big);
  write_idx("three-images", 0x803, 3, (uint32_t[]){3, SIDE, SIDE}, bytes, sizeof bytes);
  write_idx("other-size", 0x803, 3, (uint32_t[]){1, SIDE, SIDE * 3}, bytes, sizeof bytes);
  write_idx("empty", 0, 0, NULL, NULL, 0);
  bad_file(0, "wrong-magic", "magic");
  bad_file(2, "truncated", "size");
  bad_file(1, "five-labels", "5 labels for");
  bad_file(1, "does-not-exist", "does-not-exist");
  bad_file(3, "train-images", "magic"); /* images where labels belong */
  bad_file(0, "empty", "magic");
  /* labels above 9 */
  char args[2048];
  snprintf(args, sizeof args, "--model mlp %s/three-images %s/big-label %s/test-images "
           "%s/test-labels", dir, dir, dir, dir);
  bad(args, "label 11");
  write_idx("one-label", 0x801, 1, (uint32_t[]){1}, labels, 1);
  snprintf(args, sizeof args, "--model mlp %s/train-images %s/train-labels %s/other-size "
           "%s/one-label", dir, dir, dir, dir);
  bad(args, "12x36");
  /* sizes whose product overflows 64 bits: 4 x 2147549185 x 2147418113 =
   * 2^64 + 4, which wrapped to the file's 4 bytes of data and was taken
   * (then the library refused the model: exit 1; under UBSan an abort) */
  unsigned char four[4] = {0, 1, 2, 3};
  write_idx("overflow-images", 0x803, 3, (uint32_t[]){4, 2147549185u, 2147418113u}, four, 4);
  write_idx("four-labels", 0x801, 1, (uint32_t[]){4}, four, 4);
  snprintf(args, sizeof args, "--model mlp %s/overflow-images %s/four-labels %s/overflow-images "
           "%s/four-labels", dir, dir, dir, dir);
  bad(args, "size mismatch: the header says 4 x 2147549185 x 2147418113 = more than the file has");
  bad("--model rnn --dir /nonexistent", "rnn");
  bad("--epochs zero --dir /nonexistent", "--epochs");
  bad("--bogus 1 --dir /nonexistent", "--bogus");
  bad("--epochs=zero --dir=/nonexistent", "--epochs expects an integer");
  bad("--dir /nonexistent a", "not both");
}

int main(void) {
  bin = getenv("NABLA_MNIST_BIN");
  if (!bin || !*bin || access(bin, X_OK) != 0) {
    /* ctest sets it; a missing binary must not pass as a skipped test */
    printf("FAIL: NABLA_MNIST_BIN does not name the mnist example (got '%s'); run through ctest\n", bin ? bin : "");
    return 1;
  }
  if (!nbt_tmpdir(dir, sizeof dir, "mnist")) return 1;
  make_set("train", 600, 1);
  make_set("test", 200, 2);
  test_bad_files();
  test_learns();
  nbt_rmtree(dir);
  return nbt_finish();
}
