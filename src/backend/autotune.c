/* Autotuning cache: see autotune.h. The table is a small array searched
 * linearly (a process sees few problem classes); the file is read once,
 * lazily, and each new choice is appended with one write under an O_APPEND
 * descriptor, so concurrent processes do not interleave inside a line. A
 * file that was ignored (bad or another version) is replaced by the first
 * new choice. */
#include "backend/autotune.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NBT_VERSION "nabla-autotune 1"
#define NBT_KEYMAX 192
#define NBT_REPEATS 3

typedef struct {
  char key[NBT_KEYMAX];
  int index;
  char name[64]; /* the candidate's name when the line had one: it wins over index */
  int long_name;  /* the line's name did not fit: no candidate has it */
} nbt_entry;

static pthread_mutex_t nbt_mu = PTHREAD_MUTEX_INITIALIZER;
static nbt_entry *nbt_tab;
static int nbt_n, nbt_cap, nbt_loaded;
static int nbt_bad; /* the file was ignored: the next write replaces it */
static int nbt_forced = -1;
/* 0: not loaded; 1: loaded, tuning off and nothing cached; 2: otherwise.
 * Read without the lock by nb_tune_active, the kernels' fast path. */
static _Atomic int nbt_state;
static int nbt_on; /* NABLA_AUTOTUNE=1 when the cache was loaded */
static char nbt_force_name[64]; /* NABLA_AUTOTUNE_FORCE when the cache was loaded; "" if unset */

int64_t nb_tune_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n && p < ((int64_t)1 << 62)) p <<= 1;
  return p;
}

char *nb_tune_key(char *buf, size_t cap, const char *device, const char *op,
                  const char *dtype, const char *layout, int ndim, const int64_t *dims) {
  if (!buf || !cap || !device || !op || !dtype || !layout || ndim < 0 || (ndim && !dims))
    return NULL;
  int w = snprintf(buf, cap, "%s/%s/%s/%s/", device, op, dtype, layout);
  for (int i = 0; i < ndim && w >= 0 && (size_t)w < cap; i++)
    w += snprintf(buf + w, cap - (size_t)w, "%s%lld", i ? "x" : "", (long long)nb_tune_pow2(dims[i]));
  if (w < 0 || (size_t)w >= cap) return NULL;
  for (char *c = buf; *c; c++)
    if (*c == '\t' || *c == '\n' || *c == ' ') *c = '_';
  return buf;
}

static int nbt_env_on(void) {
  const char *e = getenv("NABLA_AUTOTUNE");
  return e && strcmp(e, "1") == 0;
}

/* NABLA_AUTOTUNE_FORCE into nbt_force_name ("" when unset or too long). */
static void nbt_env_force(void) {
  const char *e = getenv("NABLA_AUTOTUNE_FORCE");
  nbt_force_name[0] = 0;
  if (e && strlen(e) < sizeof nbt_force_name) snprintf(nbt_force_name, sizeof nbt_force_name, "%s", e);
  else if (e) fprintf(stderr, "nabla: ignoring NABLA_AUTOTUNE_FORCE (longer than a candidate name)\n");
}

/* The candidate named NABLA_AUTOTUNE_FORCE among names[0..n), or -1. */
static int nbt_force_index(int n, const char *const *names) {
  if (!nbt_force_name[0] || !names) return -1;
  for (int i = 0; i < n; i++)
    if (names[i] && strcmp(names[i], nbt_force_name) == 0) return i;
  return -1;
}

/* The cache file's path into buf; 0 when none can be formed. */
static int nbt_path(char *buf, size_t cap, int mkdirs) {
  const char *e = getenv("NABLA_AUTOTUNE_CACHE");
  if (e && *e) return snprintf(buf, cap, "%s", e) < (int)cap;
  const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
  int w;
  if (x && *x) w = snprintf(buf, cap, "%s/nabla", x);
  else if (h && *h) w = snprintf(buf, cap, "%s/.cache/nabla", h);
  else return 0;
  if (w < 0 || (size_t)w >= cap) return 0;
  if (mkdirs) {
    if (!(x && *x)) { /* $HOME/.cache first */
      char *s = strrchr(buf, '/');
      *s = 0;
      mkdir(buf, 0755);
      *s = '/';
    }
    mkdir(buf, 0755);
  }
  return snprintf(buf + w, cap - (size_t)w, "/autotune.txt") < (int)(cap - (size_t)w);
}

static nbt_entry *nbt_find(const char *key) {
  for (int i = 0; i < nbt_n; i++)
    if (strcmp(nbt_tab[i].key, key) == 0) return &nbt_tab[i];
  return NULL;
}

/* Sets key's choice in the table (the later line wins); name may be NULL or
 * "". 0 on no memory. */
static int nbt_set(const char *key, int index, const char *name) {
  nbt_entry *e = nbt_find(key);
  if (!e) {
    if (nbt_n == nbt_cap) {
      int nc = nbt_cap ? 2 * nbt_cap : 16;
      nbt_entry *t = realloc(nbt_tab, (size_t)nc * sizeof *t);
      if (!t) return 0;
      nbt_tab = t;
      nbt_cap = nc;
    }
    e = &nbt_tab[nbt_n++];
    snprintf(e->key, sizeof e->key, "%s", key);
  }
  e->index = index;
  e->long_name = name && strlen(name) >= sizeof e->name;
  snprintf(e->name, sizeof e->name, "%s", name && !e->long_name ? name : "");
  return 1;
}

/* The candidate e chose among names[0..n): the one of its name when the
 * line had one (a list that gained or lost candidates since keeps the
 * choice; a name no longer listed is no choice), else its index; -1 for
 * none. */
static int nbt_choice(const nbt_entry *e, int n, const char *const *names) {
  if (!e || e->long_name) return -1;
  if (e->name[0] && names) {
    for (int i = 0; i < n; i++)
      if (names[i] && strcmp(names[i], e->name) == 0) return i;
    return -1;
  }
  return e->index < n ? e->index : -1;
}

/* Parses "key\tindex\tname" (name may be empty or absent); 0 when malformed. */
static int nbt_parse(char *line, char **key, int *index, char **name) {
  char *t1 = strchr(line, '\t');
  if (!t1 || t1 == line || t1 - line >= NBT_KEYMAX) return 0;
  *t1 = 0;
  char *end;
  errno = 0;
  long v = strtol(t1 + 1, &end, 10);
  if (errno || end == t1 + 1 || (*end != '\t' && *end != '\n' && *end) || v < 0 || v > 1000000)
    return 0;
  *key = line;
  *index = (int)v;
  *name = *end == '\t' ? end + 1 : end;
  (*name)[strcspn(*name, "\t\r\n")] = 0; /* up to a further field or a CRLF ending */
  return 1;
}

static void nbt_load_file(void);

static void nbt_load(void) {
  nbt_loaded = 1;
  nbt_on = nbt_env_on();
  nbt_env_force();
  nbt_load_file();
  atomic_store(&nbt_state, nbt_on || nbt_n || nbt_forced >= 0 || nbt_force_name[0] ? 2 : 1);
}

static void nbt_load_file(void) {
  char path[1024], line[512];
  if (!nbt_path(path, sizeof path, 0)) return;
  FILE *f = fopen(path, "r");
  if (!f) return; /* absent: nothing cached yet */
  int bad = !fgets(line, sizeof line, f) || strncmp(line, NBT_VERSION "\n", sizeof NBT_VERSION) != 0;
  while (!bad && fgets(line, sizeof line, f)) {
    char *key, *name;
    int index;
    if (strcmp(line, NBT_VERSION "\n") == 0) continue; /* two first writers raced */
    if (!strchr(line, '\n') && !feof(f)) bad = 1; /* over-long line */
    else if (!nbt_parse(line, &key, &index, &name)) bad = 1;
    else if (!nbt_set(key, index, name)) break;
  }
  fclose(f);
  if (bad) {
    fprintf(stderr, "nabla: ignoring autotune cache %s (unreadable or another version)\n", path);
    nbt_n = 0;
    nbt_bad = 1;
  }
}

/* Appends one choice to the file, writing the header when it is new. */
static void nbt_append(const char *key, int index, const char *name) {
  char path[1024], line[NBT_KEYMAX + 128];
  if (!nbt_path(path, sizeof path, 1)) return;
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | (nbt_bad ? O_TRUNC : 0), 0644);
  nbt_bad = 0;
  if (fd < 0) {
    fprintf(stderr, "nabla: cannot write autotune cache %s: %s\n", path, strerror(errno));
    return;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && st.st_size == 0 && write(fd, NBT_VERSION "\n", sizeof NBT_VERSION) < 0) {
    close(fd);
    return;
  }
  int w = snprintf(line, sizeof line, "%s\t%d\t%s\n", key, index, name ? name : "");
  if (w > 0 && (size_t)w < sizeof line && write(fd, line, (size_t)w) != w)
    fprintf(stderr, "nabla: short write to autotune cache %s\n", path);
  close(fd);
}

static int nbt_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The fastest candidate by its median of NBT_REPEATS runs (into *best), or
 * -1 where none ran (each returned -1 once: a candidate the kernel skips, or
 * a failure) or there is no memory. The runs go in rounds: one warm-up run
 * of every candidate, then NBT_REPEATS rounds of one run of each, so every
 * candidate is timed in each stretch of the tuning. A GPU under load lowers
 * its clock as it warms (the H100 from about 1980 MHz to 1500-1750 within
 * the first seconds of full load): timed one after another, the later
 * candidates would run slower for that alone. */
static int nbt_fastest(nb_tune_time_fn fn, void *ctx, int n, double *best) {
  double *t = malloc((size_t)n * NBT_REPEATS * sizeof *t); /* candidate i's runs at t + i R; t[i R] < 0: out */
  if (!t) return -1;
  for (int i = 0; i < n; i++) t[i * NBT_REPEATS] = fn(ctx, i) < 0 ? -1 : 0; /* warm-up */
  for (int r = 0; r < NBT_REPEATS; r++)
    for (int i = 0; i < n; i++)
      if (t[i * NBT_REPEATS] >= 0) {
        double x = fn(ctx, i);
        t[i * NBT_REPEATS + (x < 0 ? 0 : r)] = x;
      }
  int pick = -1;
  for (int i = 0; i < n; i++) {
    double *ti = t + (size_t)i * NBT_REPEATS;
    if (ti[0] < 0) continue;
    qsort(ti, NBT_REPEATS, sizeof *ti, nbt_cmp);
    if (pick < 0 || ti[NBT_REPEATS / 2] < *best) *best = ti[NBT_REPEATS / 2], pick = i;
  }
  free(t);
  return pick;
}

int nb_tune_pick(const char *key, int n, const char *const *names, nb_tune_time_fn time_fn,
                 void *ctx, int heuristic) {
  if (n < 1) return 0;
  if (heuristic < 0 || heuristic >= n) heuristic = 0;
  if (!key || strlen(key) >= NBT_KEYMAX || strchr(key, '\t') || strchr(key, '\n'))
    return heuristic;
  pthread_mutex_lock(&nbt_mu);
  if (nbt_forced >= 0) {
    int f = nbt_forced < n ? nbt_forced : heuristic;
    pthread_mutex_unlock(&nbt_mu);
    return f;
  }
  if (!nbt_loaded) nbt_load();
  int named = nbt_force_index(n, names);
  if (named >= 0) { /* NABLA_AUTOTUNE_FORCE names one of this kernel's candidates */
    pthread_mutex_unlock(&nbt_mu);
    return named;
  }
  int pick = nbt_choice(nbt_find(key), n, names);
  pthread_mutex_unlock(&nbt_mu);
  if (pick >= 0) return pick;
  if (!nb_tune_enabled() || !time_fn) return heuristic;
  /* Timing runs outside the lock: time_fn may itself run parallel kernels. */
  double best = -1;
  pick = nbt_fastest(time_fn, ctx, n, &best);
  if (pick < 0) pick = heuristic;
  pthread_mutex_lock(&nbt_mu);
  int first = nbt_choice(nbt_find(key), n, names);
  const char *name = names ? names[pick] : NULL;
  if (first >= 0) pick = first; /* another thread was first */
  else if (best >= 0 && nbt_set(key, pick, name)) nbt_append(key, pick, name);
  pthread_mutex_unlock(&nbt_mu);
  return pick;
}

int nb_tune_enabled(void) {
  pthread_mutex_lock(&nbt_mu);
  if (!nbt_loaded) nbt_load();
  int on = nbt_on;
  pthread_mutex_unlock(&nbt_mu);
  return on;
}

int nb_tune_active(void) {
  int s = atomic_load(&nbt_state);
  if (s == 0) {
    pthread_mutex_lock(&nbt_mu);
    if (!nbt_loaded) nbt_load();
    pthread_mutex_unlock(&nbt_mu);
    s = atomic_load(&nbt_state);
  }
  return s == 2;
}

double nb_tune_sample_seconds(void) {
  const char *e = getenv("NABLA_AUTOTUNE_SAMPLE_US");
  char *end;
  double us = e && e[0] ? strtod(e, &end) : 1000.0;
  if (!e || !e[0] || *end || !(us >= 0) || us > 1e6) us = 1000.0; /* unset or not a duration */
  return us * 1e-6;
}

const char *nb_tune_forced_name(void) {
  pthread_mutex_lock(&nbt_mu);
  if (!nbt_loaded) nbt_load();
  const char *r = nbt_force_name[0] ? nbt_force_name : NULL;
  pthread_mutex_unlock(&nbt_mu);
  return r;
}

void nb_tune_reset(void) {
  pthread_mutex_lock(&nbt_mu);
  free(nbt_tab);
  nbt_tab = NULL;
  nbt_force_name[0] = 0;
  nbt_n = nbt_cap = nbt_loaded = nbt_bad = nbt_on = 0;
  atomic_store(&nbt_state, 0);
  pthread_mutex_unlock(&nbt_mu);
}

void nb_tune_force(int i) {
  pthread_mutex_lock(&nbt_mu);
  nbt_forced = i;
  if (i >= 0 && nbt_loaded) atomic_store(&nbt_state, 2);
  pthread_mutex_unlock(&nbt_mu);
}
