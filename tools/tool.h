/* Shared declarations of the `nabla` command's subcommands and helpers.
 * Each subcommand takes the arguments after its name (argv[0] is the
 * subcommand's name) and returns the process exit status: 0 on success,
 * 1 when the library failed at run time, 2 for bad command-line input. */
#ifndef NB_TOOL_H
#define NB_TOOL_H

#include <stdint.h>

#include "nabla.h"

#define NB_TOOL_EXIT_RUNTIME 1
#define NB_TOOL_EXIT_USAGE 2

int nb_tool_train(int argc, char **argv);
int nb_tool_bench(int argc, char **argv);
int nb_tool_info(int argc, char **argv);

/* Writes a loss curve as a standalone SVG: the per-step training loss (raw
 * and smoothed) and, if n_eval > 0, held-out losses at the given steps.
 * Returns 0, or -1 with errno set when the file cannot be written. */
int tool_svg_loss(const char *path, const char *title, const float *train_loss,
                  int64_t n_steps, const int64_t *eval_step, const float *eval_loss,
                  int n_eval);

/* Seconds from a monotonic clock. */
double tool_now(void);

/* Host-side random numbers from the library's Philox stream: each call uses
 * the block at (rng->seed, rng->offset) and advances offset by one, so the
 * pair (seed, offset) is the whole state a checkpoint needs. */
uint32_t tool_rand_u32(nb_rng *rng);
/* Uniform in [0, n), n >= 1 (64 random bits, so the modulo bias is
 * negligible for any n a tool uses). */
uint64_t tool_rand_below(nb_rng *rng, uint64_t n);
/* Uniform in [0, 1). */
double tool_rand_unit(nb_rng *rng);

#endif
