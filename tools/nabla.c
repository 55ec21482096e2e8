/* The `nabla` command: subcommand dispatch (train, bench, info, help). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cli.h"
#include "nabla.h"
#include "tool.h"

#define NB_TOOL_VERSION "0.1.0"

double tool_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint32_t tool_rand_u32(nb_rng *rng) {
  uint32_t out[4];
  nb_philox4x32(rng->seed, rng->offset++, out);
  return out[0];
}

uint64_t tool_rand_below(nb_rng *rng, uint64_t n) {
  uint32_t out[4];
  nb_philox4x32(rng->seed, rng->offset++, out);
  uint64_t r = ((uint64_t)out[0] << 32) | out[1];
  return r % n;
}

double tool_rand_unit(nb_rng *rng) {
  uint32_t out[4];
  nb_philox4x32(rng->seed, rng->offset++, out);
  return (double)((((uint64_t)out[0] << 32) | out[1]) >> 11) * 0x1.0p-53;
}

static void tool_usage(FILE *f) {
  fprintf(f,
          "usage: nabla <command> [options]\n"
          "\n"
          "commands:\n"
          "  train   train a GPT-style transformer (default: a built-in addition task;\n"
          "          --data FILE for a character-level model of any text file)\n"
          "  bench   run the kernel benchmarks\n"
          "  info    print the version, devices and build configuration\n"
          "  help    print this message (nabla help train: the trainer's options)\n");
}

/* The op table as a markdown table: name, kind, precision class, inputs,
 * outputs, gradient, benchmark entry, determinism. */
static void tool_info_ops(void) {
  printf("| op | kind | autocast | in | out | gradient | bench | determinism |\n");
  printf("|---|---|---|--:|--:|---|---|---|\n");
  for (int i = 0; i < nb_op_table_size(); i++) {
    nb_op_info o;
    if (nb_op_table_info(i, &o)) continue;
    printf("| %s | %s | %s | %d | %d | %s | %s | %s |\n", o.name, o.kind, o.precision, o.n_inputs,
           o.n_outputs, o.differentiable ? "yes" : "-", o.has_benchmark ? "yes" : "-",
           o.determinism ? o.determinism : "same bits");
  }
}

int nb_tool_info(int argc, char **argv) {
  int help = 0, ops = 0;
  const cli_opt rows[] = {CLI_OPT_FLAG("ops", 0, &ops), CLI_OPT_FLAG("help", 'h', &help)};
  cli_spec spec = {.prog = "nabla info", .opts = rows, .n_opts = 2};
  int rc = cli_parse(&spec, argc, argv);
  if (rc || help) {
    if (help)
      printf("usage: nabla info [--ops]\n\nPrints the version, devices and build configuration;\n"
             "--ops: the op table instead (kind, autocast class, gradient, benchmark entry,\n"
             "determinism of every primitive op), as markdown.\n");
    return rc;
  }
  if (ops) {
    tool_info_ops();
    return 0;
  }
  printf("nabla %s\n", NB_TOOL_VERSION);
#ifdef _OPENMP
  printf("cpu: %d OpenMP threads\n", omp_get_max_threads());
#else
  printf("cpu: 1 thread (built without OpenMP)\n");
#endif
  int n = nb_cuda_available();
  printf("cuda devices: %d\n", n);
  for (int i = 0; i < n; i++) {
    nb_cuda_info d;
    if (nb_cuda_device_info(i, &d) == NB_OK)
      printf("  cuda:%d  %s, sm_%d%d, %d SMs at %d MHz, %.1f GiB; peak %.0f TFLOP/s bf16/f16, "
             "%.1f f32\n", i, d.name, d.cc_major, d.cc_minor, d.n_sm, d.clock_mhz,
             d.memory_bytes / 1073741824.0, d.peak_flops_low / 1e12, d.peak_flops_f32 / 1e12);
  }
  printf("deterministic kernels: %s\n", nb_deterministic() ? "on" : "off");
  printf("dtypes:");
  for (int d = 0; d < NB_DTYPE_COUNT; d++) printf(" %s", nb_dtype_name((nb_dtype)d));
  printf("\n");
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    tool_usage(stderr);
    return NB_TOOL_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "train")) return nb_tool_train(argc - 1, argv + 1);
  if (!strcmp(cmd, "bench")) return nb_tool_bench(argc - 1, argv + 1);
  if (!strcmp(cmd, "info")) return nb_tool_info(argc - 1, argv + 1);
  if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    if (argc > 2 && !strcmp(argv[2], "train")) {
      char *targv[] = {"train", "--help", NULL};
      return nb_tool_train(2, targv);
    }
    tool_usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version")) {
    printf("nabla %s\n", NB_TOOL_VERSION);
    return 0;
  }
  fprintf(stderr, "nabla: unknown command '%s'\n\n", cmd);
  tool_usage(stderr);
  return NB_TOOL_EXIT_USAGE;
}
