/* Token files in llm.c's format: the reader (nb_tokens_open) on files
 * written here byte by byte (valid, empty, a directory, shorter than the
 * header, wrong magic or version, truncated, longer, a token beyond the
 * vocabulary), each error's message checked; then `nabla train --tokens`
 * through the built binary (NABLA_BIN): a tiny run whose loss falls, the
 * GPT-2 preset with overridden sizes, --val-tokens, bad files and options
 * (exit 2 with the message), and a resumed run equal to an uninterrupted
 * one bit for bit. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static char dir[256];

/* The path of name in the test's directory (four at a time stay valid). */
static const char *file(const char *name) {
  static char paths[4][300];
  static int next;
  char *p = paths[next++ % 4];
  snprintf(p, sizeof paths[0], "%s/%s", dir, name);
  return p;
}

static void put32(FILE *f, int32_t v) {
  uint32_t u = (uint32_t)v;
  unsigned char b[4] = {u & 255, u >> 8 & 255, u >> 16 & 255, u >> 24};
  fwrite(b, 1, 4, f);
}

/* Writes name: the header (magic, version, count), then n tokens
 * little-endian, then `extra` zero bytes. Returns the path. */
static const char *write_tokens(const char *name, int32_t magic, int32_t version, int32_t count,
                                const uint16_t *tok, int64_t n, int extra) {
  const char *p = file(name);
  FILE *f = fopen(p, "wb");
  if (!f) return p;
  put32(f, magic);
  put32(f, version);
  put32(f, count);
  for (int i = 3; i < 256; i++) put32(f, 0);
  for (int64_t i = 0; i < n; i++) {
    unsigned char b[2] = {tok[i] & 255, tok[i] >> 8};
    fwrite(b, 1, 2, f);
  }
  for (int i = 0; i < extra; i++) fputc(0, f);
  fclose(f);
  return p;
}

static const char *write_valid(const char *name, const uint16_t *tok, int64_t n) {
  return write_tokens(name, NB_TOKENS_MAGIC, NB_TOKENS_VERSION, (int32_t)n, tok, n, 0);
}

/* nb_tokens_open(p, vocab) fails with NB_ERR_IO and a message holding the
 * file's path and each given part. */
static void open_fails(const char *what, const char *p, int64_t vocab, const char *part1,
                       const char *part2) {
  nb_clear_error();
  nb_tokens *t = nb_tokens_open(p, vocab);
  nbt_check_error(what, t == NULL, NB_ERR_IO, p, part1, part2, (const char *)NULL);
  nb_tokens_close(t);
}

static void test_reader_valid(void) {
  uint16_t tok[6] = {0, 1, 255, 256, 0x1234, 65535};
  const char *p = write_valid("valid.bin", tok, 6);
  nb_tokens *t = nb_tokens_open(p, 0);
  NBT_CHECK(t && nb_tokens_count(t) == 6, "6 tokens read: %s", nb_last_error());
  const uint16_t *d = nb_tokens_data(t);
  for (int i = 0; d && i < 6; i++)
    NBT_CHECK(d[i] == tok[i], "token %d: %u, want %u (little-endian)", i, d[i], tok[i]);
  nb_tokens_close(t);
  /* the largest id is allowed by a vocabulary one above it */
  t = nb_tokens_open(p, 65536);
  NBT_CHECK(t != NULL, "vocabulary 65536 holds id 65535: %s", nb_last_error());
  nb_tokens_close(t);
  /* a header with no tokens is a valid (empty) token file */
  t = nb_tokens_open(write_valid("none.bin", tok, 0), 50257);
  NBT_CHECK(t && nb_tokens_count(t) == 0, "zero tokens: %s", nb_last_error());
  nb_tokens_close(t);
  nb_tokens_close(NULL);
  NBT_CHECK(nb_tokens_count(NULL) == 0 && nb_tokens_data(NULL) == NULL, "NULL reads as empty");
  nb_clear_error();
  nbt_check_error("NULL path", nb_tokens_open(NULL, 0) == NULL, NB_ERR_NULL, "path",
                  (const char *)NULL);
}

static void test_reader_errors(void) {
  uint16_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  open_fails("wrong magic", write_tokens("magic.bin", 20240521, 1, 8, tok, 8, 0), 0,
             "magic 20240521, expected 20240520", NULL);
  open_fails("wrong version", write_tokens("version.bin", NB_TOKENS_MAGIC, 2, 8, tok, 8, 0), 0,
             "version 2, expected 1", NULL);
  open_fails("truncated", write_tokens("short.bin", NB_TOKENS_MAGIC, 1, 9, tok, 8, 0), 0,
             "is 1040 bytes, but its header says 9 tokens: expected 1042 bytes", "truncated");
  open_fails("longer", write_tokens("long.bin", NB_TOKENS_MAGIC, 1, 8, tok, 8, 1), 0,
             "is 1041 bytes, but its header says 8 tokens: expected 1040 bytes",
             "longer than the header says");
  open_fails("negative count", write_tokens("neg.bin", NB_TOKENS_MAGIC, 1, -1, tok, 0, 0), 0,
             "token count -1", "expected >= 0");
  open_fails("beyond the vocabulary", write_valid("oov.bin", tok, 8), 8,
             "token 7 is 8, beyond the vocabulary of 8", "expected ids 0..7");
  FILE *f = fopen(file("empty.bin"), "wb");
  if (f) fclose(f);
  open_fails("empty", file("empty.bin"), 0, "is empty (0 bytes)", "expected a 1024-byte header");
  f = fopen(file("tiny.bin"), "wb");
  if (f) fputs("0123456789", f), fclose(f);
  open_fails("shorter than the header", file("tiny.bin"), 0, "is shorter than the header (10 bytes)",
             "magic 20240520, version 1");
  open_fails("a directory", dir, 0, "is a directory", NULL);
  open_fails("missing", file("missing.bin"), 0, "cannot open", "No such file");
}

/* ---- nabla train --tokens --------------------------------------------------- */

static const char *bin;
static char out[64 * 1024];
static char TINY[300];

static int run(const char *args) { return nbt_run(bin, args, dir, out, sizeof out); }

static void bad(const char *args, const char *expect) {
  int st = run(args);
  NBT_CHECK(st == 2, "'%s' exits 2, got %d:\n%s", args, st, out);
  NBT_CHECK(strstr(out, expect) != NULL, "'%s' names '%s' in:\n%s", args, expect, out);
  NBT_CHECK(!strstr(out, "throughput"), "'%s' trains nothing:\n%s", args, out);
}

/* A sequence a small model learns quickly: an arithmetic pattern over 40
 * ids with 10% of the tokens replaced at random. */
static void write_train_files(void) {
  enum { N = 20000 };
  static uint16_t tok[N];
  uint64_t s = 1;
  for (int i = 0; i < N; i++) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    tok[i] = (uint16_t)((s >> 33) % 10 == 0 ? (s >> 40) % 40 : (uint64_t)i * 7 % 40);
  }
  write_valid("train.bin", tok, N);
  write_valid("val.bin", tok, 3000);
  write_valid("small.bin", tok, 20);
  tok[100] = 45;
  write_valid("oov-train.bin", tok, 200);
}

static void test_train_run(void) {
  char args[2048];
  snprintf(args, sizeof args, "%s --steps 60 --lr 3e-3 --tokens %s --vocab-size 40", TINY,
           file("train.bin"));
  int st = run(args);
  NBT_CHECK(st == 0, "token run exits 0, got %d:\n%s", st, out);
  double first = 0, last = 0, held = 0;
  const char *p = strstr(out, "\nloss ");
  NBT_CHECK(p && sscanf(p, "\nloss %lf -> %lf", &first, &last) == 2, "loss line in:\n%s", out);
  NBT_CHECK(isfinite(first) && isfinite(last) && last < first - 0.3, "loss falls: %g -> %g", first,
            last);
  /* the padded vocabulary's 64 logits start near uniform */
  NBT_CHECK(fabs(first - log(64.0)) < 0.3, "first loss %g near ln 64", first);
  p = strstr(out, "held-out loss: ");
  NBT_CHECK(p && sscanf(p, "held-out loss: %lf", &held) == 1 && isfinite(held) && held < first,
            "held-out loss %g reported, below %g:\n%s", held, first, out);
  NBT_CHECK(strstr(out, "ids below 40); held out: its last 2000 tokens"), "task line:\n%s", out);
  NBT_CHECK(strstr(out, "vocab 40 (padded to 64)"), "padded vocabulary:\n%s", out);
  NBT_CHECK(!strstr(out, "accuracy") && !strstr(out, "sample"), "no accuracy or sample:\n%s", out);
  /* the CPU allocator keeps no peak figure: no memory line */
  NBT_CHECK(!strstr(out, "peak"), "no peak memory on the CPU:\n%s", out);

  snprintf(args, sizeof args,
           "train --device cpu --quiet --no-svg --model gpt2 --layers 1 --dim 32 --heads 2 "
           "--context 16 --batch 2 --steps 3 --vocab-size 40 --tokens %s --val-tokens %s",
           file("train.bin"), file("val.bin"));
  st = run(args);
  NBT_CHECK(st == 0, "gpt2 preset run exits 0, got %d:\n%s", st, out);
  NBT_CHECK(strstr(out, "model: GPT-2 small preset, 1 layers, 2 heads, dim 32, context 16"),
            "preset with overrides:\n%s", out);
  NBT_CHECK(strstr(out, "val.bin (3000 tokens)"), "held-out file named:\n%s", out);
  NBT_CHECK(strstr(out, "lr 0.0006"), "the preset's learning rate:\n%s", out);
  p = strstr(out, "held-out loss: ");
  NBT_CHECK(p && sscanf(p, "held-out loss: %lf", &held) == 1 && isfinite(held),
            "finite held-out loss:\n%s", out);
  /* the preset's own sizes (without running it) */
  bad("train --model gpt2 --tokens /nonexistent-token-file", "cannot open");
}

static void test_train_bad(void) {
  char args[2048];
  struct {
    const char *file, *expect;
  } files[] = {
      {"magic.bin", "magic 20240521, expected 20240520"},
      {"version.bin", "version 2, expected 1"},
      {"short.bin", "the file is truncated"},
      {"oov-train.bin", "token 100 is 45, beyond the vocabulary of 40"},
      {"empty.bin", "is empty (0 bytes)"},
      {"missing.bin", "cannot open"},
  };
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    snprintf(args, sizeof args, "%s --steps 2 --vocab-size 40 --tokens %s", TINY, file(files[i].file));
    bad(args, files[i].expect);
    snprintf(args, sizeof args, "%s --steps 2 --vocab-size 40 --tokens %s --val-tokens %s", TINY,
             file("train.bin"), file(files[i].file));
    bad(args, "--val-tokens: token file");
  }
  snprintf(args, sizeof args, "%s --steps 2 --vocab-size 40 --tokens %s", TINY, dir);
  bad(args, "is a directory");
  snprintf(args, sizeof args, "%s --steps 2 --tokens %s --vocab-size 40", TINY, file("small.bin"));
  bad(args, "has 20 tokens; --context 64 needs at least 130");
  snprintf(args, sizeof args, "%s --steps 2 --context 32 --tokens %s --val-tokens %s --vocab-size 40",
           TINY, file("train.bin"), file("small.bin"));
  bad(args, "--val-tokens '");
  bad("train --model gpt3", "--model");
  bad("train --model gpt2", "--model needs --tokens FILE");
  bad("train --val-tokens x.bin", "--val-tokens needs --tokens FILE");
  bad("train --vocab-size 40", "--vocab-size needs --tokens FILE");
  bad("train --tokens x.bin --vocab-size 1", "--vocab-size");
  bad("train --tokens x.bin --vocab-size 65537", "--vocab-size");
  bad("train --tokens x.bin --data y.txt", "--data and --tokens both given");
}

/* Every tensor of checkpoint a equals b's bit for bit (f32 and i64 values
 * are exact in f64), but the held-out history: a run that stops early
 * evaluates at its last step too. Returns the number compared, -1 if not
 * the same. */
static int same_tensors(const char *a, const char *b) {
  nb_st_file *fa = nb_safetensors_load(a), *fb = nb_safetensors_load(b);
  int n = fa && fb ? 0 : -1;
  for (int i = 0; n >= 0 && i < nb_st_count(fa); i++) {
    const char *name = nb_st_name(fa, i);
    if (!strncmp(name, "trainer.eval", 12)) continue;
    nb_tensor *ta = nb_st_tensor(fa, name), *tb = nb_st_tensor(fb, name);
    double *da = ta ? nbt_f64(ta) : NULL, *db = tb ? nbt_f64(tb) : NULL;
    int same = da && db && nb_numel(ta) == nb_numel(tb) &&
               !memcmp(da, db, sizeof(double) * (size_t)nb_numel(ta));
    if (!same) printf("tensor %s differs\n", name);
    n = same ? n + 1 : -1;
    free(da), free(db);
    nb_release(ta), nb_release(tb);
  }
  if (fa) nb_st_close(fa);
  if (fb) nb_st_close(fb);
  return n;
}

/* 3 steps, a checkpoint, 3 more from it: the same checkpoint as 6 steps. */
static void test_train_resume(void) {
  char args[2048], full[320], half[320], resumed[320];
  snprintf(full, sizeof full, "%s", file("full.st"));
  snprintf(half, sizeof half, "%s", file("half.st"));
  snprintf(resumed, sizeof resumed, "%s", file("resumed.st"));
  const char *common = "--steps 6 --context 16 --vocab-size 40 --eval-every 2";
  snprintf(args, sizeof args, "%s %s --tokens %s --save %s", TINY, common, file("train.bin"), full);
  NBT_CHECK(run(args) == 0, "6 steps:\n%s", out);
  snprintf(args, sizeof args, "%s %s --tokens %s --stop-at 3 --save %s", TINY, common,
           file("train.bin"), half);
  NBT_CHECK(run(args) == 0, "3 steps:\n%s", out);
  /* the token file and vocabulary come from the checkpoint */
  snprintf(args, sizeof args, "%s --eval-every 2 --resume %s --save %s", TINY, half, resumed);
  NBT_CHECK(run(args) == 0, "resumed:\n%s", out);
  NBT_CHECK(strstr(out, "task: tokens, ") && strstr(out, "train.bin"), "file from the checkpoint:\n%s",
            out);
  int n = same_tensors(full, resumed);
  NBT_CHECK(n > 30, "the resumed run's parameters, moments and losses equal the uninterrupted "
            "run's bit for bit (%d tensors)", n);
  snprintf(args, sizeof args, "%s --resume %s --vocab-size 41", TINY, half);
  bad(args, "--vocab-size 41 disagrees with the checkpoint");
  snprintf(args, sizeof args, "%s --resume %s --data %s", TINY, half, file("train.bin"));
  bad(args, "the checkpoint is of token files, but --data was given");
}

int main(void) {
  if (!nbt_tmpdir(dir, sizeof dir, "tokens")) return 1;
  test_reader_valid();
  test_reader_errors();
  bin = getenv("NABLA_BIN");
  if (!bin || !*bin || access(bin, X_OK) != 0) {
    printf("FAIL: NABLA_BIN does not name the nabla binary (got '%s'); run through ctest\n",
           bin ? bin : "");
    nbt_failed++;
  } else {
    snprintf(TINY, sizeof TINY,
             "train --device cpu --layers 1 --heads 2 --dim 32 --batch 8 --quiet --no-svg");
    write_train_files();
    test_train_run();
    test_train_bad();
    test_train_resume();
  }
  nbt_rmtree(dir);
  return nbt_finish();
}
