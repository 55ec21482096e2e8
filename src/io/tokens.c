/* Token files in the format of llm.c's data scripts:
 *
 *   256 little-endian int32: magic 20240520, version 1, token count, 0 ...
 *   count little-endian uint16 tokens
 *
 * The reader checks the header and the file's size against the count before
 * it allocates anything, then reads the tokens into one host buffer (2 bytes
 * a token), decoding each from its two bytes (so the result is the same on
 * any host), and, when the caller knows the vocabulary, checks every token
 * against it in the same pass. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/core.h"

struct nb_tokens {
  uint16_t *data;
  int64_t n;
};

static int32_t tok_le32(const unsigned char *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                   (uint32_t)p[3] << 24);
}

/* Opens path as a regular file and reads its header; returns the file or
 * NULL after an error naming the problem. */
static FILE *tok_open(const char *path, int64_t *size, unsigned char *hdr) {
  FILE *f = fopen(path, "rb");
  struct stat st;
  if (!f || fstat(fileno(f), &st)) {
    int e = errno;
    if (f) fclose(f);
    nb_error_set(NB_ERR_IO, "token file '%s': cannot open: %s", path, strerror(e));
    return NULL;
  }
  const char *bad = S_ISDIR(st.st_mode) ? "is a directory" : !S_ISREG(st.st_mode) ? "is not a regular file"
                    : st.st_size == 0 ? "is empty (0 bytes)" : NULL;
  if (!bad && st.st_size < NB_TOKENS_HEADER_BYTES) bad = "is shorter than the header";
  if (bad) {
    nb_error_set(NB_ERR_IO, "token file '%s' %s (%lld bytes); expected a %d-byte header (256 "
                 "little-endian int32: magic %d, version %d, token count) and then the tokens as "
                 "uint16", path, bad, (long long)st.st_size, NB_TOKENS_HEADER_BYTES,
                 NB_TOKENS_MAGIC, NB_TOKENS_VERSION);
    fclose(f);
    return NULL;
  }
  if (fread(hdr, 1, NB_TOKENS_HEADER_BYTES, f) != NB_TOKENS_HEADER_BYTES) {
    nb_error_set(NB_ERR_IO, "token file '%s': cannot read the header: %s", path,
                 ferror(f) ? strerror(errno) : "the file shrank");
    fclose(f);
    return NULL;
  }
  *size = (int64_t)st.st_size;
  return f;
}

/* Checks magic, version and the file's size against the count. */
static nb_status tok_check_header(const char *path, const unsigned char *hdr, int64_t size,
                                  int64_t *count) {
  int32_t magic = tok_le32(hdr), version = tok_le32(hdr + 4), n = tok_le32(hdr + 8);
  if (magic != NB_TOKENS_MAGIC)
    return nb_error_set(NB_ERR_IO, "token file '%s': magic %d, expected %d (llm.c's token "
                        "format: a 1024-byte header of little-endian int32, then uint16 tokens)",
                        path, magic, NB_TOKENS_MAGIC);
  if (version != NB_TOKENS_VERSION)
    return nb_error_set(NB_ERR_IO, "token file '%s': version %d, expected %d (uint16 tokens)",
                        path, version, NB_TOKENS_VERSION);
  if (n < 0)
    return nb_error_set(NB_ERR_IO, "token file '%s': token count %d in the header, expected >= 0",
                        path, n);
  int64_t want = NB_TOKENS_HEADER_BYTES + 2 * (int64_t)n;
  if (size != want)
    return nb_error_set(NB_ERR_IO, "token file '%s' is %lld bytes, but its header says %d tokens: "
                        "expected %lld bytes (%d-byte header + 2 bytes a token); the file is %s",
                        path, (long long)size, n, (long long)want, NB_TOKENS_HEADER_BYTES,
                        size < want ? "truncated" : "longer than the header says");
  *count = n;
  return NB_OK;
}

/* Decodes the little-endian bytes in place and checks them against vocab. */
static nb_status tok_decode(const char *path, uint16_t *data, int64_t n, int64_t vocab) {
  const unsigned char *b = (const unsigned char *)data;
  for (int64_t i = 0; i < n; i++) {
    uint16_t v = (uint16_t)(b[2 * i] | b[2 * i + 1] << 8);
    data[i] = v;
    if (vocab > 0 && v >= vocab)
      return nb_error_set(NB_ERR_IO, "token file '%s': token %lld is %u, beyond the vocabulary of "
                          "%lld (expected ids 0..%lld)", path, (long long)i, (unsigned)v,
                          (long long)vocab, (long long)vocab - 1);
  }
  return NB_OK;
}

nb_tokens *nb_tokens_open(const char *path, int64_t vocab) {
  if (!path) return nb_error_set(NB_ERR_NULL, "nb_tokens_open: path is NULL"), NULL;
  unsigned char hdr[NB_TOKENS_HEADER_BYTES];
  int64_t size = 0, n = 0;
  FILE *f = tok_open(path, &size, hdr);
  if (!f) return NULL;
  nb_tokens *t = NULL;
  if (tok_check_header(path, hdr, size, &n) == NB_OK) {
    t = calloc(1, sizeof *t);
    if (t) t->data = malloc(n ? (size_t)n * 2 : 2);
    if (!t || !t->data) {
      nb_error_set(NB_ERR_OOM, "token file '%s': out of memory for %lld tokens", path, (long long)n);
    } else if ((int64_t)fread(t->data, 2, (size_t)n, f) != n) {
      nb_error_set(NB_ERR_IO, "token file '%s': reading %lld tokens: %s", path, (long long)n,
                   ferror(f) ? strerror(errno) : "the file shrank while being read");
    } else if (tok_decode(path, t->data, n, vocab) == NB_OK) {
      t->n = n;
      fclose(f);
      return t;
    }
  }
  fclose(f);
  nb_tokens_close(t);
  return NULL;
}

int64_t nb_tokens_count(const nb_tokens *t) { return t ? t->n : 0; }

const uint16_t *nb_tokens_data(const nb_tokens *t) { return t ? t->data : NULL; }

void nb_tokens_close(nb_tokens *t) {
  if (!t) return;
  free(t->data);
  free(t);
}
