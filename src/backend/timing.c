/* Device events for benchmark timing (nb_event_* in nabla.h).
 *
 * On the CPU an event is a host timestamp from the monotonic clock: CPU
 * kernels run synchronously, so the time between two records is the time of
 * the work issued between them. On a CUDA device an event is recorded in
 * the device's stream by the CUDA runtime (cuda_runtime.cu), so elapsed
 * time is device time and the host can queue many timed iterations before
 * waiting for any of them. */
#include <stdlib.h>

#include "core/core.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#endif

struct nb_event {
  nb_device dev;
  double host_ms;  /* CPU: monotonic clock in milliseconds */
  void *cuda;      /* CUDA: the cudaEvent_t, owned */
};

/* Fills e->cuda for a CUDA device; a CPU-only build has no such device. */
static nb_status timing_record_device(nb_event *e) {
#ifdef NABLA_HAVE_CUDA
  int n = nb_cuda_available();
  if (e->dev.index < 0 || e->dev.index >= n)
    return nb_error_set(NB_ERR_DEVICE, "nb_event_record: device cuda:%d is not available "
                        "(%d CUDA device%s found)", e->dev.index, n, n == 1 ? "" : "s");
  e->cuda = nb_cuda_event_record(e->dev.index);
  return e->cuda ? NB_OK : nb_last_status();
#else
  return nb_error_set(NB_ERR_DEVICE, "nb_event_record: device cuda:%d is not available: nabla "
                      "was built without CUDA", e->dev.index);
#endif
}

nb_event *nb_event_record(nb_device dev) {
  if (dev.type != NB_CPU && dev.type != NB_CUDA) {
    nb_error_set(NB_ERR_DEVICE, "nb_event_record: unknown device type %d", (int)dev.type);
    return NULL;
  }
  nb_event *e = calloc(1, sizeof *e);
  if (!e) {
    nb_error_set(NB_ERR_OOM, "nb_event_record: out of host memory");
    return NULL;
  }
  e->dev = dev;
  if (dev.type == NB_CPU) {
    e->host_ms = nb_host_ms();
    return e;
  }
  if (timing_record_device(e) != NB_OK) {
    free(e);
    return NULL;
  }
  return e;
}

double nb_event_elapsed_ms(nb_event *start, nb_event *end) {
  if (!start || !end) {
    nb_error_null("nb_event_elapsed_ms", !start ? "start" : "end");
    return -1.0;
  }
  if (start->dev.type != end->dev.type || start->dev.index != end->dev.index) {
    nb_error_set(NB_ERR_DEVICE, "nb_event_elapsed_ms: the two events were recorded on "
                 "different devices");
    return -1.0;
  }
  if (start->dev.type == NB_CPU) return end->host_ms - start->host_ms;
#ifdef NABLA_HAVE_CUDA
  return nb_cuda_event_elapsed_ms(start->cuda, end->cuda);
#else
  nb_error_set(NB_ERR_DEVICE, "nb_event_elapsed_ms: nabla was built without CUDA");
  return -1.0;
#endif
}

void nb_event_free(nb_event *e) {
  if (!e) return;
#ifdef NABLA_HAVE_CUDA
  if (e->cuda) nb_cuda_event_free(e->cuda);
#endif
  free(e);
}
