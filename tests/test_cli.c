/* The shared option parser of the nabla programs (tools/cli.c): both value
 * syntaxes, `--`, positional arguments, every value type and range, the
 * messages and exit status 2 of bad input, abbreviations refused, output
 * files checked, UTF-8; then every program (nabla train, bench, info, the
 * mnist example; NABLA_BIN, NABLA_MNIST_BIN) answering the same bad input
 * the same way and accepting --opt=value. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "testutil.h"

static char dir[256];
static char msg[4096]; /* what the last parse printed on stderr */

/* The options of a made-up command, reset before each parse. */
static struct {
  int quiet, verbose, n;
  int64_t big, size;
  uint64_t seed;
  double x, y;
  const char *name, *mode, *pos[3];
  unsigned set;
  int n_pos;
} v;

/* Parses the words of line (split at spaces) as argv[1..]; stderr goes
 * to msg. Returns the status. */
static int parse(const char *line) {
  static char buf[1024];
  char *argv[32] = {"prog"};
  int argc = 1;
  snprintf(buf, sizeof buf, "%s", line);
  for (char *t = strtok(buf, " "); t && argc < 31; t = strtok(NULL, " ")) argv[argc++] = t;
  memset(&v, 0, sizeof v);
  const cli_opt rows[] = {
      CLI_OPT_FLAG("quiet", 'q', &v.quiet),
      CLI_OPT_FLAG("verbose", 'v', &v.verbose),
      CLI_OPT_NUM(CLI_INT, "n", &v.n, -5, 100, 1),
      CLI_OPT_NUM(CLI_I64, "big", &v.big, 0, INT64_MAX, 2),
      CLI_OPT_NUM(CLI_SIZE, "size", &v.size, 1, INT64_MAX, 0),
      CLI_OPT_NUM(CLI_U64, "seed", &v.seed, 0, INT64_MAX, 0),
      CLI_OPT_REAL("x", &v.x, 0, 10, 1, 4),
      CLI_OPT_REAL("y", &v.y, -1, 1, 0, 0),
      CLI_OPT_STR("name", &v.name, 8),
      CLI_OPT_STR("named", &v.name, 0),
      CLI_OPT_CHOICE("mode", &v.mode, "fast|slow"),
  };
  cli_spec spec = {.prog = "prog", .opts = rows, .n_opts = sizeof rows / sizeof *rows,
                   .set = &v.set, .pos = v.pos, .max_pos = 3};
  char path[300];
  snprintf(path, sizeof path, "%s/stderr.txt", dir);
  fflush(stderr);
  int saved = dup(2);
  FILE *f = freopen(path, "w", stderr);
  int rc = cli_parse(&spec, argc, argv);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  (void)f;
  FILE *r = fopen(path, "r");
  size_t n = r ? fread(msg, 1, sizeof msg - 1, r) : 0;
  msg[n] = 0;
  if (r) fclose(r);
  v.n_pos = spec.n_pos;
  return rc;
}

static void ok(const char *line) {
  int rc = parse(line);
  NBT_CHECK(rc == 0 && !msg[0], "'%s' parses (%d): %s", line, rc, msg);
}

/* A bad line: status 2, one message naming the problem, then the hint. */
static void bad(const char *line, const char *expect) {
  int rc = parse(line);
  NBT_CHECK(rc == CLI_EXIT_USAGE, "'%s' gives 2, got %d", line, rc);
  NBT_CHECK(strstr(msg, expect) != NULL && !strncmp(msg, "prog: ", 6),
            "'%s': message names '%s': %s", line, expect, msg);
}

static void test_syntax(void) {
  ok("--n 7 --x 2.5 --name a");
  NBT_CHECK(v.n == 7 && v.x == 2.5 && !strcmp(v.name, "a") && v.set == (1 | 4 | 8),
            "values and set bits: %d %g %s %u", v.n, v.x, v.name, v.set);
  ok("--n=7 --x=2.5 --name=a=b");
  NBT_CHECK(v.n == 7 && v.x == 2.5 && !strcmp(v.name, "a=b"), "--opt=value: %d %g %s", v.n, v.x,
            v.name);
  ok("--named x");
  NBT_CHECK(!strcmp(v.name, "x") && v.set == 0, "an exact name that prefixes another: %s", v.name);
  ok("-qv");
  NBT_CHECK(v.quiet && v.verbose, "short flags together");
  ok("a --quiet -- --n c");
  NBT_CHECK(v.n_pos == 3 && !strcmp(v.pos[0], "a") && !strcmp(v.pos[1], "--n") &&
            !strcmp(v.pos[2], "c") && v.quiet && v.n == 0,
            "positional arguments in order, -- ends the options: %d", v.n_pos);
  ok("--name -");
  NBT_CHECK(!strcmp(v.name, "-"), "a value '-'");
  ok("-");
  NBT_CHECK(v.n_pos == 1 && !strcmp(v.pos[0], "-"), "'-' alone is positional");
  ok("--n -5 --big 9223372036854775807 --seed 0 --y -1 --y 1");
  NBT_CHECK(v.n == -5 && v.big == INT64_MAX && v.y == 1, "range ends accepted");
  ok("--size 3 --size 2K");
  NBT_CHECK(v.size == 2048, "--size 2K is 2048: %lld", (long long)v.size);
  ok("--size 5G");
  NBT_CHECK(v.size == (int64_t)5 << 30, "5G");
  ok("--mode slow");
  NBT_CHECK(!strcmp(v.mode, "slow"), "a choice");
}

static void test_errors(void) {
  bad("--bogus", "unknown option '--bogus'");
  bad("--bogus=3", "unknown option '--bogus=3'");
  bad("-z", "unknown option '-z'");
  bad("-qz", "unknown option '-z'");
  bad("--n", "--n needs a value");
  bad("--quiet=1", "--quiet takes no value (got '--quiet=1')");
  bad("--nam x", "unknown option '--nam'"); /* a prefix of two */
  bad("--ver", "unknown option '--ver' (did you mean --verbose?)");
  bad("a b c d", "unexpected argument 'd'");
  bad("--n 101", "--n expects an integer in [-5, 100], got '101'");
  bad("--n -6", "--n expects an integer in [-5, 100], got '-6'");
  bad("--n 1.5", "--n expects an integer");
  bad("--n=", "--n expects an integer");
  bad("--n 99999999999999999999", "--n expects an integer");
  bad("--big -1", "--big expects an integer in [0, 9223372036854775807]");
  bad("--seed -1", "--seed expects an integer");
  bad("--x 0", "--x expects a number in (0, 10], got '0'");
  bad("--x 10.5", "--x expects a number in (0, 10]");
  bad("--x nan", "--x expects a number");
  bad("--x inf", "--x expects a number");
  bad("--x 1e", "--x expects a number");
  bad("--y -1.5", "--y expects a number in [-1, 1]");
  bad("--size 1T", "--size expects a size in bytes");
  bad("--size 0", "--size expects a size in bytes");
  bad("--size 9000000000G", "--size expects a size in bytes");
  bad("--size -1K", "--size expects a size");
  bad("--mode medium", "--mode expects one of fast|slow, got 'medium'");
  parse("--bogus");
  NBT_CHECK(strstr(msg, "\n(prog --help lists the options)\n") != NULL, "the hint follows: %s", msg);
  /* a parse after a failed one starts afresh */
  ok("--n 3");
  NBT_CHECK(v.n == 3, "parse after an error");
}

/* The same check for values from elsewhere (checkpoint metadata). */
static void test_value(void) {
  int n = 0;
  cli_opt row = CLI_OPT_NUM(CLI_INT, "layers", &n, 1, 256, 0);
  fflush(stderr);
  int saved = dup(2);
  FILE *f = freopen("/dev/null", "w", stderr);
  (void)f;
  int a = cli_value("prog", &row, "metadata \"layers\"", "99999999999");
  int b = cli_value("prog", &row, NULL, "12");
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  NBT_CHECK(a == CLI_EXIT_USAGE && b == 0 && n == 12, "cli_value: %d %d %d", a, b, n);
  cli_opt rows[] = {CLI_OPT_FLAG("a", 0, &n), CLI_OPT_FLAG("b", 0, &n)};
  NBT_CHECK(cli_find(rows, 2, "b") == &rows[1] && !cli_find(rows, 2, "c"), "cli_find");
}

static int check_output(const char *path, char *why, size_t n) {
  char p[300];
  snprintf(p, sizeof p, "%s/stderr2.txt", dir);
  fflush(stderr);
  int saved = dup(2);
  FILE *f = freopen(p, "w", stderr);
  (void)f;
  int rc = cli_check_output("prog", "--out", path);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  FILE *r = fopen(p, "r");
  size_t k = r ? fread(why, 1, n - 1, r) : 0;
  why[k] = 0;
  if (r) fclose(r);
  return rc;
}

static void test_outputs(void) {
  char path[400], why[1024], file[300];
  snprintf(path, sizeof path, "%s/new.bin", dir);
  NBT_CHECK(check_output(path, why, sizeof why) == 0 && !why[0], "a new file in a directory: %s", why);
  NBT_CHECK(access(path, F_OK) != 0, "the check creates nothing");
  NBT_CHECK(check_output("relative.bin", why, sizeof why) == 0, "a file in the working directory: %s", why);
  snprintf(path, sizeof path, "%s/no/such/dir/x.bin", dir);
  NBT_CHECK(check_output(path, why, sizeof why) == 2 && strstr(why, "no such directory") &&
            strstr(why, "--out") && strstr(why, "no/such/dir'"),
            "missing directory: %s", why);
  NBT_CHECK(check_output(dir, why, sizeof why) == 2 && strstr(why, "is a directory"), "a directory: %s", why);
  snprintf(path, sizeof path, "%s/", dir);
  NBT_CHECK(check_output(path, why, sizeof why) == 2 && strstr(why, "is a directory"), "a trailing slash: %s", why);
  NBT_CHECK(check_output("", why, sizeof why) == 2 && strstr(why, "--out expects a file name"), "empty: %s", why);
  snprintf(file, sizeof file, "%s/plain", dir);
  FILE *f = fopen(file, "w");
  if (f) fclose(f);
  snprintf(path, sizeof path, "%s/plain/x.bin", dir);
  NBT_CHECK(check_output(path, why, sizeof why) == 2 && strstr(why, "not a directory"),
            "a file as the directory: %s", why);
  if (geteuid() != 0) { /* root writes anywhere */
    snprintf(path, sizeof path, "%s/ro", dir);
    mkdir(path, 0555);
    snprintf(path, sizeof path, "%s/ro/x.bin", dir);
    NBT_CHECK(check_output(path, why, sizeof why) == 2 && strstr(why, "not writable"),
              "a read-only directory: %s", why);
  }
}

static void test_utf8(void) {
  static const struct { const char *s; int valid; } cases[] = {
      {"plain/path.txt", 1}, {"caf\xc3\xa9", 1}, {"\xe2\x82\xac", 1}, {"\xf0\x9f\x98\x80", 1},
      {"\xf4\x8f\xbf\xbf", 1}, {"text\xff.txt", 0}, {"\xc3", 0}, {"\xc3(", 0}, {"\xc0\xaf", 0},
      {"\xe0\x80\xaf", 0}, {"\xed\xa0\x80", 0}, {"\xf4\x90\x80\x80", 0}, {"\x80", 0},
      {"\xf8\x88\x80\x80\x80", 0}, {"", 1}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    NBT_CHECK(cli_utf8_valid(cases[i].s) == cases[i].valid, "UTF-8 case %zu", i);
}

/* ---- every program the same way ------------------------------------------------ */

static char out[64 * 1024];

static int run(const char *bin, const char *args) { return nbt_run(bin, args, dir, out, sizeof out); }

static void same_rules(const char *bin, const char *prog, const char *valid) {
  char args[512], expect[256];
  int st = run(bin, "--bogus=1");
  snprintf(expect, sizeof expect, "%s: unknown option '--bogus=1'\n(%s --help lists the options)",
           prog, prog);
  NBT_CHECK(st == 2 && strstr(out, expect), "%s --bogus=1: exit 2 and '%s', got %d:\n%s", prog,
            expect, st, out);
  st = run(bin, "--help=yes");
  snprintf(expect, sizeof expect, "%s: --help takes no value", prog);
  NBT_CHECK(st == 2 && strstr(out, expect), "%s --help=yes: %d:\n%s", prog, st, out);
  st = run(bin, "-h");
  NBT_CHECK(st == 0 && strstr(out, "usage:"), "%s -h: %d:\n%s", prog, st, out);
  if (valid) {
    snprintf(args, sizeof args, "%s", valid);
    st = run(bin, args);
    NBT_CHECK(st == 0, "%s %s: exit 0, got %d:\n%s", prog, valid, st, out);
  }
}

static void test_programs(void) {
  const char *nabla = getenv("NABLA_BIN"), *mnist = getenv("NABLA_MNIST_BIN");
  char wrap[300];
  NBT_CHECK(nabla && *nabla && mnist && *mnist, "NABLA_BIN and NABLA_MNIST_BIN set (run through ctest)");
  if (!nabla || !*nabla || !mnist || !*mnist) return;
  /* `nabla CMD` through a small script, so that same_rules can pass its words */
  const char *cmds[3] = {"train", "bench", "info"};
  const char *valid[3] = {"--device=cpu --steps=2 --layers=1 --heads=1 --dim=8 --batch=4 --quiet --no-svg",
                          "--device=cpu --list --only=copy", NULL};
  for (int i = 0; i < 3; i++) {
    snprintf(wrap, sizeof wrap, "%s/nabla-%s.sh", dir, cmds[i]);
    FILE *f = fopen(wrap, "w");
    if (f) fprintf(f, "#!/bin/sh\nexec '%s' %s \"$@\"\n", nabla, cmds[i]), fclose(f);
    chmod(wrap, 0755);
    char prog[64];
    snprintf(prog, sizeof prog, "nabla %s", cmds[i]);
    same_rules(wrap, prog, valid[i]);
  }
  same_rules(mnist, "mnist", NULL);
  int st = run(mnist, "--epochs=2 --model=mlp --dir=/nonexistent");
  NBT_CHECK(st == 2 && strstr(out, "/nonexistent/train-images") && !strstr(out, "option"),
            "mnist --epochs=2 --model=mlp accepted (then the missing files named):\n%s", out);
  st = run(mnist, "--epochs=0 --dir=/nonexistent");
  NBT_CHECK(st == 2 && strstr(out, "mnist: --epochs expects an integer in [1, 1000], got '0'"),
            "mnist --epochs=0:\n%s", out);
  char args[600];
  snprintf(wrap, sizeof wrap, "%s/nabla-bench.sh", dir);
  snprintf(args, sizeof args, "--device cpu --list --json %s/no/such/b.json", dir);
  st = run(wrap, args);
  NBT_CHECK(st == 2 && strstr(out, "nabla bench: cannot write --json"), "bench checks --json first:\n%s", out);
  st = run(wrap, "--seconds=abc");
  NBT_CHECK(st == 2 && strstr(out, "nabla bench: --seconds expects a number"), "bench --seconds=abc:\n%s", out);
  st = run(wrap, "--warmup=-1");
  NBT_CHECK(st == 2 && strstr(out, "nabla bench: --warmup expects a number in [0, 3600], got '-1'"),
            "bench --warmup=-1:\n%s", out);
  /* --no-ceilings: the named case alone (sub-second at the quick CPU shapes),
   * the ceiling rows gone, the summary saying why; without it, both first */
  st = run(wrap, "--device=cpu --quick --only=add --no-ceilings --seconds=0.01 --warmup=0");
  NBT_CHECK(st == 0 && strstr(out, "\nadd ") && !strstr(out, "copy ceiling") && !strstr(out, "GEMM ceiling") &&
                strstr(out, "ceilings: not measured (--no-ceilings)"),
            "bench --only=add --no-ceilings:\n%s", out);
  st = run(wrap, "--device=cpu --quick --only=add --seconds=0.01 --warmup=0");
  NBT_CHECK(st == 0 && strstr(out, "copy ceiling") && strstr(out, "GEMM ceiling") && strstr(out, "\nadd ") &&
                strstr(out, "ceilings (this run): copy"),
            "bench --only=add:\n%s", out);
  /* the op table as markdown: one row per entry with its autocast class */
  snprintf(wrap, sizeof wrap, "%s/nabla-info.sh", dir);
  st = run(wrap, "--ops");
  NBT_CHECK(st == 0 && strstr(out, "| op | kind | autocast |") && strstr(out, "| softmax | row | f32 |") &&
                strstr(out, "| matmul | contract | low |"),
            "nabla info --ops lists the table:\n%s", out);
}

int main(void) {
  if (!nbt_tmpdir(dir, sizeof dir, "cli")) return 1;
  test_syntax();
  test_errors();
  test_value();
  test_outputs();
  test_utf8();
  test_programs();
  nbt_rmtree(dir);
  return nbt_finish();
}
