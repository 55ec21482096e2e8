/* The shared option parser of the nabla programs (see cli.h). */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CLI_POS 1        /* getopt_long's code for a positional argument ('-' mode) */
#define CLI_LONG 0x100   /* codes of long-only options: CLI_LONG + row */

static int cli_fail(const char *prog, const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "%s: ", prog);
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, "\n(%s --help lists the options)\n", prog);
  return CLI_EXIT_USAGE;
}

const cli_opt *cli_find(const cli_opt *opts, int n_opts, const char *name) {
  for (int i = 0; i < n_opts; i++)
    if (!strcmp(opts[i].name, name)) return &opts[i];
  return NULL;
}

/* ---- values ---------------------------------------------------------------- */

/* A whole decimal number with an optional binary-unit suffix (CLI_SIZE). */
static int cli_parse_int(const char *s, int units, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || errno || end == s) return -1;
  int shift = 0;
  if (units && *end) {
    const char *u = strchr("KMG", *end);
    if (!u || end[1]) return -1;
    shift = 10 * (int)(u - "KMG" + 1);
    end++;
  }
  if (*end) return -1;
  if (shift && (v < 0 || v > (LLONG_MAX >> shift))) return -1;
  *out = shift ? (int64_t)v * ((int64_t)1 << shift) : (int64_t)v;
  return 0;
}

static int cli_bad_int(const char *prog, const cli_opt *o, const char *what, const char *s) {
  fprintf(stderr, "%s: %s expects %s in [%lld, %lld], got '%s'\n", prog, what,
          o->type == CLI_SIZE ? "a size in bytes (suffix K, M or G allowed)" : "an integer",
          (long long)o->ilo, (long long)o->ihi, s);
  return CLI_EXIT_USAGE;
}

static int cli_choice(const char *prog, const cli_opt *o, const char *what, const char *s) {
  size_t n = strlen(s);
  for (const char *c = o->choices; *c;) {
    size_t len = strcspn(c, "|");
    if (len == n && !strncmp(c, s, n)) return *(const char **)o->dst = s, 0;
    c += len + (c[len] == '|');
  }
  fprintf(stderr, "%s: %s expects one of %s, got '%s'\n", prog, what, o->choices, s);
  return CLI_EXIT_USAGE;
}

int cli_value(const char *prog, const cli_opt *o, const char *what, const char *s) {
  char name[80];
  if (!what) snprintf(name, sizeof name, "--%s", o->name), what = name;
  int64_t v;
  switch (o->type) {
  case CLI_FLAG: *(int *)o->dst = 1; return 0;
  case CLI_STR: *(const char **)o->dst = s; return 0;
  case CLI_CHOICE: return cli_choice(prog, o, what, s);
  case CLI_INT: case CLI_I64: case CLI_U64: case CLI_SIZE:
    if (cli_parse_int(s, o->type == CLI_SIZE, &v) || v < o->ilo || v > o->ihi)
      return cli_bad_int(prog, o, what, s);
    if (o->type == CLI_INT) *(int *)o->dst = (int)v;
    else if (o->type == CLI_U64) *(uint64_t *)o->dst = (uint64_t)v;
    else *(int64_t *)o->dst = v;
    return 0;
  case CLI_REAL: {
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(d) || d > o->rhi || d < o->rlo ||
        (o->open_lo && d <= o->rlo)) {
      fprintf(stderr, "%s: %s expects a number in %c%g, %g], got '%s'\n", prog, what,
              o->open_lo ? '(' : '[', o->rlo, o->rhi, s);
      return CLI_EXIT_USAGE;
    }
    *(double *)o->dst = d;
    return 0;
  }
  }
  return CLI_EXIT_USAGE;
}

/* ---- argv ------------------------------------------------------------------- */

/* getopt_long's tables for the spec: long options and the short ones. */
static int cli_tables(const cli_spec *sp, struct option *lo, char *shorts) {
  char *s = shorts;
  *s++ = '-'; /* positional arguments in order, as code CLI_POS */
  *s++ = ':'; /* a missing value as ':' */
  for (int i = 0; i < sp->n_opts; i++) {
    const cli_opt *o = &sp->opts[i];
    lo[i] = (struct option){o->name, o->type == CLI_FLAG ? no_argument : required_argument, NULL,
                            CLI_LONG + i};
    if (o->short_name) {
      *s++ = (char)o->short_name;
      if (o->type != CLI_FLAG) *s++ = ':';
    }
  }
  lo[sp->n_opts] = (struct option){0, 0, 0, 0};
  *s = 0;
  return 0;
}

static int cli_row_of_short(const cli_spec *sp, int c) {
  for (int i = 0; i < sp->n_opts; i++)
    if (sp->opts[i].short_name == c) return i;
  return -1;
}

/* The argv element getopt_long just read an option from (ignoring an
 * attached or separate value). */
static const char *cli_elem(char **argv, int ind) {
  if (optarg && optarg == argv[ind - 1] && ind >= 2) return argv[ind - 2];
  return argv[ind - 1];
}

/* Handles what getopt_long returned; 1: go on, 0: a stored option, else an
 * exit status. */
static int cli_one(cli_spec *sp, int c, int argc, char **argv) {
  const char *elem = optind > 0 && optind <= argc ? cli_elem(argv, optind) : "";
  if (c == CLI_POS) {
    if (sp->n_pos >= sp->max_pos) return cli_fail(sp->prog, "unexpected argument '%s'%s", optarg, "");
    sp->pos[sp->n_pos++] = optarg;
    return 0;
  }
  if (c == '?' || c == ':') {
    char shown[3] = {'-', (char)optopt, 0};
    int is_short = optopt > 0 && optopt < CLI_LONG;
    if (c == ':') return cli_fail(sp->prog, "%s needs a value%s", is_short ? shown : elem, "");
    if (optopt >= CLI_LONG)
      return cli_fail(sp->prog, "--%s takes no value (got '%s')", sp->opts[optopt - CLI_LONG].name,
                      elem);
    return cli_fail(sp->prog, "unknown option '%s'%s", is_short ? shown : elem, "");
  }
  int row = c >= CLI_LONG ? c - CLI_LONG : cli_row_of_short(sp, c);
  if (row < 0) return cli_fail(sp->prog, "unknown option '%s'%s", elem, "");
  const cli_opt *o = &sp->opts[row];
  /* getopt_long takes unambiguous prefixes (--ste for --steps); accepting
   * them would let a later option change what a script means */
  if (c >= CLI_LONG) {
    size_t len = strcspn(elem, "=");
    char given[64];
    snprintf(given, sizeof given, "%.*s", (int)(len < 63 ? len : 63), elem);
    if (strncmp(given, "--", 2) || strcmp(given + 2, o->name))
      return cli_fail(sp->prog, "unknown option '%s' (did you mean --%s?)", given, o->name);
  }
  if (sp->set) *sp->set |= o->bit;
  return cli_value(sp->prog, o, NULL, optarg);
}

int cli_parse(cli_spec *sp, int argc, char **argv) {
  struct option *lo = calloc((size_t)sp->n_opts + 1, sizeof *lo);
  char *shorts = malloc(2 * (size_t)sp->n_opts + 3);
  char **args = calloc((size_t)argc + 1, sizeof *args);
  int rc = 0;
  if (!lo || !shorts || !args) {
    fprintf(stderr, "%s: out of memory\n", sp->prog);
    rc = 1;
  }
  sp->n_pos = 0;
  if (!rc) {
    cli_tables(sp, lo, shorts);
    memcpy(args, argv, sizeof *args * (size_t)argc);
    opterr = 0;
    optind = 0; /* glibc: a full re-initialisation, for a second parse */
    int c;
    while (!rc && (optarg = NULL, c = getopt_long(argc, args, shorts, lo, NULL)) != -1)
      rc = cli_one(sp, c, argc, args);
    /* after `--`, the rest are positional */
    for (; !rc && optind < argc; optind++) {
      optarg = args[optind];
      rc = cli_one(sp, CLI_POS, argc, args);
    }
  }
  free(lo), free(shorts), free(args);
  return rc;
}

/* ---- output files ------------------------------------------------------------ */

int cli_check_output(const char *prog, const char *opt, const char *path) {
  struct stat st;
  if (!*path) return cli_fail(prog, "%s expects a file name, got ''%s", opt, "");
  if (path[strlen(path) - 1] == '/' || (!stat(path, &st) && S_ISDIR(st.st_mode))) {
    fprintf(stderr, "%s: %s '%s' is a directory; expected a file name\n", prog, opt, path);
    return CLI_EXIT_USAGE;
  }
  /* the directory the file (or the temporary file renamed over it) goes in */
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  const char *why = NULL;
  if (!dir) why = strerror(ENOMEM);
  else if (stat(dir, &st)) why = errno == ENOENT ? "no such directory" : strerror(errno);
  else if (!S_ISDIR(st.st_mode)) why = "not a directory";
  else if (access(dir, W_OK | X_OK)) why = "the directory is not writable";
  if (why)
    fprintf(stderr, "%s: cannot write %s '%s': %s%s%s%s\n", prog, opt, path, dir ? "'" : "",
            dir ? dir : "", dir ? "': " : "", why);
  free(dir);
  return why ? CLI_EXIT_USAGE : 0;
}

int cli_utf8_valid(const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  while (*u) {
    int n = *u < 0x80 ? 0 : (*u & 0xE0) == 0xC0 ? 1 : (*u & 0xF0) == 0xE0 ? 2 : (*u & 0xF8) == 0xF0 ? 3 : -1;
    if (n < 0 || (n == 1 && *u < 0xC2) || (n == 3 && *u > 0xF4)) return 0;
    uint32_t cp = n ? *u & (0x3F >> n) : *u;
    for (int i = 1; i <= n; i++) {
      if ((u[i] & 0xC0) != 0x80) return 0;
      cp = cp << 6 | (u[i] & 0x3F);
    }
    /* overlong forms, surrogates, beyond U+10FFFF */
    if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return 0;
    u += n + 1;
  }
  return 1;
}
