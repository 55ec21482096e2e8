/* The CUDA backend's function table (contracts in backend/backend_entries.h). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

static const nb_backend nb_cuda_table = {
  "cuda",
  nb_cuda_alloc_entry,
  nb_cuda_free_entry,
  nb_cuda_upload_entry,
  nb_cuda_download_entry,
  nb_cuda_sync_entry,
  nb_cuda_host_alloc_entry,
  nb_cuda_host_free_entry,
  nb_cuda_upload_async_entry,
#define NB_BACKEND_KERNEL(NAME, PARAMS, ARGS, PROF) nb_cuda_##NAME,
#include "backend/backend_entries.h"
};

/* Positional initialisation (C++ has no designated initialisers for every
 * member in order before C++20): the memory entries above are in
 * backend_entries.h's order, by hand; the kernels follow from the list. */
enum {
  NB_CUDA_MEMORY_ENTRIES = 0
#define NB_BACKEND_MEMORY(RET, NAME, PARAMS) + 1
#include "backend/backend_entries.h"
};
static_assert(NB_CUDA_MEMORY_ENTRIES == 8 && offsetof(nb_backend, fill) == sizeof(void *) * 9,
              "nb_backend's memory entries changed: update the table");

extern "C" const nb_backend *nb_cuda_backend(void) { return &nb_cuda_table; }
