/* The CPU backend's table and memory functions. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/core.h"

/* Memory: 64-byte aligned, so vector loads of contiguous data never split a
 * cache line at the start of a tensor. Blocks of 64 KiB or more are cached
 * when freed and reused by size class (four classes per power of two, so at
 * most 25% is wasted): a training loop's steady state then neither calls the
 * system allocator for big buffers nor page-faults fresh memory every step.
 * The cache holds at most NABLA_CPU_CACHE_MB (default 1024) MiB. */
#define CACHE_MIN ((size_t)64 << 10)
#define CACHE_SLOTS 256

static struct {
  pthread_mutex_t lock;
  void *ptr[CACHE_SLOTS];
  size_t size[CACHE_SLOTS];
  int n;
  size_t bytes, cap;
} cache = {PTHREAD_MUTEX_INITIALIZER, {0}, {0}, 0, 0, 0};

/* Rounds n up to its size class: 2^k times 1, 1.25, 1.5 or 1.75. */
static size_t size_class(size_t n) {
  if (n < CACHE_MIN) return (n + 63) & ~(size_t)63;
  size_t p = CACHE_MIN;
  while (p * 2 <= n) p *= 2;
  size_t q = p / 4;
  return (n + q - 1) / q * q;
}

static size_t cache_cap(void) {
  if (!cache.cap) {
    const char *e = getenv("NABLA_CPU_CACHE_MB");
    long mb = e ? strtol(e, NULL, 10) : 1024;
    cache.cap = (size_t)(mb > 0 ? mb : 0) << 20;
    if (!cache.cap) cache.cap = 1; /* caching off */
  }
  return cache.cap;
}

static void *cache_take(size_t n) {
  void *p = NULL;
  pthread_mutex_lock(&cache.lock);
  for (int i = 0; i < cache.n; i++)
    if (cache.size[i] == n) {
      p = cache.ptr[i];
      cache.bytes -= n;
      cache.ptr[i] = cache.ptr[--cache.n];
      cache.size[i] = cache.size[cache.n];
      break;
    }
  pthread_mutex_unlock(&cache.lock);
  return p;
}

static int cache_put(void *p, size_t n) {
  int kept = 0;
  pthread_mutex_lock(&cache.lock);
  if (cache.n < CACHE_SLOTS && cache.bytes + n <= cache_cap()) {
    cache.ptr[cache.n] = p;
    cache.size[cache.n++] = n;
    cache.bytes += n;
    kept = 1;
  }
  pthread_mutex_unlock(&cache.lock);
  return kept;
}

static void *cpu_alloc(nb_device dev, size_t nbytes) {
  size_t n = size_class(nbytes ? nbytes : 1);
  void *p = n >= CACHE_MIN ? cache_take(n) : NULL;
  if (!p) p = aligned_alloc(64, n);
  if (!p) nb_error_set(NB_ERR_OOM, "cpu: out of memory allocating %zu bytes", nbytes);
  return p;
}

static void cpu_free(nb_device dev, void *p, size_t nbytes) {
  size_t n = size_class(nbytes ? nbytes : 1);
  if (n < CACHE_MIN || !cache_put(p, n)) free(p);
}

static nb_status cpu_memcpy(nb_device dev, void *dst, const void *src, size_t nbytes) {
  memcpy(dst, src, nbytes);
  return NB_OK;
}

static nb_status cpu_sync(nb_device dev) { return NB_OK; }

const nb_backend nb_cpu_backend = {
  .name = "cpu",
  .alloc = cpu_alloc,
  .free = cpu_free,
  .upload = cpu_memcpy,
  .download = cpu_memcpy,
  .synchronize = cpu_sync,
#define NB_BACKEND_KERNEL(NAME, PARAMS, ARGS, PROF) .NAME = nb_cpu_##NAME,
#include "backend/backend_entries.h"
};
