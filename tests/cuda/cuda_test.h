/* test_cuda's sections (one file a family in tests/cuda/) and the helpers
 * they share, defined in tests/test_cuda.c and, for the GEMM families, in
 * tests/cuda/gemm_sm90.c. */
#ifndef NB_CUDA_TEST_H
#define NB_CUDA_TEST_H

#include "nabla.h"

/* The device under test (the CPU under NABLA_TEST_SELF=1) and whether
 * NABLA_TEST_QUICK=1 shrank the sizes. */
extern nb_device G;
extern int quick;

/* Relative and absolute tolerance of a CUDA result against the CPU's. */
void tol(nb_dtype dt, double *rtol, double *atol);
/* f32, f16, bf16. */
extern const nb_dtype FLOATS[3];
/* A copy of t on the device under test. */
nb_tensor *gpu(const nb_tensor *t);
/* Compares a CUDA result with the CPU's, tolerance scaled by scale. */
void cmp(const char *name, nb_dtype dt, const nb_tensor *cpu, const nb_tensor *cu, double scale);
/* Exact byte equality of two tensors' row-major contents. */
void cmp_bits(const char *name, const nb_tensor *cpu, const nb_tensor *cu);
nb_tensor *randn(uint64_t seed, int nd, const int64_t *shape, nb_dtype dt);
/* Three layouts of one (r, c) operand: contiguous, transposed, sliced. */
nb_tensor *layout(uint64_t seed, int64_t r, int64_t c, nb_dtype dt, int kind);
extern const char *const LAYOUT[3];

/* Runs f on both devices; compares outputs and the gradients of sum(f*w). */
typedef nb_tensor *(*fwd_fn)(nb_tensor *const *in, void *ctx);
void grad_cmp(const char *name, fwd_fn f, void *ctx, int n, nb_tensor *const *in, nb_dtype dt,
              double scale);
/* Row ops as fwd_fn (tests/cuda/nn.c): softmax and log_softmax over the
 * axis *(int *)ctx, layer_norm and rms_norm over axis 1 with x[1] (and x[2]). */
nb_tensor *f_softmax(nb_tensor *const *x, void *c);
nb_tensor *f_log_softmax(nb_tensor *const *x, void *c);
nb_tensor *f_layer_norm(nb_tensor *const *x, void *c);
nb_tensor *f_rms_norm(nb_tensor *const *x, void *c);

/* The own GEMM's checks (tests/cuda/gemm_sm90.c), shared by "gemm tune" and
 * "gemm sm80": own-kernel launches so far (-1: it cannot run here), the
 * relative Frobenius error, float64 reference rows of a @ b, the error of
 * sampled rows, an (r, c) operand on the CPU and its view on the device. */
int64_t gs_launches(void);
double gs_rel(const double *x, const double *ref, int64_t n);
double *gs_ref(const double *A, const double *B, int64_t M, int64_t N, int64_t K, int64_t **rows,
               int64_t *nrow);
double gs_err(const double *O, const double *ref, const int64_t *rows, int64_t nrow, int64_t N);
nb_tensor *gs_operand(uint64_t seed, int64_t r, int64_t c, nb_dtype dt, int trans, nb_tensor **dev);
/* Epilogue variants of nb_cuda_gemm_ex, and one fused case (CUDA builds). */
enum { GE_BIAS = 1, GE_GELU = 2, GE_AUX = 4, GE_RESID = 8 };
void ge_case(int64_t M, int64_t N, int64_t K, nb_dtype dt, nb_dtype od, int ta, int tb, int f,
             uint64_t seed);

/* The sections, in the order main runs them. */
void test_unary(void);
void test_binary(void);
void test_copy_cast(void);
void test_cast_ties(void);
/* NABLA_AUTOTUNE off and NABLA_AUTOTUNE_CACHE in a fresh temporary
 * directory (tests/cuda/gemm_tune.c): begin returns 0, after a failed check
 * naming what, when none can be made; end restores both variables, resets
 * the tuner and removes the directory. */
typedef struct {
  char *old_on, *old_path;
  char dir[40], path[64];
} tune_cache;
int tune_cache_begin(tune_cache *t, const char *what);
void tune_cache_end(tune_cache *t);
/* Lines of the file path containing text (0 when it cannot be read). */
int tune_lines(const char *path, const char *text);
void test_fp8_section(void); /* tests/cuda/fp8.c */
void test_reduce(void);
void test_matmul(void);
void test_nn(void);
void test_index(void);
void test_random(void);
void test_optim(void);
void test_errors_memory(void);
void test_fast_paths(void);
void test_rows_fast(void);
void test_rows_masked(void);
void test_xent_fused(void);
void test_gemm_sm90(void);
void test_gemm_sm80(void);
void test_gemm_tune(void);
void test_pinned(void);
void test_amp(void);
void test_gpt_step(void);

#endif /* NB_CUDA_TEST_H */
