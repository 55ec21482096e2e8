/* The kernel profiler (nb_profile_* in nabla.h).
 *
 * While it is on, nb_backend_for hands out a proxy of the device's backend
 * whose kernel entries time the real kernel between two events (nb_event:
 * device events in the CUDA stream, the host clock on the CPU) and log the
 * pair under the kernel's name and phase. Memory and transfer entries are
 * the real ones. Nothing waits while profiling: nb_profile_stop
 * synchronises the devices it saw once, then reads every pair and adds up
 * per (name, phase). A kernel entry that calls another backend entry (none
 * do today) is timed once, at the outermost call.
 *
 * State is process-wide and meant for one thread driving the devices, as
 * nabla's ops are; the calling device of a proxied entry is the one
 * nb_backend_for was last asked for on this thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/core.h"

typedef struct { /* one timed kernel, resolved at stop */
  nb_event *start, *end;
  const char *name;
  int bwd;
} nbp_mark;

typedef struct { /* the totals of one (name, phase) */
  const char *name;
  int bwd;
  int64_t calls;
  double ms;
} nbp_stat;

static int nbp_on, nbp_have; /* profiling; a stopped profile holds totals */
static int nbp_paused;       /* nb_profile_pause(1): nothing timed, wall clock stopped */
static double nbp_pause_start, nbp_paused_ms;
static nbp_mark *nbp_log;
static int64_t nbp_n, nbp_cap;
static nbp_stat *nbp_stats;
static int nbp_nstats, nbp_capstats;
static double nbp_wall_start, nbp_wall_ms;
static int nbp_failed; /* an event could not be had: timings incomplete */
static int nbp_bwd_depth;
static _Thread_local nb_device nbp_dev;
static _Thread_local int nbp_depth;
static int nbp_seen[2][64]; /* devices used while profiling: [cpu, cuda][index] */
static nb_backend nbp_proxy[2];
static const nb_backend *nbp_real[2];

#define NB_EW_NAME(ID, KNAME, ...) KNAME,
#define NB_EW_NAME_C(ID, NAME, EXPR) #NAME,
const char *const nb_uop_names[NB_UOP_COUNT] = {
    NB_UOP_LIST(NB_EW_NAME) NB_UOP_DERIVATIVE_LIST(NB_EW_NAME)};
const char *const nb_bop_names[NB_BOP_COUNT] = {
    NB_BOP_LIST(NB_EW_NAME) NB_BOP_DERIVATIVE_LIST(NB_EW_NAME) NB_CMP_LIST(NB_EW_NAME_C)};
#undef NB_EW_NAME
#undef NB_EW_NAME_C
#define NB_EW_TEXT_U(ID, KNAME, NAME, INT, SAVE, EXPR, ...) #EXPR,
#define NB_EW_TEXT_D(ID, KNAME, NODE, EXPR) #EXPR,
#define NB_EW_TEXT_B(ID, KNAME, NAME, INT, EXPR, ...) #EXPR,
#define NB_EW_TEXT_C(ID, KNAME, EXPR) #EXPR,
const char *const nb_uop_expr_text[NB_UOP_COUNT] = {
    NB_UOP_LIST(NB_EW_TEXT_U) NB_UOP_DERIVATIVE_LIST(NB_EW_TEXT_D)};
const char *const nb_bop_expr_text[NB_BOP_COUNT] = {
    NB_BOP_LIST(NB_EW_TEXT_B) NB_BOP_DERIVATIVE_LIST(NB_EW_TEXT_B) NB_CMP_LIST(NB_EW_TEXT_C)};
#undef NB_EW_TEXT_U
#undef NB_EW_TEXT_D
#undef NB_EW_TEXT_B
#undef NB_EW_TEXT_C
const char *const nb_rop_names[NB_ROP_COUNT] = {"sum", "max", "min", "argmax", "argmin"};

/* ---- timing a proxied call -------------------------------------------------- */
static int nbp_begin(nbp_mark *m, const char *name) {
  if (nbp_depth++ || !nbp_on || nbp_paused) return 0;
  m->name = name;
  m->bwd = nbp_bwd_depth > 0;
  m->end = NULL;
  m->start = nb_event_record(nbp_dev);
  if (!m->start) nb_clear_error();
  return 1;
}

/* Closes a timed call whose kernel returned st. A failed kernel is not
 * logged and its error stays the pending one; an event that cannot be had
 * leaves a gap in the profile, noted in the report, and no error. */
static void nbp_end(nbp_mark *m, int timed, nb_status st) {
  nbp_depth--;
  if (!timed) return;
  if (st != NB_OK || !m->start) {
    nb_event_free(m->start);
    if (!m->start) nbp_failed = 1;
    return;
  }
  m->end = nb_event_record(nbp_dev);
  if (!m->end) {
    nb_clear_error();
    nb_event_free(m->start);
    nbp_failed = 1;
    return;
  }
  if (nbp_n == nbp_cap) {
    int64_t nc = nbp_cap ? 2 * nbp_cap : 1024;
    nbp_mark *t = realloc(nbp_log, (size_t)nc * sizeof *t);
    if (!t) {
      nb_event_free(m->start);
      nb_event_free(m->end);
      nbp_failed = 1;
      return;
    }
    nbp_log = t;
    nbp_cap = nc;
  }
  nbp_log[nbp_n++] = *m;
}

#define NBP_REAL (nbp_real[nbp_dev.type == NB_CUDA])
/* A proxied entry: times REAL->CALL under NAME. */
#define NBP_TIMED(NAME, CALL)                    \
  nbp_mark mark_;                                \
  int timed_ = nbp_begin(&mark_, (NAME));        \
  nb_status st_ = NBP_REAL->CALL;                \
  nbp_end(&mark_, timed_, st_);                  \
  return st_

/* One timed proxy nbp_NAME per kernel entry of backend_entries.h. */
#define NB_BACKEND_KERNEL(NAME, PARAMS, ARGS, PROF) \
  static nb_status nbp_##NAME PARAMS { NBP_TIMED(PROF, NAME ARGS); }
#include "backend/backend_entries.h"

/* The proxy of real: its kernel entries timed, absent ones left absent. */
static void nbp_build(nb_backend *px, const nb_backend *r) {
  *px = *r;
#define NB_BACKEND_KERNEL(NAME, PARAMS, ARGS, PROF) px->NAME = r->NAME ? nbp_##NAME : NULL;
#include "backend/backend_entries.h"
}

const nb_backend *nb_profile_wrap(const nb_backend *real, nb_device dev) {
  if (!nbp_on || !real) return real;
  int k = dev.type == NB_CUDA;
  if (nbp_real[k] != real) {
    nbp_real[k] = real;
    nbp_build(&nbp_proxy[k], real);
  }
  nbp_dev = dev;
  if (dev.index >= 0 && dev.index < 64) nbp_seen[k][dev.index] = 1;
  return &nbp_proxy[k];
}

void nb_profile_backward(int enter) { nbp_bwd_depth += enter ? 1 : -1; }

/* ---- the profile ----------------------------------------------------------- */
static void nbp_free_log(void) {
  for (int64_t i = 0; i < nbp_n; i++) {
    nb_event_free(nbp_log[i].start);
    nb_event_free(nbp_log[i].end);
  }
  free(nbp_log);
  nbp_log = NULL;
  nbp_n = nbp_cap = 0;
}

void nb_profile_reset(void) {
  nbp_on = nbp_have = nbp_failed = nbp_paused = 0;
  nbp_paused_ms = 0;
  nbp_free_log();
  free(nbp_stats);
  nbp_stats = NULL;
  nbp_nstats = nbp_capstats = 0;
  nbp_wall_ms = 0;
  memset(nbp_seen, 0, sizeof nbp_seen);
}

nb_status nb_profile_start(void) {
  if (nbp_on) return nb_error_set(NB_ERR_VALUE, "nb_profile_start: a profile is already running");
  nb_profile_reset();
  nbp_on = 1;
  nbp_wall_start = nb_host_ms();
  return NB_OK;
}

int nb_profile_running(void) { return nbp_on; }

/* One wait for each device the profile used (so that the wall clock
 * covers their queued kernels). */
static nb_status nbp_sync_seen(void) {
  nb_status st = NB_OK;
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < 64; i++)
      if (nbp_seen[k][i] && !st) st = nb_device_synchronize(k ? nb_device_cuda(i) : NB_DEVICE_CPU);
  return st;
}

nb_status nb_profile_pause(int pause) {
  pause = pause != 0;
  if (!nbp_on) return nb_error_set(NB_ERR_VALUE, "nb_profile_pause: no profile is running");
  if (pause == nbp_paused)
    return nb_error_set(NB_ERR_VALUE, "nb_profile_pause(%d): the profile is already %s", pause,
                        pause ? "paused" : "running");
  if (pause) { /* the kernels timed so far end before the pause starts */
    nb_status st = nbp_sync_seen();
    if (st) return st;
    nbp_pause_start = nb_host_ms();
  } else {
    nbp_paused_ms += nb_host_ms() - nbp_pause_start;
  }
  nbp_paused = pause;
  return NB_OK;
}

/* The totals of (name, bwd), or NULL when it has none. */
static nbp_stat *nbp_find(const char *name, int bwd) {
  for (int i = 0; i < nbp_nstats; i++)
    if (nbp_stats[i].bwd == bwd && strcmp(nbp_stats[i].name, name) == 0) return &nbp_stats[i];
  return NULL;
}

/* The totals of (name, bwd), created on first use; NULL on no memory. */
static nbp_stat *nbp_stat_for(const char *name, int bwd) {
  nbp_stat *found = nbp_find(name, bwd);
  if (found) return found;
  if (nbp_nstats == nbp_capstats) {
    int nc = nbp_capstats ? 2 * nbp_capstats : 32;
    nbp_stat *t = realloc(nbp_stats, (size_t)nc * sizeof *t);
    if (!t) return NULL;
    nbp_stats = t;
    nbp_capstats = nc;
  }
  nbp_stat *s = &nbp_stats[nbp_nstats++];
  s->name = name;
  s->bwd = bwd;
  s->calls = 0;
  s->ms = 0;
  return s;
}

nb_status nb_profile_stop(void) {
  if (!nbp_on) return nb_error_set(NB_ERR_VALUE, "nb_profile_stop: no profile is running");
  if (nbp_paused) nbp_paused_ms += nb_host_ms() - nbp_pause_start;
  nbp_on = nbp_paused = 0;
  nb_status st = nbp_sync_seen(); /* then every pair is ready */
  nbp_wall_ms = nb_host_ms() - nbp_wall_start - nbp_paused_ms;
  for (int64_t i = 0; i < nbp_n && !st; i++) {
    double ms = nb_event_elapsed_ms(nbp_log[i].start, nbp_log[i].end);
    nbp_stat *s = nbp_stat_for(nbp_log[i].name, nbp_log[i].bwd);
    if (!s) st = nb_error_set(NB_ERR_OOM, "nb_profile_stop: out of memory");
    else if (ms < 0) nbp_failed = 1;
    else s->calls++, s->ms += ms;
  }
  nbp_free_log();
  nbp_have = !st;
  return st;
}

int nb_profile_stat(const char *name, int backward, int64_t *calls, double *ms) {
  const nbp_stat *s = name ? nbp_find(name, backward != 0) : NULL;
  *calls = s ? s->calls : 0;
  *ms = s ? s->ms : 0;
  return s != NULL;
}

static int nbp_by_time(const void *a, const void *b) {
  double x = ((const nbp_stat *)a)->ms, y = ((const nbp_stat *)b)->ms;
  return (x < y) - (x > y);
}

nb_status nb_profile_report(FILE *f) {
  if (!f) return nb_error_null("nb_profile_report", "f");
  if (nbp_on) return nb_error_set(NB_ERR_VALUE, "nb_profile_report: stop the profile first");
  if (!nbp_have) return nb_error_set(NB_ERR_VALUE, "nb_profile_report: no profile was taken");
  qsort(nbp_stats, (size_t)nbp_nstats, sizeof *nbp_stats, nbp_by_time);
  double total = 0;
  int64_t calls = 0;
  for (int i = 0; i < nbp_nstats; i++) total += nbp_stats[i].ms, calls += nbp_stats[i].calls;
  fprintf(f, "profile: %lld kernels, %.3f ms in kernels, %.3f ms wall clock%s\n", (long long)calls,
          total, nbp_wall_ms, nbp_failed ? " (some kernels could not be timed)" : "");
  fprintf(f, "%-24s %-5s %9s %12s %11s %7s\n", "kernel", "phase", "calls", "total ms", "mean us", "share");
  for (int i = 0; i < nbp_nstats; i++) {
    const nbp_stat *s = &nbp_stats[i];
    fprintf(f, "%-24s %-5s %9lld %12.3f %11.2f %6.1f%%\n", s->name, s->bwd ? "bwd" : "fwd",
            (long long)s->calls, s->ms, 1e3 * s->ms / (double)(s->calls ? s->calls : 1),
            total > 0 ? 100 * s->ms / total : 0.0);
  }
  return NB_OK;
}
