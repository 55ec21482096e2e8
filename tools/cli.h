/* The command line of every nabla program (nabla train, nabla bench, the
 * mnist example): one option parser on getopt_long, so that each accepts
 * `--opt value`, `--opt=value`, `--` (the end of the options) and the same
 * short flags, and reports a bad option the same way: the program, the
 * option, what was expected and what was given, then exit status 2.
 *
 * Options are a table of cli_opt, one row per option; numbers are checked
 * against the row's range, and the same check serves values read from
 * elsewhere (a checkpoint's metadata) through cli_value. Output files are
 * checked before any work starts (cli_check_output). */
#ifndef NB_TOOL_CLI_H
#define NB_TOOL_CLI_H

#include <stdint.h>

#define CLI_EXIT_USAGE 2

typedef enum {
  CLI_FLAG,   /* no value; sets *(int *)dst = 1 */
  CLI_STR,    /* *(const char **)dst = the value (argv's own storage) */
  CLI_CHOICE, /* a string, one of `choices` ("mlp|cnn|both") */
  CLI_INT,    /* *(int *)dst, a whole decimal number in [ilo, ihi] */
  CLI_I64,    /* *(int64_t *)dst, in [ilo, ihi] */
  CLI_U64,    /* *(uint64_t *)dst, in [ilo, ihi] (ilo >= 0) */
  CLI_REAL,   /* *(double *)dst, finite, in [rlo, rhi], or (rlo, rhi] with open_lo */
  CLI_SIZE    /* *(int64_t *)dst, bytes: a whole number with an optional K, M or G
                 (binary units), in [ilo, ihi] */
} cli_type;

typedef struct {
  const char *name; /* without the dashes: "steps" is --steps */
  int short_name;   /* 'q' for -q, or 0 */
  cli_type type;
  void *dst;
  int64_t ilo, ihi;
  double rlo, rhi;
  int open_lo;
  const char *choices;
  unsigned bit; /* or'ed into *set (cli_parse's argument) when given */
} cli_opt;

/* Rows of a table: a flag, a string, a whole number of type t (CLI_INT,
 * CLI_I64, CLI_U64, CLI_SIZE) in [lo, hi], a real number in [lo, hi] (or
 * (lo, hi] with open_lo), a choice; bit as in cli_opt. */
#define CLI_OPT_FLAG(n, s, p) {.name = (n), .short_name = (s), .type = CLI_FLAG, .dst = (p)}
#define CLI_OPT_STR(n, p, b) {.name = (n), .type = CLI_STR, .dst = (p), .bit = (b)}
#define CLI_OPT_NUM(t, n, p, lo, hi, b) \
  {.name = (n), .type = (t), .dst = (p), .ilo = (lo), .ihi = (hi), .bit = (b)}
#define CLI_OPT_REAL(n, p, lo, hi, open, b) \
  {.name = (n), .type = CLI_REAL, .dst = (p), .rlo = (lo), .rhi = (hi), .open_lo = (open), .bit = (b)}
#define CLI_OPT_CHOICE(n, p, list) {.name = (n), .type = CLI_CHOICE, .dst = (p), .choices = (list)}

/* The command: its name for messages ("nabla train"), its options, and
 * where positional arguments go (at most max_pos of them; none if 0). */
typedef struct {
  const char *prog;
  const cli_opt *opts;
  int n_opts;
  unsigned *set;
  const char **pos;
  int max_pos, n_pos;
} cli_spec;

/* Parses argv[1..argc) (argv[0] is the command's name). Returns 0, or
 * CLI_EXIT_USAGE after printing one line naming the problem and a hint.
 * argv is not modified. */
int cli_parse(cli_spec *spec, int argc, char **argv);

/* Checks and stores one value of opt given as text s; `what` names the
 * value's source in the message (NULL: "--name"). Returns 0 or
 * CLI_EXIT_USAGE after a message. */
int cli_value(const char *prog, const cli_opt *opt, const char *what, const char *s);

/* The row of `name` in a table, or NULL. */
const cli_opt *cli_find(const cli_opt *opts, int n_opts, const char *name);

/* An output file the program will write at the end (or periodically):
 * refused now, with the reason, if its directory does not exist or is not
 * writable, or the path is a directory. Returns 0 or CLI_EXIT_USAGE. */
int cli_check_output(const char *prog, const char *opt, const char *path);

/* 1 if s is valid UTF-8 (what JSON, and so safetensors metadata, holds). */
int cli_utf8_valid(const char *s);

#endif
