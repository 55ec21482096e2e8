/* `nabla bench`'s report (see bench.c): the printed table, and the same rows
 * with every field as JSON (what bench/compare_torch.py reads) or markdown. */
#include <math.h>
#include <stdio.h>

#include "backend/bench_api.h"
#include "bench.h"
#include "nabla.h"

/* ---- report ------------------------------------------------------------- */
void bench_frac(bench_case *c, double copy_gbs, double gemm_tflops) {
  c->frac_bw = c->status || !(copy_gbs > 0) ? NAN : c->gbs / copy_gbs;
  c->frac_gemm = c->status || !(gemm_tflops > 0) || c->flops == 0 ? NAN
                                                                 : c->tflops / gemm_tflops;
}

static void bench_cell(char *buf, size_t n, double v, const char *fmt) {
  if (isnan(v)) snprintf(buf, n, "-");
  else snprintf(buf, n, fmt, v);
}

static const char *const bench_hdr[9] = {"case", "shape", "dtype", "ms (median)", "GB/s",
                                         "TFLOP/s", "% copy BW", "% GEMM", "note"};

#define BENCH_CELL 160 /* a table cell's bytes (the note with the GPU state the longest) */

static void bench_row_cells(const bench_case *c, char cells[9][BENCH_CELL]) {
  snprintf(cells[0], BENCH_CELL, "%s", c->name);
  snprintf(cells[1], BENCH_CELL, "%s", c->shape);
  snprintf(cells[2], BENCH_CELL, "%s", nb_dtype_name(c->spec->dt));
  if (c->status || !c->ran) {
    for (int i = 3; i < 8; i++) snprintf(cells[i], BENCH_CELL, "-");
    snprintf(cells[8], BENCH_CELL, "%s", c->ran ? "FAILED (see below)" : "not run");
    return;
  }
  bench_cell(cells[3], BENCH_CELL, c->ms_median, "%.4f");
  bench_cell(cells[4], BENCH_CELL, c->gbs, "%.1f");
  bench_cell(cells[5], BENCH_CELL, c->flops > 0 ? c->tflops : NAN, "%.2f");
  bench_cell(cells[6], BENCH_CELL, 100 * c->frac_bw, "%.1f");
  bench_cell(cells[7], BENCH_CELL, 100 * c->frac_gemm, "%.1f");
  if (c->sm_mhz > 0 && !isnan(c->watts)) /* CUDA with NVML: the state the timed runs ran in */
    snprintf(cells[8], BENCH_CELL, "%s [%.0f MHz, %.0f W%s]", c->spec->note, c->sm_mhz, c->watts,
             c->watts < 50 && c->ms_median * c->reps >= 100 ? ": power not seen, unthrottled?" : "");
  else if (c->sm_mhz > 0)
    snprintf(cells[8], BENCH_CELL, "%s [%.0f MHz]", c->spec->note, c->sm_mhz);
  else
    snprintf(cells[8], BENCH_CELL, "%s", c->spec->note);
}

void bench_print_header(FILE *f) {
  fprintf(f, "%-22s %-18s %-5s %12s %9s %8s %9s %7s  %s\n", bench_hdr[0], bench_hdr[1],
          bench_hdr[2], bench_hdr[3], bench_hdr[4], bench_hdr[5], bench_hdr[6], bench_hdr[7],
          bench_hdr[8]);
}

void bench_print_row(FILE *f, const bench_case *c) {
  char cells[9][BENCH_CELL];
  bench_row_cells(c, cells);
  fprintf(f, "%-22s %-18s %-5s %12s %9s %8s %9s %7s  %s\n", cells[0], cells[1], cells[2],
          cells[3], cells[4], cells[5], cells[6], cells[7], cells[8]);
  if (c->status) fprintf(f, "  %s: %s\n", c->id, c->error);
  fflush(f);
}

static void bench_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch == '\n') fputs("\\n", f);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

static void bench_json_num(FILE *f, const char *key, double v, const char *sep) {
  fprintf(f, "\"%s\": ", key);
  if (isnan(v) || isinf(v)) fputs("null", f);
  else fprintf(f, "%.9g", v);
  fputs(sep, f);
}

static void bench_json_case(FILE *f, const bench_case *c) {
  const bench_spec *sp = c->spec;
  fputs("    {\"id\": ", f);
  bench_json_str(f, c->id);
  fputs(", \"name\": ", f);
  bench_json_str(f, c->name);
  fputs(", \"family\": ", f);
  bench_json_str(f, bench_family[sp->kind]);
  fputs(", \"layout\": ", f);
  if (sp->layout) bench_json_str(f, sp->layout);
  else fputs("null", f);
  fputs(", \"dtype\": ", f);
  bench_json_str(f, nb_dtype_name(sp->dt));
  fprintf(f, ", \"dims\": [%lld", (long long)c->d[0]);
  for (int i = 1; i < 4 && c->d[i]; i++) fprintf(f, ", %lld", (long long)c->d[i]);
  fputs("], \"shape\": ", f);
  bench_json_str(f, c->shape);
  fputs(", \"note\": ", f);
  bench_json_str(f, sp->note);
  fprintf(f, ",\n     \"ceiling\": %s, \"bound\": \"%s\", ",
          c->role == BC_COPY ? "\"copy\"" : c->role != BC_NONE ? "\"gemm\"" : "null",
          c->flops > 0 ? "compute" : "memory");
  if (sp->kind == BK_ADAMW) fprintf(f, "\"params\": %lld, \"param_tensors\": %lld, ",
                                    (long long)c->n_params, (long long)c->n_tensors);
  bench_json_num(f, "bytes", c->bytes, ", ");
  bench_json_num(f, "flops", c->flops, ", ");
  bench_json_num(f, "set_bytes", c->set_bytes, ", ");
  fprintf(f, "\"sets\": %d, \"reps\": %d,\n     \"status\": \"%s\", \"error\": ", c->n_sets,
          c->reps, !c->ran ? "not_run" : c->status ? "failed" : "ok");
  if (c->status) bench_json_str(f, c->error);
  else fputs("null", f);
  fputs(", ", f);
  int ok = c->ran && !c->status;
  bench_json_num(f, "ms_median", ok ? c->ms_median : NAN, ", ");
  bench_json_num(f, "ms_min", ok ? c->ms_min : NAN, ", ");
  bench_json_num(f, "ms_mean", ok ? c->ms_mean : NAN, ", ");
  bench_json_num(f, "gb_per_s", ok ? c->gbs : NAN, ", ");
  bench_json_num(f, "tflop_per_s", ok && c->flops > 0 ? c->tflops : NAN, ", ");
  bench_json_num(f, "frac_copy_bw", c->frac_bw, ", ");
  bench_json_num(f, "frac_gemm", c->frac_gemm, ", ");
  bench_json_num(f, "sm_mhz", ok ? c->sm_mhz : NAN, ", ");
  bench_json_num(f, "watts", ok ? c->watts : NAN, "}");
}

int bench_write_json(const char *path, const bench_meta *m, const bench_opts *o,
                            bench_case **run, int n) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs("{\n  \"tool\": \"nabla bench\",\n  \"device\": ", f);
  bench_json_str(f, m->device);
  fputs(",\n  \"device_name\": ", f);
  bench_json_str(f, m->device_name);
  fputs(",\n  \"date\": ", f);
  bench_json_str(f, m->date);
  fputs(",\n  \"git_commit\": ", f);
  if (m->commit[0]) bench_json_str(f, m->commit);
  else fputs("null", f);
  fprintf(f, ",\n  \"quick\": %s, \"deterministic\": %s, \"autotune\": %s, \"cpu_threads\": %d,\n  ",
          o->quick ? "true" : "false", nb_deterministic() ? "true" : "false",
          o->tuning ? "true" : "false", m->threads);
  fputs("\"autotune_force\": ", f);
  if (nb_tune_forced_name()) bench_json_str(f, nb_tune_forced_name());
  else fputs("null", f);
  fputs(", ", f);
  bench_json_num(f, "rotate_bytes", o->rotate_bytes, ", ");
  bench_json_num(f, "warm_ms", o->warm_ms, ", ");
  bench_json_num(f, "target_ms", o->target_ms, ",\n  ");
  fputs("\"timing\": \"device events around each run (CPU: host clock); median of reps after "
        "warm-up; each run in its own scope, nabla's host overhead included\",\n  ", f);
  fputs("\"ceilings\": {", f);
  bench_json_num(f, "copy_gb_per_s", m->copy_gbs, ", ");
  bench_json_num(f, "gemm_tflop_per_s", m->gemm_tflops, ", ");
  fputs("\"gemm_case\": ", f);
  bench_json_str(f, m->gemm_id ? m->gemm_id : "");
  fputs("},\n  \"cases\": [\n", f);
  for (int i = 0; i < n; i++) {
    bench_json_case(f, run[i]);
    fputs(i + 1 < n ? ",\n" : "\n", f);
  }
  fputs("  ]\n}\n", f);
  return fclose(f) == 0 ? 0 : -1;
}

int bench_write_md(const char *path, const bench_meta *m, bench_case **run, int n) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f, "# nabla bench: %s (%s)\n\n", m->device_name, m->device);
  fprintf(f, "Date %s, commit %s. Copy ceiling %.1f GB/s, GEMM ceiling %.2f TFLOP/s (%s), "
          "both measured in this run. Times are medians of device-event timings and include "
          "nabla's per-op host overhead.\n\n",
          m->date, m->commit[0] ? m->commit : "unknown", m->copy_gbs, m->gemm_tflops,
          m->gemm_id ? m->gemm_id : "-");
  fputs("|", f);
  for (int i = 0; i < 9; i++) fprintf(f, " %s |", bench_hdr[i]);
  fputs("\n|---|---|---|--:|--:|--:|--:|--:|---|\n", f);
  for (int i = 0; i < n; i++) {
    char cells[9][BENCH_CELL];
    bench_row_cells(run[i], cells);
    fputs("|", f);
    for (int j = 0; j < 9; j++) fprintf(f, " %s |", cells[j]);
    fputs("\n", f);
  }
  for (int i = 0; i < n; i++)
    if (run[i]->status) fprintf(f, "\n- `%s` failed: %s\n", run[i]->id, run[i]->error);
  return fclose(f) == 0 ? 0 : -1;
}
