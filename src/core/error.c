/* Errors: one message and status per thread, readable with nb_last_error. */
#include <stdarg.h>
#include <stdio.h>

#include "core/core.h"

static _Thread_local char err_msg[1024];
static _Thread_local nb_status err_status = NB_OK;

nb_status nb_error_set(nb_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_msg, sizeof err_msg, fmt, ap);
  va_end(ap);
  err_status = st;
  return st;
}

nb_status nb_error_null(const char *op, const char *name) {
  if (err_status == NB_OK)
    nb_error_set(NB_ERR_NULL, "%s: argument '%s' is NULL", op, name);
  return NB_ERR_NULL;
}

int nb_error_pending(void) { return err_status != NB_OK; }
const char *nb_last_error(void) { return err_msg; }
nb_status nb_last_status(void) { return err_status; }

void nb_clear_error(void) {
  err_msg[0] = 0;
  err_status = NB_OK;
}

const char *nb_status_name(nb_status s) {
  switch (s) {
  case NB_OK: return "ok";
  case NB_ERR_NULL: return "null argument";
  case NB_ERR_DTYPE: return "dtype error";
  case NB_ERR_SHAPE: return "shape error";
  case NB_ERR_AXIS: return "axis error";
  case NB_ERR_DEVICE: return "device error";
  case NB_ERR_INDEX: return "index error";
  case NB_ERR_VALUE: return "value error";
  case NB_ERR_GRAD: return "autograd error";
  case NB_ERR_OOM: return "out of memory";
  case NB_ERR_IO: return "i/o error";
  case NB_ERR_BACKEND: return "backend error";
  case NB_ERR_UNSUPPORTED: return "unsupported";
  }
  return "unknown";
}
