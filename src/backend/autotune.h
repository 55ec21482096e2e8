/* Autotuning cache: a process-wide table from a problem key (device, op,
 * dtype, layout, shape class) to the index of the chosen configuration among
 * a kernel's candidates. Backend-independent: a kernel lists its candidates,
 * supplies a timing function, and asks nb_tune_pick which one to run.
 *
 * With NABLA_AUTOTUNE=1 a key seen for the first time is tuned: each
 * candidate is timed (median of a few runs), the fastest is kept and appended
 * to the cache file. Otherwise a cached choice is used, else the caller's
 * heuristic, without timing. NABLA_AUTOTUNE_FORCE=NAME makes every kernel
 * with a candidate of that name run it (no timing, nothing cached; other
 * kernels are unaffected): for comparing schedules in separate runs of a
 * benchmark. The cache file is NABLA_AUTOTUNE_CACHE, else
 * $XDG_CACHE_HOME/nabla/autotune.txt, else $HOME/.cache/nabla/autotune.txt;
 * its lines are "key<TAB>index<TAB>name" after a version header. A cached
 * choice is the candidate of its name (so it survives candidates added to or
 * removed from a kernel's list; a name no longer listed is no choice), or of
 * its index where the line has no name. A bad file is ignored with one
 * warning. All functions are thread-safe. */
#ifndef NB_BACKEND_AUTOTUNE_H
#define NB_BACKEND_AUTOTUNE_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds for one run of candidate i, or a negative value when i cannot run
 * for this problem (it is skipped). */
typedef double (*nb_tune_time_fn)(void *ctx, int i);

/* Rounds n up to a power of two (n <= 1 gives 1). */
int64_t nb_tune_pow2(int64_t n);

/* Writes "device/op/dtype/layout/d0xd1x..." with each dim rounded up to a
 * power of two into buf (size cap). Returns buf, or NULL when it does not fit
 * or an argument is NULL. */
char *nb_tune_key(char *buf, size_t cap, const char *device, const char *op,
                  const char *dtype, const char *layout, int ndim, const int64_t *dims);

/* The configuration to use for key among n candidates (names[i] names
 * candidate i, may be NULL). See the header comment; a NULL key, n < 1 or a
 * NULL time_fn give heuristic (clamped into range). */
int nb_tune_pick(const char *key, int n, const char *const *names, nb_tune_time_fn time_fn,
                 void *ctx, int heuristic);

/* Whether NABLA_AUTOTUNE=1 (read when the cache is first loaded, and again
 * after nb_tune_reset). */
int nb_tune_enabled(void);

/* NABLA_AUTOTUNE_FORCE (read with NABLA_AUTOTUNE), or NULL when unset. The
 * string stays valid until nb_tune_reset. */
const char *nb_tune_forced_name(void);
/* Device time one timing sample should span (many short launches make one
 * sample, so launch gaps and clock ramps average out):
 * NABLA_AUTOTUNE_SAMPLE_US microseconds, default 1000; 0 times one launch
 * per sample (under compute-sanitizer every launch is instrumented and
 * slow). */
double nb_tune_sample_seconds(void);


/* Whether a pick can return anything but the heuristic: tuning is on, the
 * cache holds a choice or a choice is forced. A lock-free check, so a kernel
 * with tuning off pays for no key; it loads the cache on first use. */
int nb_tune_active(void);

/* Forgets the table; the next pick reloads the cache file (for tests and
 * for a changed NABLA_AUTOTUNE_CACHE). */
void nb_tune_reset(void);

/* Forces candidate i for every pick (-1: no forcing). For tests. */
void nb_tune_force(int i);

#ifdef __cplusplus
}
#endif
#endif
