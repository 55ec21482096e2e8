/* The backend registry: which table serves a device, the device queries
 * that need no kernel, and core's default allocators (core.h's allocator
 * interface over the backends' memory entries). While the profiler runs,
 * nb_backend_for hands out its timed proxy of the table (backend/profile.c). */
#include <string.h>

#include "backend/backend.h"
#include "core/core.h"

const nb_backend *nb_backend_for(nb_device dev) {
  if (nb_profile_running()) return nb_profile_wrap(nb_backend_find(dev), dev);
  return nb_backend_find(dev);
}

const nb_backend *nb_backend_find(nb_device dev) {
  if (dev.type == NB_CPU) return &nb_cpu_backend;
#ifdef NABLA_HAVE_CUDA
  if (dev.type == NB_CUDA) {
    int n = nb_cuda_available();
    if (dev.index < 0 || dev.index >= n) {
      nb_error_set(NB_ERR_DEVICE, "device cuda:%d is not available (%d CUDA device%s found)",
                   dev.index, n, n == 1 ? "" : "s");
      return NULL;
    }
    return nb_cuda_backend();
  }
#endif
  nb_error_set(NB_ERR_DEVICE, "device %s is not available: nabla was built without CUDA",
               dev.type == NB_CUDA ? "cuda" : "unknown");
  return NULL;
}

#ifndef NABLA_HAVE_CUDA
/* A CPU-only build answers the CUDA queries without failing. */
int nb_cuda_available(void) { return 0; }
nb_status nb_cuda_memory_stats(int device, nb_memory_stats *out) {
  if (out) memset(out, 0, sizeof *out);
  return nb_error_set(NB_ERR_DEVICE, "nb_cuda_memory_stats: nabla was built without CUDA");
}
nb_status nb_cuda_empty_cache(int device) {
  return nb_error_set(NB_ERR_DEVICE, "nb_cuda_empty_cache: nabla was built without CUDA");
}
nb_status nb_cuda_device_info(int device, nb_cuda_info *out) {
  if (out) memset(out, 0, sizeof *out);
  return nb_error_set(NB_ERR_DEVICE, "nb_cuda_device_info(%d): nabla was built without CUDA", device);
}
#endif

nb_status nb_device_synchronize(nb_device dev) {
  const nb_backend *be = nb_backend_for(dev);
  return be ? be->synchronize(dev) : nb_last_status();
}

/* ---- core's allocator interface over the backends' memory entries ---------- */
static void *backend_alloc(nb_device dev, size_t nbytes) {
  const nb_backend *be = nb_backend_for(dev);
  return be ? be->alloc(dev, nbytes) : NULL;
}

static void backend_free(nb_device dev, void *p, size_t nbytes) {
  const nb_backend *be = nb_backend_for(dev);
  if (be) be->free(dev, p, nbytes);
}

static const nb_allocator backend_allocator = {backend_alloc, backend_free};

const nb_allocator *nb_backend_allocator(nb_device dev) {
  return nb_backend_for(dev) ? &backend_allocator : NULL;
}

/* The backend that provides pinned host memory (the CUDA one), or NULL. */
static const nb_backend *pinned_backend(void) {
  if (nb_cuda_available() <= 0) return NULL;
  const nb_backend *be = nb_backend_for(nb_device_cuda(0));
  return be && be->host_alloc ? be : NULL;
}

static void *pinned_alloc(nb_device dev, size_t nbytes) {
  return pinned_backend()->host_alloc(nbytes);
}

static void pinned_free(nb_device dev, void *p, size_t nbytes) { pinned_backend()->host_free(p); }

static const nb_allocator pinned_allocator = {pinned_alloc, pinned_free};

const nb_allocator *nb_pinned_allocator(void) {
  return pinned_backend() ? &pinned_allocator : NULL;
}
