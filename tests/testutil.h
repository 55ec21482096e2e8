/* Test helpers shared by every tests/test_*.c program: checks with counts,
 * tensors to float64 arrays, and a finite-difference gradient checker. */
#ifndef NB_TESTUTIL_H
#define NB_TESTUTIL_H
#include <stdio.h>

#include "nabla.h"

extern int nbt_passed, nbt_failed;

/* Records one check; prints the message when it fails. */
#define NBT_CHECK(cond, ...)                                         \
  do {                                                               \
    if (cond) nbt_passed++;                                          \
    else {                                                           \
      nbt_failed++;                                                  \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);                    \
      printf(__VA_ARGS__);                                           \
      printf("\n");                                                  \
    }                                                                \
  } while (0)

/* Prints "N passed, M failed" and returns the exit status. */
int nbt_finish(void);

/* Random normal tensor (seeded), any dtype, on the CPU. */
nb_tensor *nbt_randn(uint64_t seed, int ndim, const int64_t *shape, nb_dtype dt);
/* Row-major float64 copy of any tensor (malloc'd; caller frees). */
double *nbt_f64(const nb_tensor *t);
/* Max over elements of |a-b| / (atol + rtol*|b|); <= 1 means close. NaNs
 * must match positions. */
double nbt_close_ratio(const double *a, const double *b, int64_t n, double rtol, double atol);
/* Checks tensor t against reference ref (row-major), reporting name. */
int nbt_check_close(const char *name, const nb_tensor *t, const double *ref, double rtol, double atol);
/* Checks that a call failed with status st and that its message contains
 * every one of the given substrings (NULL-terminated list). */
int nbt_check_error(const char *name, int failed, nb_status st, ...);

/* f maps inputs to an output tensor. nbt_gradcheck compares the gradients of
 * sum(f(inputs) * w), w random, from nb_backward with central differences
 * in float64. inputs must be contiguous f64 CPU leaves with requires_grad. */
typedef nb_tensor *(*nbt_fn)(nb_tensor *const *inputs, void *ctx);
int nbt_gradcheck(const char *name, nbt_fn f, void *ctx, int n, nb_tensor *const *inputs,
                  double eps, double rtol, double atol);
/* Runs `'bin' args` with stdout and stderr captured into out (a log file in
 * dir holds them); returns the exit status, or -1 if it did not exit. */
int nbt_run(const char *bin, const char *args, const char *dir, char *out, size_t out_size);

/* Makes a fresh directory $TMPDIR/nabla-NAME-XXXXXX (/tmp without TMPDIR)
 * in dir; prints a FAIL line and returns 0 when it cannot. */
int nbt_tmpdir(char *dir, size_t size, const char *name);
/* Removes dir and everything in it (read-only entries too); prints a note
 * when it cannot. */
void nbt_rmtree(const char *dir);

/* A new f64 leaf with requires_grad, filled from a normal(seed); owned by
 * the caller (nb_release) even inside a scope. */
nb_tensor *nbt_leaf(uint64_t seed, int ndim, const int64_t *shape);
#endif
