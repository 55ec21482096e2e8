/* libFuzzer target for the safetensors loader.
 *
 * Every input goes through nb_safetensors_parse; an accepted file has each
 * tensor materialised and every byte read back, its metadata looked up, and
 * a few invariants checked (a rejection always carries an I/O message;
 * tensor byte counts match the entry). Sanitizers catch the rest.
 *
 * Built with -DNB_FUZZ_SEEDGEN instead, this file is a small program that
 * writes a seed corpus of valid files with nb_safetensors_save
 * (fuzz/run-fuzz.sh does both). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla.h"

#ifndef NB_FUZZ_SEEDGEN
static void fuzz_touch_tensor(const nb_st_file *f, int i) {
  const char *name = nb_st_name(f, i);
  if (!name) abort();
  nb_tensor *t = nb_st_tensor(f, name);
  if (!t) abort(); /* a validated entry must always load */
  size_t n = (size_t)nb_numel(t) * nb_dtype_size(nb_dtype_of(t));
  unsigned char *buf = malloc(n ? n : 1);
  if (!buf) abort();
  if (nb_to_host(t, buf, n)) abort();
  unsigned acc = 0;
  for (size_t k = 0; k < n; k++) acc = acc * 31u + buf[k];
  if (nb_numel(t) == 1) (void)nb_item(t);
  free(buf);
  nb_release(t);
  /* keep the checksum observable so the reads are not optimised away */
  __asm__ volatile("" : : "r"(acc));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  nb_clear_error();
  int64_t live = nb_live_tensors();
  nb_st_file *f = nb_safetensors_parse(data, size);
  if (!f) {
    /* every rejection is an I/O error with a message naming the file */
    if (nb_last_status() != NB_ERR_IO || !strstr(nb_last_error(), "<memory>")) abort();
    nb_clear_error();
    return 0;
  }
  int n = nb_st_count(f);
  for (int i = 0; i < n; i++) fuzz_touch_tensor(f, i);
  if (nb_st_tensor(f, "\x01no such tensor")) abort();
  (void)nb_st_metadata(f, "format");
  (void)nb_st_metadata(f, "");
  nb_st_close(f);
  nb_clear_error();
  if (nb_live_tensors() != live) abort(); /* no tensor leaks */
  return 0;
}
#else
/* ---- seed corpus ----------------------------------------------------- */
static void seed_save(const char *dir, const char *file, int n, const char *const *names,
                      nb_tensor *const *ts, int n_meta, const char *const *keys,
                      const char *const *vals) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  if (nb_safetensors_save(path, n, names, ts, n_meta, keys, vals)) {
    fprintf(stderr, "seed %s: %s\n", path, nb_last_error());
    exit(1);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const char *dir = argv[1];
  nb_scope_begin();
  nb_rng rng = nb_rng_new(7);
  int64_t s23[2] = {2, 3}, s4[1] = {4}, s0[2] = {0, 5}, s222[3] = {2, 2, 2};
  nb_tensor *all[NB_DTYPE_COUNT];
  const char *names[NB_DTYPE_COUNT];
  for (int d = 0; d < NB_DTYPE_COUNT; d++) {
    names[d] = nb_dtype_name((nb_dtype)d);
    nb_tensor *a = nb_arange(0, 6, 1, NB_F64, NB_DEVICE_CPU);
    all[d] = nb_cast(nb_reshape(a, 2, s23), (nb_dtype)d);
    seed_save(dir, names[d], 1, &names[d], &all[d], 0, NULL, NULL);
  }
  seed_save(dir, "all_dtypes", NB_DTYPE_COUNT, names, all, 0, NULL, NULL);
  const char *mk[2] = {"format", "note"}, *mv[2] = {"pt", "seed \"corpus\"\n\xc3\xa9"};
  nb_tensor *w = nb_randn(&rng, 1, s4, 0, 1, NB_F32, NB_DEVICE_CPU);
  const char *wn[1] = {"layer.0.weight"};
  seed_save(dir, "metadata", 1, wn, &w, 2, mk, mv);
  seed_save(dir, "empty", 0, NULL, NULL, 0, NULL, NULL);
  seed_save(dir, "only_metadata", 0, NULL, NULL, 1, mk, mv);
  nb_tensor *z[3] = {nb_zeros(2, s0, NB_F32, NB_DEVICE_CPU), nb_scalar(3.5, NB_F64, NB_DEVICE_CPU),
                     nb_ones(3, s222, NB_BF16, NB_DEVICE_CPU)};
  const char *zn[3] = {"empty", "scalar", "cube"};
  seed_save(dir, "mixed", 3, zn, z, 0, NULL, NULL);
  nb_scope_end();
  return 0;
}
#endif
