/* `nabla bench` (tools/bench.c): the case table and each family's inputs and
 * run (bench_cases.c), the report as a table, JSON and markdown
 * (bench_report.c). */
#ifndef NB_TOOLS_BENCH_H
#define NB_TOOLS_BENCH_H

#include <stdio.h>

#include "nabla.h"

#define BENCH_MAX_SETS 64
#define BENCH_MAX_IN 6
#define BENCH_MIB 1048576.0
#define BENCH_GIB 1073741824.0

typedef enum {
  BK_COPY, BK_ADD, BK_GELU_TANH, BK_SOFTMAX, BK_LN_FWD, BK_LN_FWDBWD, BK_XENT,
  BK_EMBEDDING, BK_ADAMW, BK_MATMUL, BK_MM_BIAS_GELU, BK_MM_BIAS_GELU_UNFUSED, BK_ATTN_FWD,
  BK_ATTN_FWDBWD, BK_SCALED_MM, BK_OP, BK_COUNT
} bench_kind;

/* Which ceiling a case measures. */
enum { BC_NONE, BC_COPY, BC_GEMM_CUDA, BC_GEMM_CPU };

/* dims by kind:
 *   copy, add, gelu_tanh      {n}
 *   softmax, layer_norm       {rows, cols}
 *   cross_entropy             {rows, classes}
 *   embedding                 {vocab, dim, tokens}
 *   adamw                     {vocab, layers, dim, context}: a GPT-2-shaped
 *                             parameter list (124.5M at 50304, 12, 768, 1024)
 *   matmul                    {M, N, K}: (M, K) @ (K, N)
 *   matmul_bias_gelu          {M, N, K}: gelu_tanh((M, K) @ (K, N) + bias (N,)),
 *                             one GEMM with the epilogue fused (the
 *                             backend's gemm_ex); _unfused: matmul, add, gelu
 *   attention_fwd(bwd)        {B, H, N, D}: scaled_dot_product_attention of
 *                             (B, H, N, D) q, k, v; layout "causal" or NULL;
 *                             "causal_nd": causal under nb_set_deterministic(0)
 * gpu: the shapes of the issue; cpu: smaller; quick: smaller still (CPU). */
typedef struct {
  bench_kind kind;
  nb_dtype dt;
  const char *layout; /* matmul: NN; NT = x @ W^T (linear forward); TN = dY^T @ X (dW) */
  const char *note;
  int64_t gpu[4], cpu[4], quick[4];
  int ceiling;
} bench_spec;

/* The cases' specs, BENCH_NSPECS of them, in the order they run (the
 * ceilings are taken first). */
extern const bench_spec bench_specs[];
extern const int bench_n_specs;
#define BENCH_NSPECS bench_n_specs
/* Family names: what --only matches (by prefix) and what compare_torch.py
 * dispatches on. */
extern const char *const bench_family[BK_COUNT];

typedef struct {
  const bench_spec *spec;
  const void *op;     /* BK_OP: the op-table entry (bench_ops.c) */
  int op_n_in;        /* BK_OP: its inputs */
  int64_t d[4];
  char id[128], name[48], shape[64];
  double bytes, flops, set_bytes;
  int n_sets, next_set;
  nb_tensor *t[BENCH_MAX_SETS][BENCH_MAX_IN];
  nb_params *params[BENCH_MAX_SETS];
  nb_optim *optim[BENCH_MAX_SETS];
  int64_t n_params, n_tensors; /* adamw */
  int role;                    /* BC_COPY, BC_GEMM_* when it is this run's ceiling */
  /* results */
  int ran, reps;
  nb_status status;
  char error[512];
  double ms_median, ms_min, ms_mean, gbs, tflops, frac_bw, frac_gemm;
  double sm_mhz, watts; /* CUDA: the SM clock during the timed runs and their mean power (NAN: unknown) */
} bench_case;

typedef struct {
  nb_device dev;
  int quick;
  double target_ms, warm_ms, rotate_bytes;
  int min_reps, max_reps;
  const char *json_path, *md_path, *only;
  int list;
  int ops; /* --ops: also a case per op-table entry (bench_ops.c) */
  int no_ceilings; /* --no-ceilings: the ceiling cases only where --only names them */
  int tuning; /* NABLA_AUTOTUNE=1: a case's first run may time GEMM candidates */
} bench_opts;

/* The run's device, date, commit and ceilings, for the report. */
typedef struct {
  char device[32], device_name[256], date[32], commit[64];
  int threads;
  double copy_gbs, gemm_tflops;
  const char *gemm_id;
} bench_meta;

/* ---- the cases (bench_cases.c) ------------------------------------------- */
/* The case's name, shape text and id from its spec and dims. */
void bench_describe(bench_case *c);
/* Bytes of the ideal implementation, FLOPs and the bytes of one input set. */
void bench_count(bench_case *c);
/* How many input sets rotate (their total past the caches). */
int bench_n_sets(const bench_case *c, double rotate_bytes);
/* The last error's status, or NB_ERR_BACKEND when none was recorded. */
nb_status bench_fail(void);
/* Input set s of case c on dev. */
nb_status bench_setup_set(bench_case *c, int s, nb_rng *rng, nb_device dev);
/* Releases every input set. */
void bench_teardown(bench_case *c);
/* One run of case c on input set s. */
nb_status bench_step(bench_case *c, int s);

/* ---- the op table's cases (bench_ops.c) ---------------------------------- */
/* Appends a case per entry with a benchmark call to all[n ..] (at most
 * max); returns the new count. */
int bench_op_build(const bench_opts *o, bench_case *all, int n, int max);
/* The entries without a benchmark call, one line. */
void bench_op_missing(FILE *f);
void bench_op_describe(bench_case *c);
void bench_op_count(bench_case *c);
nb_status bench_op_setup(bench_case *c, int s, nb_rng *rng, nb_device dev);
nb_status bench_op_step(bench_case *c, int s);

/* ---- report (bench_report.c) --------------------------------------------- */
/* The case's fractions of the ceilings measured so far. */
void bench_frac(bench_case *c, double copy_gbs, double gemm_tflops);
void bench_print_header(FILE *f);
void bench_print_row(FILE *f, const bench_case *c);
/* Every field to path; 0, or -1 when it cannot be written. */
int bench_write_json(const char *path, const bench_meta *m, const bench_opts *o, bench_case **run,
                     int n);
/* The table as markdown to path; 0 or -1. */
int bench_write_md(const char *path, const bench_meta *m, bench_case **run, int n);

#endif /* NB_TOOLS_BENCH_H */
