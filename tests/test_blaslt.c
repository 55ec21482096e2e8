/* cuBLASLt is loaded at first use (src/backend/cuda/cuda_blaslt.cu), not at
 * program start: CPU work and device discovery in a CUDA build leave it
 * unloaded; a missing library or one without the needed functions is an
 * NB_ERR_BACKEND naming the files tried; the real library, where installed,
 * fills every entry of the table. Needs no GPU (dlopen and dlsym only). In a
 * CPU-only build there is nothing to test: exit 77 (skipped). */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_blaslt.h"

/* 1 if a file whose name contains name is mapped into this process. */
static int mapped(const char *name) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, name) != NULL;
  fclose(f);
  return found;
}

/* CPU work and device discovery: nothing of cuBLASLt loaded. */
static void test_not_loaded_by_cpu_work(void) {
  NBT_CHECK(mapped("libcublasLt") == 0, "libcublasLt is mapped at program start");
  nb_scope_begin();
  nb_tensor *a = nbt_randn(1, 2, (int64_t[]){5, 7}, NB_F32);
  nb_tensor *b = nbt_randn(2, 2, (int64_t[]){7, 3}, NB_F32);
  nb_tensor *c = nb_matmul(a, b);
  NBT_CHECK(c && nb_numel(c) == 15, "cpu matmul: %s", nb_last_error());
  nb_scope_end();
  int n = nb_cuda_available();
  nb_clear_error();
  NBT_CHECK(!nb_blaslt_loaded(), "cuBLASLt loaded after CPU work (%d CUDA devices)", n);
  NBT_CHECK(mapped("libcublasLt") == 0, "libcublasLt mapped after CPU work and device discovery");
}

static void test_open_errors(void) {
  nb_blaslt_api api;
  void *h = (void *)1;
  const char *none[] = {"libnabla-no-such-cublasLt.so.0", "/nonexistent/libcublasLt.so.1", NULL};
  nb_status st = nb_blaslt_open(none, &api, &h);
  nbt_check_error("missing library", st != NB_OK, NB_ERR_BACKEND, "cuBLASLt could not be loaded",
                  "libnabla-no-such-cublasLt.so.0", "/nonexistent/libcublasLt.so.1",
                  "LD_LIBRARY_PATH", NULL);
  NBT_CHECK(h == NULL && api.Create == NULL, "a failed open leaves no handle or table");
  const char *empty[] = {NULL};
  st = nb_blaslt_open(empty, &api, &h);
  nbt_check_error("no candidates", st != NB_OK, NB_ERR_BACKEND, "no file to try", NULL);
  /* a library that loads but is not cuBLASLt */
  const char *libm[] = {"libm.so.6", NULL};
  st = nb_blaslt_open(libm, &api, &h);
  nbt_check_error("library without the functions", st != NB_OK, NB_ERR_BACKEND, "libm.so.6",
                  "has no function cublasLtCreate", NULL);
  NBT_CHECK(h == NULL && api.Create == NULL, "a rejected library leaves no handle or table");
}

/* The process-wide table: filled when the library is installed, otherwise
 * the same error on every call. */
static void test_table(void) {
  const char *const *cand = nb_blaslt_candidates();
  NBT_CHECK(cand && cand[0] && strstr(cand[0], "libcublasLt.so."), "first candidate is the soname");
  const nb_blaslt_api *lt = nb_blaslt();
  if (lt) {
    const void *const *f = (const void *const *)lt;
    size_t nf = sizeof *lt / sizeof(void *), null = 0;
    for (size_t i = 0; i < nf; i++) null += f[i] == NULL;
    NBT_CHECK(null == 0, "%zu of %zu cuBLASLt entries unresolved", null, nf);
    NBT_CHECK(nb_blaslt_loaded() && mapped("libcublasLt") == 1, "loaded and mapped after nb_blaslt()");
    NBT_CHECK(nb_blaslt() == lt, "the table is loaded once");
    const char *s = nb_blaslt_status_string(CUBLAS_STATUS_NOT_INITIALIZED);
    NBT_CHECK(s && *s && strcmp(s, "(cuBLASLt not loaded)"), "status text from cuBLASLt: '%s'", s);
    printf("cuBLASLt loaded from %s\n", cand[0]);
  } else {
    char first[1024];
    snprintf(first, sizeof first, "%s", nb_last_error());
    nbt_check_error("cuBLASLt not installed", 1, NB_ERR_BACKEND, "could not be loaded", cand[0], NULL);
    NBT_CHECK(nb_blaslt() == NULL && !strcmp(nb_last_error(), first),
              "a failed load is reported again: '%s'", nb_last_error());
    nb_clear_error();
    printf("cuBLASLt not installed here: %s\n", first);
  }
}

int main(void) {
  test_not_loaded_by_cpu_work(); /* first: nothing may have loaded it yet */
  test_open_errors();
  test_table();
  NBT_CHECK(nb_live_tensors() == 0, "no leaked tensors (%lld live)", (long long)nb_live_tensors());
  return nbt_finish();
}
#else
int main(void) {
  printf("test_blaslt: CPU-only build (no cuBLASLt loader): skipped\n");
  return 77;
}
#endif
