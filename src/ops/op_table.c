/* The op table: every primitive's description, in op_list.h's order. */
#include <stdlib.h>
#include <string.h>

#include "ops/op_list.h"
#include "ops/ops.h"

#define NB_OP_DECLARE(name) extern const nb_op nb_op_##name;
NB_OP_LIST(NB_OP_DECLARE)

#define NB_OP_ENTRY(name) &nb_op_##name,
const nb_op *const nb_op_table[] = {NB_OP_LIST(NB_OP_ENTRY)};
const int nb_op_count = (int)(sizeof nb_op_table / sizeof nb_op_table[0]);

const nb_op *nb_op_find(const char *name) {
  for (int i = 0; i < nb_op_count; i++)
    if (!strcmp(nb_op_table[i]->name, name)) return nb_op_table[i];
  return NULL;
}

int nb_op_table_size(void) { return nb_op_count; }

nb_status nb_op_table_info(int i, nb_op_info *out) {
  if (!out) return nb_error_null("nb_op_table_info", "out");
  if (i < 0 || i >= nb_op_count)
    return nb_error_set(NB_ERR_VALUE, "nb_op_table_info: index %d (expected 0..%d)", i, nb_op_count - 1);
  const nb_op *op = nb_op_table[i];
  out->name = op->name;
  out->kind = nb_op_kind_name(op->kind);
  out->precision = nb_prec_class_name(op->prec);
  out->determinism = op->determinism;
  out->n_inputs = op->n_in;
  out->n_outputs = op->n_out ? op->n_out : 1;
  out->differentiable = op->backward != NULL && op->backward != nb_no_double_backward;
  out->has_benchmark = op->bench_in != NULL;
  return NB_OK;
}

/* ---- input specs (graph/op.h): the benchmark's and the tests' inputs ------ */
static int64_t spec_div(int64_t v, int div) { return div > 1 && v > 64 ? (v + div - 1) / div : v; }

int nb_op_spec_parse(const char *s, nb_op_spec *spec, int max, int div) {
  const char *start = s;
  int n = 0;
  while (s && *s) {
    if (n == max) return nb_error_set(NB_ERR_VALUE, "op spec '%s': more than %d inputs", start, max), -1;
    nb_op_spec *p = &spec[n++];
    memset(p, 0, sizeof *p);
    p->kind = *s++;
    if (!strchr("rpsib-", p->kind))
      return nb_error_set(NB_ERR_VALUE, "op spec '%s': input kind '%c' (expected r, p, s, i<k>, b or -)",
                          start, p->kind), -1;
    if (p->kind == 'i') {
      char *e;
      p->bound = spec_div(strtoll(s, &e, 10), div);
      if (e == s || p->bound < 1)
        return nb_error_set(NB_ERR_VALUE, "op spec '%s': i needs a bound >= 1", start), -1;
      s = e;
    }
    if (*s == ':') s++;
    while (*s && *s != ',') {
      char *e;
      long long v = strtoll(s, &e, 10);
      if (e == s || v < 0 || p->nd == NB_MAX_DIMS)
        return nb_error_set(NB_ERR_VALUE, "op spec '%s': bad shape at '%s'", start, s), -1;
      p->shape[p->nd++] = spec_div(v, div);
      s = *e == 'x' ? e + 1 : e;
    }
    if (*s == ',') s++;
  }
  return n;
}

nb_tensor *nb_op_spec_input(const nb_op_spec *spec, nb_rng *rng, nb_dtype dt, nb_device dev) {
  nb_tensor *t = NULL;
  nb_scope_begin();
  switch (spec->kind) {
  case 'r': t = nb_randn(rng, spec->nd, spec->shape, 0.0, 1.0, dt, dev); break;
  case 'p': t = nb_rand(rng, spec->nd, spec->shape, 0.5, 2.0, dt, dev); break;
  case 's': t = nb_rand(rng, spec->nd, spec->shape, 0.5, 2.0, dt == NB_F64 ? NB_F64 : NB_F32, dev); break;
  case 'i': t = nb_randint(rng, spec->nd, spec->shape, 0, spec->bound, NB_I64, dev); break;
  case 'b': t = nb_lt(nb_rand(rng, spec->nd, spec->shape, 0.0, 1.0, NB_F32, dev),
                      nb_scalar(0.5, NB_F32, dev));
    break;
  default: break;
  }
  if (t) nb_keep(t);
  nb_scope_end();
  return t;
}
