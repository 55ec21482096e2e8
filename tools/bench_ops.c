/* `nabla bench --ops`: a case for every op-table entry that names a
 * benchmark call (nb_op's bench_in and bench_p): its inputs built from the
 * entry's input spec (bf16 reals on CUDA, f32 on the CPU with every size
 * over 64 divided by 8), its bytes and FLOPs from the entry's cost, and one
 * forward call through the eager path per run. The entries without one are
 * listed, so an op with no benchmark is visible. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/bench_api.h"
#include "bench.h"
#include "graph/op.h"

#define BENCH_OP_CPU_DIV 8

static bench_spec op_specs[512];

static nb_dtype op_dtype(const bench_opts *o) { return o->dev.type == NB_CUDA ? NB_BF16 : NB_F32; }

static int op_specs_of(const bench_case *c, nb_op_spec *spec) {
  const nb_op *op = c->op;
  return nb_op_spec_parse(op->bench_in, spec, BENCH_MAX_IN, (int)c->d[0]);
}

int bench_op_build(const bench_opts *o, bench_case *all, int n, int max) {
  for (int i = 0; i < nb_op_count && n < max && i < (int)(sizeof op_specs / sizeof op_specs[0]); i++) {
    const nb_op *op = nb_op_table[i];
    if (!op->bench_in) continue;
    bench_spec *sp = &op_specs[i];
    memset(sp, 0, sizeof *sp);
    sp->kind = BK_OP;
    sp->dt = op_dtype(o);
    sp->note = nb_op_kind_name(op->kind);
    bench_case *c = &all[n++];
    memset(c, 0, sizeof *c);
    c->spec = sp;
    c->op = op;
    c->d[0] = o->dev.type == NB_CUDA ? 1 : BENCH_OP_CPU_DIV; /* the spec's divisor */
    nb_op_spec spec[BENCH_MAX_IN];
    c->op_n_in = op_specs_of(c, spec);
    bench_describe(c);
    bench_count(c);
    c->frac_bw = c->frac_gemm = NAN;
  }
  return n;
}

void bench_op_missing(FILE *f) {
  int k = 0;
  for (int i = 0; i < nb_op_count; i++)
    if (!nb_op_table[i]->bench_in) fprintf(f, "%s%s", k++ ? ", " : "no benchmark entry: ", nb_op_table[i]->name);
  if (k) fprintf(f, " (%d of %d ops)\n", k, nb_op_count);
}

void bench_op_describe(bench_case *c) {
  const nb_op *op = c->op;
  nb_op_spec spec[BENCH_MAX_IN];
  int n = op_specs_of(c, spec);
  char *s = c->shape;
  size_t left = sizeof c->shape;
  for (int i = 0; i < n && left > 1; i++) {
    if (spec[i].kind == '-' || spec[i].kind == 's') continue;
    int w = snprintf(s, left, "%s", s == c->shape ? "" : ",");
    for (int d = 0; d < spec[i].nd && w >= 0 && (size_t)w < left; d++)
      w += snprintf(s + w, left - (size_t)w, "%s%lld", d ? "x" : "", (long long)spec[i].shape[d]);
    if (w < 0 || (size_t)w >= left) break;
    s += w;
    left -= (size_t)w;
  }
  snprintf(c->name, sizeof c->name, "%s", op->name);
  snprintf(c->id, sizeof c->id, "op:%s:%s:%s", op->name, c->shape, nb_dtype_name(c->spec->dt));
}

/* set_bytes from the spec; bytes and FLOPs come from the op's cost once the
 * first input set exists (bench_op_setup). */
void bench_op_count(bench_case *c) {
  nb_op_spec spec[BENCH_MAX_IN];
  int n = op_specs_of(c, spec);
  double b = 0;
  for (int i = 0; i < n; i++) {
    if (spec[i].kind == '-') continue;
    size_t es = spec[i].kind == 'i' ? 8 : spec[i].kind == 'b' ? 1 : spec[i].kind == 's' ? 4
                                                                    : nb_dtype_size(c->spec->dt);
    b += (double)nb_shape_numel(spec[i].nd, spec[i].shape) * (double)es;
  }
  c->set_bytes = b;
}

nb_status bench_op_setup(bench_case *c, int s, nb_rng *rng, nb_device dev) {
  const nb_op *op = c->op;
  nb_op_spec spec[BENCH_MAX_IN];
  int n = op_specs_of(c, spec);
  if (n < 0) return bench_fail();
  for (int i = 0; i < n; i++) {
    c->t[s][i] = nb_op_spec_input(&spec[i], rng, c->spec->dt, dev);
    if (!c->t[s][i] && spec[i].kind != '-') return bench_fail();
  }
  if (s == 0) { /* the op's own count of bytes and FLOPs */
    nb_op_call call = {op, n, (const nb_tensor *const *)c->t[0], op->bench_p};
    nb_meta m;
    if (op->infer(&call, &m)) return bench_fail();
    nb_op_cost(&call, &m, &c->bytes, &c->flops);
  }
  return NB_OK;
}

nb_status bench_op_step(bench_case *c, int s) {
  const nb_op *op = c->op;
  nb_tensor *outs[NB_OP_MAX_OUT];
  return nb_op_run_outs(op, c->op_n_in, (const nb_tensor *const *)c->t[s], op->bench_p, outs);
}
