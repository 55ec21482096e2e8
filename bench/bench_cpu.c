/* CPU benchmark: f32 matmul GFLOP/s and elementwise add GB/s.
 *
 *   bench_cpu [--json FILE] [--quick]
 *
 * Each case is timed as the median of several runs after warm-up, two ways:
 * through the public API (nb_matmul, nb_add: allocation of the result
 * included, as numpy's a @ b and a + b allocate theirs) and by calling the
 * CPU kernel directly on nb_kview views into a preallocated output (the
 * kernel alone). Counts: matmul 2*M*N*K flops; add 3 * 4 * n bytes (two
 * reads, one write). bench/numpy_bench.py runs the same cases in numpy. */
#define _POSIX_C_SOURCE 200112L /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>

#include "backend/cpu/cpu_gemm.h"
#include "core/core.h"

#define NBB_MAXRUNS 31

static double nbb_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int nbb_cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static double nbb_median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, nbb_cmp);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* What one timed call runs: the public op or the kernel on fixed views. */
typedef struct {
  const char *kind;          /* "matmul" or "add" */
  int api;                   /* 1: nb_matmul / nb_add, 0: kernel */
  nb_tensor *a, *b, *out;    /* out: preallocated, for the kernel */
} nbb_case;

static int nbb_call(const nbb_case *c) {
  if (c->api) {
    nb_tensor *r = strcmp(c->kind, "add") ? nb_matmul(c->a, c->b) : nb_add(c->a, c->b);
    nb_release(r);
    return r ? 0 : -1;
  }
  nb_kview o, a, b;
  nb_kview_of(c->out, &o);
  nb_kview_of(c->a, &a);
  nb_kview_of(c->b, &b);
  nb_status st = strcmp(c->kind, "add") ? nb_cpu_matmul(&o, &a, &b)
                                        : nb_cpu_binary(NB_BOP_ADD, &o, &a, &b);
  return st == NB_OK ? 0 : -1;
}

/* Median seconds of runs calls after warm calls; < 0 on error. */
static double nbb_time(const nbb_case *c, int warm, int runs) {
  double t[NBB_MAXRUNS];
  for (int i = 0; i < warm; i++)
    if (nbb_call(c)) return -1;
  for (int i = 0; i < runs; i++) {
    double t0 = nbb_now();
    if (nbb_call(c)) return -1;
    t[i] = nbb_now() - t0;
  }
  return nbb_median(t, runs);
}

typedef struct {
  char name[64];
  const char *path;
  double seconds, rate;      /* rate: GFLOP/s or GB/s */
  const char *unit;
} nbb_result;

static nbb_result nbb_res[32];
static int nbb_nres;

static void nbb_report(const char *name, const char *path, double s, double work,
                       const char *unit) {
  nbb_result *r = &nbb_res[nbb_nres++];
  snprintf(r->name, sizeof r->name, "%s", name);
  r->path = path;
  r->seconds = s;
  r->rate = s > 0 ? work / s * 1e-9 : 0;
  r->unit = unit;
  printf("%-26s %-7s %10.3f ms %9.1f %s\n", name, path, s * 1e3, r->rate, unit);
}

/* (batch, m, k) @ (batch, k, n) in f32, both paths. */
static int nbb_matmul(nb_rng *rng, int64_t batch, int64_t m, int64_t n, int64_t k, int runs) {
  int nd = batch > 1 ? 3 : 2;
  int64_t sa[3] = {batch, m, k}, sb[3] = {batch, k, n}, so[3] = {batch, m, n};
  const int64_t *pa = nd == 3 ? sa : sa + 1, *pb = nd == 3 ? sb : sb + 1;
  const int64_t *po = nd == 3 ? so : so + 1;
  nbb_case c = {"matmul", 1, nb_randn(rng, nd, pa, 0, 1, NB_F32, NB_DEVICE_CPU),
                nb_randn(rng, nd, pb, 0, 1, NB_F32, NB_DEVICE_CPU),
                nb_empty(nd, po, NB_F32, NB_DEVICE_CPU)};
  if (!c.a || !c.b || !c.out) return -1;
  char name[64];
  if (batch > 1)
    snprintf(name, sizeof name, "matmul %lldx(%lldx%lldx%lld)", (long long)batch,
             (long long)m, (long long)n, (long long)k);
  else
    snprintf(name, sizeof name, "matmul %lld", (long long)m);
  double flops = 2.0 * (double)batch * (double)m * (double)n * (double)k;
  double s_api = nbb_time(&c, 2, runs);
  c.api = 0;
  double s_kern = nbb_time(&c, 2, runs);
  nb_release(c.a); nb_release(c.b); nb_release(c.out);
  if (s_api < 0 || s_kern < 0) return -1;
  nbb_report(name, "api", s_api, flops, "GFLOP/s");
  nbb_report(name, "kernel", s_kern, flops, "GFLOP/s");
  return 0;
}

/* a + b over n f32 elements, both paths. */
static int nbb_add(nb_rng *rng, int64_t n, int runs) {
  nbb_case c = {"add", 1, nb_randn(rng, 1, &n, 0, 1, NB_F32, NB_DEVICE_CPU),
                nb_randn(rng, 1, &n, 0, 1, NB_F32, NB_DEVICE_CPU),
                nb_empty(1, &n, NB_F32, NB_DEVICE_CPU)};
  if (!c.a || !c.b || !c.out) return -1;
  double bytes = 3.0 * 4.0 * (double)n;
  double s_api = nbb_time(&c, 2, runs);
  c.api = 0;
  double s_kern = nbb_time(&c, 2, runs);
  nb_release(c.a); nb_release(c.b); nb_release(c.out);
  if (s_api < 0 || s_kern < 0) return -1;
  char name[64];
  snprintf(name, sizeof name, "add f32 n=%lld", (long long)n);
  nbb_report(name, "api", s_api, bytes, "GB/s");
  nbb_report(name, "kernel", s_kern, bytes, "GB/s");
  return 0;
}

static void nbb_json(const char *file, int threads, int mr, int nr) {
  const char *wp = getenv("OMP_WAIT_POLICY");
  FILE *f = fopen(file, "w");
  if (!f) { fprintf(stderr, "bench_cpu: cannot write %s\n", file); return; }
  fprintf(f, "{\n  \"library\": \"nabla\",\n  \"isa\": \"%s\",\n  \"tile\": [%d, %d],\n"
          "  \"threads\": %d,\n  \"omp_wait_policy\": \"%s\",\n  \"results\": [\n", nb_cpu_gemm_isa(),
          mr, nr, threads, wp ? wp : "");
  for (int i = 0; i < nbb_nres; i++)
    fprintf(f, "    {\"name\": \"%s\", \"path\": \"%s\", \"seconds\": %.6e, \"rate\": %.3f, "
            "\"unit\": \"%s\"}%s\n", nbb_res[i].name, nbb_res[i].path, nbb_res[i].seconds,
            nbb_res[i].rate, nbb_res[i].unit, i + 1 < nbb_nres ? "," : "");
  fprintf(f, "  ]\n}\n");
  fclose(f);
}

int main(int argc, char **argv) {
  const char *json = NULL;
  int quick = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else {
      fprintf(stderr, "usage: %s [--json FILE] [--quick]\n", argv[0]);
      return 2;
    }
  }
  int mr, nr, threads = omp_get_max_threads();
  nb_cpu_gemm_tile(NB_F32, &mr, &nr);
  printf("nabla CPU benchmark: nabla's own GEMM kernel (packed, %s micro-kernel %dx%d f32), "
         "%d OpenMP threads\n", nb_cpu_gemm_isa(), mr, nr, threads);
  /* libgomp's barrier waiting matters on a shared machine: spinning
   * workers (the default) can stall a region by a scheduler tick when
   * another process holds the other core; passive waiting does not. */
  const char *wp = getenv("OMP_WAIT_POLICY"), *sc = getenv("GOMP_SPINCOUNT");
  printf("OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s\n", wp ? wp : "(unset)", sc ? sc : "(unset)");
  printf("nb_matmul on the CPU dispatches to %s\n",
         nb_cpu_backend.matmul == nb_cpu_matmul ? "nb_cpu_matmul (this kernel)" : "another kernel");
  printf("api = nb_matmul/nb_add (result allocated per call); kernel = nb_cpu_matmul/"
         "nb_cpu_binary into a preallocated output\n");
  nb_rng rng = nb_rng_new(1);
  static const int64_t sizes[] = {512, 1024, 2048};
  static const int runs[] = {15, 9, 5};
  int err = 0;
  for (int i = 0; i < 3; i++)
    err |= nbb_matmul(&rng, 1, sizes[i], sizes[i], sizes[i], quick ? 3 : runs[i]);
  err |= nbb_matmul(&rng, 64, 64, 64, 16, quick ? 5 : 31);
  err |= nbb_add(&rng, (int64_t)1 << 25, quick ? 3 : 9);
  if (err) {
    fprintf(stderr, "bench_cpu: %s\n", nb_last_error());
    return 1;
  }
  if (json) nbb_json(json, threads, mr, nr);
  return 0;
}
