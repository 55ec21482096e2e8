/* `nabla bench`: the kernel benchmark harness.
 *
 * Every case states its shape, counts the bytes it must move (each input
 * read once, each output written once) and its FLOPs before it runs, then is
 * timed with device events: warm-up runs, then the median of many timed
 * runs. Inputs rotate among several sets whose total exceeds the last-level
 * cache, so the cache does not serve them. Each run sits in its own
 * nb_scope_begin/end, so the times include nabla's per-op host overhead
 * (validation, graph recording, releasing the scope), as a user sees it.
 *
 * The ceilings are measured in the same run: the copy bandwidth (a large
 * nb_copy_, bytes read + written) and the GEMM rate (bf16 8192^3 on CUDA,
 * f32 1024^3 on the CPU). Every case reports its fraction of them.
 *
 * Only the public API is used, plus the device's name for the report.
 *
 * This file: timing, the environment, the command line and the run. The
 * cases (a table of specs; each family's inputs, counts and run) are in
 * bench_cases.c, the printed table, JSON and markdown in bench_report.c. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend/bench_api.h"
#include "cli.h"
#include "nabla.h"
#include "tool.h"
#include "bench.h"

/* ---- timing --------------------------------------------------------------- */
/* One iteration on the next input set, inside its own scope so that every
 * result and intermediate is released before the next. */
static nb_status bench_iter(bench_case *c) {
  int s = c->next_set;
  c->next_set = (s + 1) % c->n_sets;
  nb_clear_error();
  nb_scope_begin();
  nb_status st = bench_step(c, s);
  nb_scope_end();
  return st;
}

/* One iteration between two events, waited for: used to warm up and to
 * estimate how many timed runs fit the time budget. */
static nb_status bench_time_one(bench_case *c, nb_device dev, double *ms) {
  nb_event *a = nb_event_record(dev), *b = NULL;
  nb_status st = a ? bench_iter(c) : bench_fail();
  if (!st) b = nb_event_record(dev);
  if (!st && !b) st = bench_fail();
  if (!st) {
    *ms = nb_event_elapsed_ms(a, b);
    if (*ms < 0) st = bench_fail();
  }
  nb_event_free(a);
  nb_event_free(b);
  return st;
}

static int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* CUDA: the GPU's SM clock (MHz) and energy counter (mJ) now, from NVML
 * (nb_cuda_gpu_state_read); -1 each where unknown (the CPU, no NVML). */
typedef struct {
  int sm_mhz;
  long long energy_mj;
} bench_gpu;

static bench_gpu bench_gpu_read(const bench_opts *o) {
  bench_gpu g = {-1, -1};
#ifdef NABLA_HAVE_CUDA
  if (o->dev.type == NB_CUDA) {
    nb_cuda_gpu_state s;
    nb_cuda_gpu_state_read(o->dev.index, &s);
    g.sm_mhz = s.sm_mhz, g.energy_mj = s.energy_mj;
  }
#else
  (void)o;
#endif
  return g;
}

/* Queues reps iterations, each between its own pair of events, and reads
 * the times only at the end, so the device never waits for the host's
 * reading of a previous result. */
static nb_status bench_timed_runs(bench_case *c, const bench_opts *o, int reps, double *ms) {
  nb_event **ev = calloc((size_t)2 * reps, sizeof *ev);
  if (!ev) return NB_ERR_OOM; /* host memory; reported as an allocation failure */
  nb_status st = NB_OK;
  /* the GPU's state over the timed runs: the clock once they are all queued
   * (they run meanwhile), the energy counter before and after them */
  const bench_gpu g0 = bench_gpu_read(o);
  const double t0 = tool_now();
  for (int r = 0; r < reps && !st; r++) {
    ev[2 * r] = nb_event_record(o->dev);
    st = ev[2 * r] ? bench_iter(c) : bench_fail();
    if (!st) ev[2 * r + 1] = nb_event_record(o->dev);
    if (!st && !ev[2 * r + 1]) st = bench_fail();
  }
  const bench_gpu g1 = bench_gpu_read(o);
  if (!st) st = nb_device_synchronize(o->dev);
  const bench_gpu g2 = bench_gpu_read(o);
  const double t = tool_now() - t0;
  c->sm_mhz = g1.sm_mhz > 0 ? g1.sm_mhz : NAN;
  c->watts = g0.energy_mj >= 0 && g2.energy_mj >= g0.energy_mj && t > 0
                 ? 1e-3 * (double)(g2.energy_mj - g0.energy_mj) / t
                 : NAN;
  for (int r = 0; r < reps && !st; r++) {
    ms[r] = nb_event_elapsed_ms(ev[2 * r], ev[2 * r + 1]);
    if (ms[r] < 0) st = bench_fail();
  }
  for (int i = 0; i < 2 * reps; i++) nb_event_free(ev[i]);
  free(ev);
  return st;
}

static nb_status bench_measure(bench_case *c, const bench_opts *o) {
  double est = 0, spent = 0;
  int runs = 0;
  nb_status st;
  /* Warm-up: at least one run (two unless one is slow), then until warm_ms.
   * With NABLA_AUTOTUNE=1 always two: the first may tune a GEMM (time its
   * candidates), and est, which sizes the timed runs, must not include it. */
  do {
    st = bench_time_one(c, o->dev, &est);
    spent += est;
    runs++;
  } while (!st && runs < 100000 &&
           (spent < o->warm_ms || (runs < 2 && (est < 1000.0 || o->tuning))));
  if (st) return st;
  int reps = (int)ceil(o->target_ms / (est > 1e-4 ? est : 1e-4));
  if (reps < o->min_reps) reps = o->min_reps;
  if (reps > o->max_reps) reps = o->max_reps;
  double *ms = calloc((size_t)reps, sizeof *ms);
  if (!ms) return NB_ERR_OOM;
  st = bench_timed_runs(c, o, reps, ms);
  if (!st) {
    double sum = 0;
    for (int r = 0; r < reps; r++) sum += ms[r];
    qsort(ms, (size_t)reps, sizeof *ms, bench_cmp_double);
    c->ms_median = reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
    c->ms_min = ms[0];
    c->ms_mean = sum / reps;
    c->reps = reps;
  }
  free(ms);
  return st;
}

static int bench_is_oom(nb_status st, const char *msg) {
  return st == NB_ERR_OOM || strstr(msg, "out of memory") != NULL;
}

/* Sets up, measures and tears down one case; the result stays in c. */
static void bench_run_case(bench_case *c, const bench_opts *o) {
  nb_rng rng = nb_rng_new(1234);
  nb_status st = NB_OK;
  c->n_sets = bench_n_sets(c, o->rotate_bytes);
  c->next_set = 0;
  nb_clear_error();
  for (int s = 0; s < c->n_sets && !st; s++) st = bench_setup_set(c, s, &rng, o->dev);
  if (!st) st = nb_device_synchronize(o->dev);
  if (!st) st = bench_measure(c, o);
  c->ran = 1;
  c->status = st;
  if (st) {
    const char *msg = nb_last_error();
    snprintf(c->error, sizeof c->error, "%s%s", msg[0] ? msg : nb_status_name(st),
             bench_is_oom(st, msg) ? " (allocation failed; --only can leave this case out)"
                                   : "");
  } else {
    double sec = c->ms_median * 1e-3;
    c->gbs = c->bytes / sec / 1e9;
    c->tflops = c->flops / sec / 1e12;
  }
  bench_teardown(c);
  nb_clear_error();
  if (o->dev.type == NB_CUDA) nb_cuda_empty_cache(o->dev.index);
  nb_clear_error();
}

/* ---- environment -------------------------------------------------------- */
static void bench_strip(char *s) {
  size_t n = strlen(s);
  while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) s[--n] = '\0';
}

static void bench_git_commit(char *buf, size_t n) {
  buf[0] = '\0';
  const char *env = getenv("NABLA_GIT_COMMIT");
  if (env && env[0]) {
    snprintf(buf, n, "%s", env);
    return;
  }
  FILE *p = popen("git rev-parse HEAD 2>/dev/null", "r");
  if (!p) return;
  if (!fgets(buf, (int)n, p)) buf[0] = '\0';
  pclose(p);
  bench_strip(buf);
}

static void bench_cpu_name(char *buf, size_t n) {
  snprintf(buf, n, "cpu");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (!strncmp(line, "model name", 10) && colon) {
      bench_strip(colon + 2);
      snprintf(buf, n, "%s", colon + 2);
      break;
    }
  }
  fclose(f);
}

static void bench_meta_init(bench_meta *m, const bench_opts *o) {
  memset(m, 0, sizeof *m);
  m->copy_gbs = m->gemm_tflops = NAN;
  if (o->dev.type == NB_CUDA) snprintf(m->device, sizeof m->device, "cuda:%d", o->dev.index);
  else snprintf(m->device, sizeof m->device, "cpu");
#ifdef NABLA_HAVE_CUDA
  if (o->dev.type == NB_CUDA &&
      nb_cuda_device_name(o->dev.index, m->device_name, sizeof m->device_name) != NB_OK)
    snprintf(m->device_name, sizeof m->device_name, "%s", m->device);
#endif
  if (o->dev.type == NB_CPU) bench_cpu_name(m->device_name, sizeof m->device_name);
  if (!m->device_name[0]) snprintf(m->device_name, sizeof m->device_name, "%s", m->device);
  nb_clear_error();
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(m->date, sizeof m->date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  bench_git_commit(m->commit, sizeof m->commit);
#ifdef _OPENMP
  m->threads = omp_get_max_threads();
#else
  m->threads = 1;
#endif
}

/* ---- command line ------------------------------------------------------- */
static void bench_usage(FILE *f) {
  fprintf(f,
          "usage: nabla bench [--device cpu|cuda[:N]] [--json FILE] [--md FILE] [--quick]\n"
          "                   [--only NAME,...] [--list] [--seconds S] [--warmup S]\n"
          "                   [--rotate-mb MB]\n"
          "\n"
          "Times every kernel at stated shapes (the issue's GPU shapes on CUDA, smaller\n"
          "ones on the CPU) and reports GB/s, TFLOP/s and the fraction of the copy\n"
          "bandwidth and GEMM rate measured in the same run.\n"
          "\n"
          "  --device D     cpu (default), cuda or cuda:N\n"
          "  --json FILE    write every field, with device, date and git commit\n"
          "  --md FILE      write the table as markdown\n"
          "  --quick        fewer runs (and on the CPU smaller shapes)\n"
          "  --only LIST    comma-separated case families (prefixes match) or case ids;\n"
          "                 the two ceilings always run, first\n"
          "  --no-ceilings  leave the ceilings out unless --only names them (the\n"
          "                 fraction columns are then empty): one case alone, as\n"
          "                 bench/steady_compare.py runs it\n"
          "  --list         print the case ids and exit\n"
          "  --ops          also time every op-table entry at its own benchmark call\n"
          "                 (nabla info --ops lists the table) and list the entries\n"
          "                 without one; --only op selects them alone\n"
          "  --seconds S    timed runs per case fill about S seconds (default 0.5, quick 0.1)\n"
          "  --warmup S     untimed runs first, for at least S seconds (at most 100000 runs;\n"
          "                 default 0.1, quick 0.02); 1 or more reaches a GPU's power-limited\n"
          "                 steady clock\n"
          "                 (bench/compare_torch.py warms torch up as long)\n"
          "  --rotate-mb MB input sets per case total at least MB (default 256, CPU quick 64)\n"
          "Values go as --opt VALUE or --opt=VALUE; output files are checked first.\n"
          "\n"
          "NABLA_AUTOTUNE=1 times the GEMM candidates (the CPU GEMM's blockings; on CUDA\n"
          "the own sm_90a kernel's schedules: NABLA_GEMM=own for matmul, by default for\n"
          "matmul_bias_gelu) at the first use of each shape class, inside a case's first\n"
          "warm-up run, never in the timed runs; the choices are cached in\n"
          "NABLA_AUTOTUNE_CACHE (default ~/.cache/nabla/autotune.txt), so a second bench\n"
          "runs them without timing. Without it: the heuristic choices, or cached ones.\n"
          "\nfamilies:");
  for (int k = 0; k < BK_COUNT; k++) fprintf(f, " %s", bench_family[k]);
  fprintf(f, "\n");
}

/* Returns 0, or an exit status for a bad command line (or --help: -1). */
static int bench_parse(int argc, char **argv, bench_opts *o) {
  double seconds = -1, warmup = -1, rotate_mb = -1;
  const char *device = "cpu";
  int help = 0, rc;
  const cli_opt rows[] = {
      CLI_OPT_STR("device", &device, 0), CLI_OPT_STR("json", &o->json_path, 0),
      CLI_OPT_STR("md", &o->md_path, 0), CLI_OPT_STR("only", &o->only, 0),
      CLI_OPT_FLAG("quick", 0, &o->quick), CLI_OPT_FLAG("list", 0, &o->list),
      CLI_OPT_FLAG("ops", 0, &o->ops), CLI_OPT_FLAG("no-ceilings", 0, &o->no_ceilings),
      CLI_OPT_REAL("seconds", &seconds, 0, 3600, 1, 0), CLI_OPT_REAL("warmup", &warmup, 0, 3600, 0, 0),
      CLI_OPT_REAL("rotate-mb", &rotate_mb, 0, 1 << 20, 0, 0), CLI_OPT_FLAG("help", 'h', &help)};
  cli_spec spec = {.prog = "nabla bench", .opts = rows, .n_opts = sizeof rows / sizeof *rows};
  if ((rc = cli_parse(&spec, argc, argv))) return rc;
  if (help) return bench_usage(stdout), -1;
  if (nb_device_parse(device, &o->dev) != NB_OK) {
    fprintf(stderr, "nabla bench: --device expects cpu, cuda or cuda:N, got '%s'\n", device);
    return NB_TOOL_EXIT_USAGE;
  }
  /* the output files, before the cases run */
  if ((o->json_path && (rc = cli_check_output("nabla bench", "--json", o->json_path))) ||
      (o->md_path && (rc = cli_check_output("nabla bench", "--md", o->md_path))))
    return rc;
  int cuda = o->dev.type == NB_CUDA;
  o->target_ms = 1e3 * (seconds > 0 ? seconds : o->quick ? 0.1 : 0.5);
  o->warm_ms = 1e3 * (warmup >= 0 ? warmup : o->quick ? 0.02 : 0.1);
  o->min_reps = o->quick ? 3 : cuda ? 10 : 5;
  o->max_reps = o->quick ? 50 : 500;
  o->rotate_bytes = BENCH_MIB * (rotate_mb >= 0 ? rotate_mb : (!cuda && o->quick) ? 64 : 256);
  o->tuning = nb_tune_enabled();
  return 0;
}

/* The cases for the device: dims chosen, ceilings first. */
static int bench_build(const bench_opts *o, bench_case *all, int max) {
  int n = 0, cuda = o->dev.type == NB_CUDA;
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < BENCH_NSPECS; i++) {
      const bench_spec *sp = &bench_specs[i];
      int ceil_here = sp->ceiling == BC_COPY || sp->ceiling == (cuda ? BC_GEMM_CUDA : BC_GEMM_CPU);
      if ((pass == 0) != ceil_here) continue;
      bench_case *c = &all[n++];
      memset(c, 0, sizeof *c);
      c->spec = sp;
      c->role = ceil_here ? sp->ceiling : BC_NONE;
      memcpy(c->d, cuda ? sp->gpu : o->quick ? sp->quick : sp->cpu, sizeof c->d);
      bench_describe(c);
      bench_count(c);
      c->frac_bw = c->frac_gemm = NAN;
    }
  }
  return o->ops ? bench_op_build(o, all, n, max) : n;
}

/* --only: a token selects the cases whose family starts with it or whose
 * id or name equals it. Every token must select something. The ceilings
 * run too, but with --no-ceilings (no_ceil), where only a token selects
 * them. */
static int bench_select(const char *only, int no_ceil, bench_case *all, int n, int *sel) {
  for (int i = 0; i < n; i++) sel[i] = all[i].role != BC_NONE ? !no_ceil : !only;
  if (!only) return 0;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", only);
  for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    int hit = 0;
    for (int i = 0; i < n; i++) {
      const char *fam = bench_family[all[i].spec->kind];
      if (!strncmp(fam, tok, strlen(tok)) || !strcmp(all[i].id, tok) ||
          !strcmp(all[i].name, tok))
        sel[i] = hit = 1;
    }
    if (!hit) {
      fprintf(stderr, "nabla bench: --only: no case matches '%s' (nabla bench --list)\n", tok);
      return NB_TOOL_EXIT_USAGE;
    }
  }
  return 0;
}

static int bench_check_device(nb_device dev) {
  if (dev.type != NB_CUDA) return 0;
  int n = nb_cuda_available();
  if (dev.index < n) return 0;
  fprintf(stderr, "nabla bench: no CUDA device cuda:%d (%d found%s)\n", dev.index, n,
#ifdef NABLA_HAVE_CUDA
          ""
#else
          "; nabla was built without CUDA"
#endif
  );
  return NB_TOOL_EXIT_USAGE;
}

static void bench_report_files(const bench_opts *o, const bench_meta *m, bench_case **run,
                               int n, int *rc) {
  if (o->json_path && bench_write_json(o->json_path, m, o, run, n) != 0) {
    fprintf(stderr, "nabla bench: cannot write %s\n", o->json_path);
    *rc = NB_TOOL_EXIT_RUNTIME;
  }
  if (o->md_path && bench_write_md(o->md_path, m, run, n) != 0) {
    fprintf(stderr, "nabla bench: cannot write %s\n", o->md_path);
    *rc = NB_TOOL_EXIT_RUNTIME;
  }
}

/* Runs the selected cases in order (ceilings first) and prints each row. */
static int bench_run_all(const bench_opts *o, bench_meta *m, bench_case **run, int n) {
  int rc = 0;
  printf("nabla bench on %s (%s), %d CPU thread%s%s\n", m->device, m->device_name, m->threads,
         m->threads == 1 ? "" : "s", o->quick ? ", quick" : "");
  printf("times: median of device-event timings after warm-up, inputs rotated over >= %.0f MiB;"
         " nabla's per-op host overhead included\n", o->rotate_bytes / BENCH_MIB);
  if (o->tuning) printf("NABLA_AUTOTUNE=1: GEMM candidates are timed in each case's first warm-up run\n");
  if (nb_tune_forced_name())
    printf("NABLA_AUTOTUNE_FORCE=%s: kernels with a candidate of that name run it\n", nb_tune_forced_name());
  printf("\n");
  bench_print_header(stdout);
  for (int i = 0; i < n; i++) {
    bench_case *c = run[i];
    bench_run_case(c, o);
    if (!c->status && c->role == BC_COPY) m->copy_gbs = c->gbs;
    if (!c->status && c->role > BC_COPY) {
      m->gemm_tflops = c->tflops;
      m->gemm_id = c->id;
    }
    bench_frac(c, m->copy_gbs, m->gemm_tflops);
    bench_print_row(stdout, c);
    if (c->status && bench_is_oom(c->status, c->error)) rc = NB_TOOL_EXIT_USAGE;
    else if (c->status && rc == 0) rc = NB_TOOL_EXIT_RUNTIME;
  }
  if (!o->no_ceilings || m->copy_gbs > 0 || m->gemm_id)
    printf("\nceilings (this run): copy %.1f GB/s, GEMM %.2f TFLOP/s (%s)\n", m->copy_gbs,
           m->gemm_tflops, m->gemm_id ? m->gemm_id : "not measured");
  else
    printf("\nceilings: not measured (--no-ceilings)\n");
  if (o->ops) bench_op_missing(stdout);
  bench_report_files(o, m, run, n, &rc);
  return rc;
}

int nb_tool_bench(int argc, char **argv) {
  bench_opts o;
  memset(&o, 0, sizeof o);
  int rc = bench_parse(argc, argv, &o);
  if (rc) return rc < 0 ? 0 : rc;
  int max = BENCH_NSPECS + (o.ops ? nb_op_table_size() : 0);
  bench_case *all = calloc((size_t)max, sizeof *all);
  bench_case **run = calloc((size_t)max, sizeof *run);
  int *sel = calloc((size_t)max, sizeof *sel);
  if (!all || !run || !sel) {
    fprintf(stderr, "nabla bench: out of host memory\n");
    free(all), free(run), free(sel);
    return NB_TOOL_EXIT_USAGE;
  }
  int n = bench_build(&o, all, max), n_run = 0;
  rc = bench_select(o.only, o.no_ceilings, all, n, sel);
  for (int i = 0; i < n; i++)
    if (sel[i]) run[n_run++] = &all[i];
  if (!rc && o.list) {
    /* With --json, the planned cases (status "not_run"): compare_torch.py
     * can time PyTorch alone on them. */
    for (int i = 0; i < n_run; i++) {
      run[i]->n_sets = bench_n_sets(run[i], o.rotate_bytes);
      printf("%-48s %s\n", run[i]->id, run[i]->spec->note);
    }
    bench_meta m;
    bench_meta_init(&m, &o);
    bench_report_files(&o, &m, run, n_run, &rc);
  } else if (!rc && !(rc = bench_check_device(o.dev))) {
    nb_set_deterministic(1); /* the embedding case asks for the deterministic path */
    bench_meta m;
    bench_meta_init(&m, &o);
    rc = bench_run_all(&o, &m, run, n_run);
  }
  free(all);
  free(run);
  free(sel);
  return rc;
}
