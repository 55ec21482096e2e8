/* The eager path of every primitive op (graph/op.h): check, autocast,
 * infer, prepare, allocate, forward, record. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

/* Input i's name in op's messages: its entry name, else "input i". */
static const char *in_name(const nb_op *op, int i, char *buf, size_t size) {
  if (i < NB_OP_MAX_IN && op->in_names[i]) return op->in_names[i];
  snprintf(buf, size, "input %d", i);
  return buf;
}

/* NULL inputs: required ones are an error naming the op and the position;
 * present ones must share one device. */
static nb_status check_inputs(const nb_op *op, int n, const nb_tensor *const *in) {
  if (n < op->n_in || (!op->variadic && n > op->n_in))
    return nb_error_set(NB_ERR_VALUE, "%s: %d inputs (expected %s%d)", op->name, n,
                        op->variadic ? "at least " : "", op->n_in);
  for (int i = 0; i < n; i++) {
    if (in[i] || (i >= op->n_in - op->n_opt && i < op->n_in)) continue;
    char what[24];
    return nb_error_null(op->name, in_name(op, i, what, sizeof what));
  }
  return nb_op_same_device(op->name, n, in);
}

/* fp8 tensors are storage: only the ops marked for them and views take them. */
static nb_status check_fp8(const nb_op *op, int n, const nb_tensor *const *in) {
  if (op->fp8 || op->kind == NB_OPK_VIEW) return NB_OK;
  for (int i = 0; i < n; i++) {
    if (!in[i] || !nb_dtype_is_fp8(in[i]->dtype)) continue;
    char what[24];
    return nb_error_set(NB_ERR_DTYPE, "%s: %s is %s, a storage-only dtype (fp8 tensors take casts, "
                        "copies, views and scaled_mm; cast to a wider float first)", op->name,
                        in_name(op, i, what, sizeof what), nb_dtype_name(in[i]->dtype));
  }
  return NB_OK;
}

/* ---- autocast ----------------------------------------------------------------
 * Inside nb_autocast_begin(low) .. nb_autocast_end() each call's float
 * inputs (f64 excepted, as in PyTorch) are cast by the op's precision
 * class before it is checked: NB_PREC_LOW to the low dtype, NB_PREC_F32 to
 * f32; NB_PREC_FOLLOW ops take their inputs as they come. The casts are
 * ordinary recorded ops, so gradients reach the f32 leaves. A leaf that
 * requires grad (a parameter) is cast once per region: later uses share the
 * first cast, as PyTorch's autocast cache does. */
typedef struct {
  const nb_tensor *src;
  nb_tensor *cast;
} ac_entry;

static _Thread_local struct {
  int depth;
  nb_dtype low;
  ac_entry *cache;
  int n, cap;
} ac;

nb_status nb_autocast_begin(nb_dtype low) {
  if (low != NB_BF16 && low != NB_F16)
    return nb_error_set(NB_ERR_DTYPE, "nb_autocast_begin: dtype %s (expected bf16 or f16)",
                        nb_dtype_name(low));
  if (ac.depth && low != ac.low)
    return nb_error_set(NB_ERR_VALUE, "nb_autocast_begin: %s inside an autocast region of %s",
                        nb_dtype_name(low), nb_dtype_name(ac.low));
  ac.depth++;
  ac.low = low;
  return NB_OK;
}

void nb_autocast_end(void) {
  if (!ac.depth || --ac.depth) return;
  for (int i = 0; i < ac.n; i++) nb_release(ac.cache[i].cast);
  free(ac.cache);
  ac.cache = NULL;
  ac.n = ac.cap = 0;
}

nb_dtype nb_autocast_dtype(void) { return ac.depth ? ac.low : NB_F32; }

/* The working copy of a parameter (nb_tensor.work): the optimizer's AdamW
 * pass writes x's values rounded to bf16/f16 into it as it updates x, so a
 * step under autocast needs no cast kernel for its parameters. Validity is
 * by write stamp: the copy stands for x only while x's storage carries the
 * stamp it had right after the copy was written (x->work_stamp); any other
 * in-place write (nb_copy_, nb_fill_: a checkpoint restored, a user's
 * write; nb_data_ptr for good) renews or clears the stamp, and x is cast
 * again. The cast stays a recorded node, on a new header sharing the
 * copy's bytes, so the gradient flows back to the f32 leaf as through a
 * cast; no kernel runs. NULL when x has no valid copy of dtype dt. */
extern const nb_op nb_op_cast;

static nb_tensor *ac_work(const nb_tensor *x, nb_dtype dt) {
  const nb_tensor *w = x->work;
  if (!w || w->dtype != dt || !x->work_stamp || x->work_stamp != x->storage->stamp) return NULL;
  nb_tensor *y = nb_tensor_view_of(w, w->ndim, w->shape, w->strides, w->offset);
  if (!y) return NULL; /* out of host memory: the cast still works */
  nb_dtype p = dt;     /* the cast's parameters: { nb_dtype } */
  nb_op_call c = {&nb_op_cast, 1, (const nb_tensor *const[]){x}, &p};
  nb_op_record(&c, y, NULL);
  return nb_autorelease(y);
}

/* The cast y = x in dt, made by a kernel, becomes x's working copy (a
 * header sharing y's bytes, with no history, so that no cycle forms
 * through y's node): the optimizer writes it from then on. */
static void ac_adopt(const nb_tensor *x, nb_tensor *y) {
  nb_tensor *w = nb_tensor_view_of(y, y->ndim, y->shape, y->strides, y->offset);
  if (!w) return;
  nb_tensor *px = (nb_tensor *)x; /* a leaf's bookkeeping, not its values */
  nb_release(px->work);
  px->work = w;
  px->work_stamp = x->storage->stamp;
}

/* x in dtype dt: cached for leaves that require grad. */
static const nb_tensor *ac_cast(const nb_tensor *x, nb_dtype dt) {
  /* a leaf requiring grad, with grad mode on: the cast's node keeps x alive,
   * so the cache's pointer cannot be reused by another tensor */
  int leaf = x->requires_grad && !x->grad_fn && nb_grad_enabled();
  for (int i = 0; leaf && i < ac.n; i++)
    if (ac.cache[i].src == x && ac.cache[i].cast->dtype == dt) return ac.cache[i].cast;
  nb_tensor *y = ac_work(x, dt);
  int fresh = !y;
  if (!y) y = nb_cast(x, dt);
  if (!y || !leaf) return y;
  if (fresh && nb_is_contiguous(y) && (dt == NB_BF16 || dt == NB_F16)) ac_adopt(x, y);
  if (ac.n == ac.cap) {
    int cap = ac.cap ? 2 * ac.cap : 64;
    ac_entry *e = realloc(ac.cache, (size_t)cap * sizeof *e);
    if (!e) return y; /* no cache: still correct */
    ac.cache = e;
    ac.cap = cap;
  }
  ac.cache[ac.n].src = x;
  ac.cache[ac.n++].cast = nb_retain(y);
  return y;
}

/* NB_PREC_WIDE ops (cross_entropy) read bf16/f16 themselves and compute in
 * f32: their inputs are left as they come, so no cast (nor its f32 copy)
 * is made or recorded. */
static nb_status autocast_inputs(const nb_op *op, int n, const nb_tensor **in) {
  if (!ac.depth || op->prec == NB_PREC_FOLLOW || op->prec == NB_PREC_WIDE) return NB_OK;
  nb_dtype want = op->prec == NB_PREC_LOW ? ac.low : NB_F32;
  for (int i = 0; i < n; i++) {
    const nb_tensor *x = in[i];
    if (!x || !nb_dtype_is_float(x->dtype) || x->dtype == NB_F64 || x->dtype == want) continue;
    if (!(in[i] = ac_cast(x, want))) return nb_last_status();
  }
  return NB_OK;
}

/* ---- the eager path ------------------------------------------------------------ */
#define NB_OP_AUX (NB_OP_MAX_OUT - 1 + NB_NODE_SAVED)

nb_status nb_op_run_outs(const nb_op *op, int n, const nb_tensor *const *in, const void *params,
                         nb_tensor **outs) {
  int n_out = op->n_out ? op->n_out : 1;
  for (int i = 0; i < n_out; i++) outs[i] = NULL;
  nb_status st = check_inputs(op, n, in);
  if (!st) st = check_fp8(op, n, in);
  if (st) return st;
  nb_scope_begin();
  /* a variadic op (cat) may have more inputs than the array on the stack */
  const nb_tensor *prep_fixed[NB_OP_MAX_IN], **prep = prep_fixed;
  nb_tensor *out = NULL, *aux[NB_OP_AUX] = {0};
  if (n > NB_OP_MAX_IN && !(prep = malloc((size_t)n * sizeof *prep))) {
    st = nb_error_set(NB_ERR_OOM, "%s: out of host memory for %d inputs", op->name, n);
    goto done;
  }
  if (n) memcpy(prep, in, (size_t)n * sizeof *in);
  nb_op_call c = {op, n, prep, params};
  nb_meta m;
  if ((st = autocast_inputs(op, n, prep)) || (st = op->infer(&c, &m))) goto done;
  if (op->prepare && (st = op->prepare(&c, prep))) goto done;
  if (op->view) {
    out = op->view(&c, &m);
  } else {
    out = nb_tensor_alloc(m.ndim, m.shape, m.dtype, m.device);
    if (out && (nb_numel(out) || op->always_forward) && op->forward(&c, out, aux)) {
      nb_release(out);
      out = NULL;
    }
  }
  if (!out) {
    st = nb_last_status();
    goto done;
  }
  outs[0] = out;
  for (int i = 1; i < n_out; i++) outs[i] = aux[i - 1], aux[i - 1] = NULL;
  for (int i = 0; i < n_out; i++) nb_op_record(&c, outs[i], aux + n_out - 1);
done:
  for (int i = 0; i < NB_OP_AUX; i++) nb_release(aux[i]);
  if (prep != prep_fixed) free(prep);
  nb_scope_end();
  for (int i = 0; i < n_out; i++) outs[i] = nb_autorelease(outs[i]);
  return st;
}

nb_tensor *nb_op_run(const nb_op *op, int n, const nb_tensor *const *in, const void *params) {
  nb_tensor *outs[NB_OP_MAX_OUT];
  return nb_op_run_outs(op, n, in, params, outs) ? NULL : outs[0];
}
