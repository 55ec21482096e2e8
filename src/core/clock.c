/* The host clock (core.h). */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "core/core.h"

double nb_host_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}
