/* Core's allocator interface (core/core.h): storage goes through the
 * allocator installed for its device type, is freed by the one that
 * allocated it, and an allocator's failure is the creating call's error. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "testutil.h"

static int64_t n_alloc, n_free, bytes_alloc, bytes_free;
static int fail_next;

static void *count_alloc(nb_device dev, size_t nbytes) {
  if (fail_next) {
    fail_next = 0;
    nb_error_set(NB_ERR_OOM, "counting allocator: refused %zu bytes", nbytes);
    return NULL;
  }
  void *p = nb_backend_allocator(dev)->alloc(dev, nbytes);
  if (p) n_alloc++, bytes_alloc += (int64_t)nbytes;
  return p;
}

static void count_free(nb_device dev, void *p, size_t nbytes) {
  n_free++;
  bytes_free += (int64_t)nbytes;
  nb_backend_allocator(dev)->free(dev, p, nbytes);
}

static const nb_allocator counting = {count_alloc, count_free};

int main(void) {
  const int64_t shape[2] = {3, 4};
  NBT_CHECK(nb_allocator_for(NB_DEVICE_CPU) == nb_backend_allocator(NB_DEVICE_CPU),
            "the CPU's allocator is the backend's by default");
  nb_tensor *before = nb_full(2, shape, 2.0, NB_F32, NB_DEVICE_CPU); /* owned: no scope */

  nb_set_allocator(NB_CPU, &counting);
  NBT_CHECK(nb_allocator_for(NB_DEVICE_CPU) == &counting, "installed allocator is the CPU's");
  nb_scope_begin();
  nb_tensor *a = nb_full(2, shape, 1.5, NB_F32, NB_DEVICE_CPU);
  NBT_CHECK(n_alloc == 1 && bytes_alloc == 48, "nb_full allocates through it (%lld calls, %lld bytes)",
            (long long)n_alloc, (long long)bytes_alloc);
  nb_tensor *s = nb_add(a, before);
  NBT_CHECK(s && n_alloc == 2, "an op's result too (%lld calls)", (long long)n_alloc);
  float *v = s ? nb_data_ptr(s) : NULL;
  int ok = v != NULL;
  for (int i = 0; ok && i < 12; i++) ok = v[i] == 3.5f;
  NBT_CHECK(ok, "with the values the backend's memory gives");

  /* a refused allocation is the op's error; nothing leaks */
  int64_t live = nb_live_tensors();
  fail_next = 1;
  nb_tensor *z = nb_zeros(2, shape, NB_F64, NB_DEVICE_CPU);
  nbt_check_error("refused allocation", z == NULL, NB_ERR_OOM, "counting allocator: refused 96",
                  NULL);
  NBT_CHECK(nb_live_tensors() == live, "no tensor left behind by the refusal");

  nb_set_allocator(NB_CPU, NULL); /* the backend's again; a and s still free through counting */
  NBT_CHECK(nb_allocator_for(NB_DEVICE_CPU) == nb_backend_allocator(NB_DEVICE_CPU),
            "NULL restores the backend's allocator");
  nb_tensor *after = nb_zeros(2, shape, NB_F32, NB_DEVICE_CPU);
  NBT_CHECK(after && n_alloc == 2, "later storage does not use it (%lld calls)", (long long)n_alloc);
  nb_scope_end();
  NBT_CHECK(n_free == 2 && bytes_free == 96, "storage is freed by the allocator that allocated it "
            "(%lld frees, %lld bytes)", (long long)n_free, (long long)bytes_free);
  nb_release(before);
  NBT_CHECK(n_free == 2, "storage from before is freed by the backend's (%lld frees)",
            (long long)n_free);

  nb_clear_error();
  NBT_CHECK(nb_allocator_for(nb_device_cuda(1000)) == NULL &&
                strstr(nb_last_error(), "not available") != NULL,
            "an absent device has no allocator: %s", nb_last_error());
  return nbt_finish();
}
