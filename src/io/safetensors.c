/* safetensors checkpoints, byte-compatible with the Python library's files:
 *
 *   u64 little-endian N | N bytes of JSON header | raw little-endian data
 *
 * The header maps each tensor name to {"dtype", "shape", "data_offsets":
 * [begin, end]} (offsets relative to the data section) plus an optional
 * "__metadata__" object of strings. The writer pads the header with spaces
 * to a multiple of 8 (as Python does) and writes atomically. The loader
 * trusts nothing: every offset and size is checked before any byte of data
 * is touched, so no input can make it read outside the file. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "io/json.h"

#define ST_MAX_HEADER ((uint64_t)100 << 20) /* the Python library's own cap */
#define ST_MAX_DEPTH 16

/* safetensors dtype codes in nb_dtype order */
static const char *const st_dtype_codes[NB_DTYPE_COUNT] = {
    "F64", "F32", "F16", "BF16", "I64", "I32", "U8", "BOOL", "F8_E4M3", "F8_E5M2"};

typedef struct {
  char *name;
  nb_dtype dtype;
  int ndim;
  int64_t shape[NB_MAX_DIMS];
  uint64_t begin, end; /* within the data section */
} st_entry;

struct nb_st_file {
  char *label;          /* the path, or "<memory>", for messages */
  unsigned char *buf;   /* the whole file */
  size_t nbytes;
  size_t data_start;    /* 8 + header length */
  int n;
  st_entry *entries;    /* sorted by name */
  int n_meta;
  char **meta_keys, **meta_values;
};

static int st_little_endian(void) {
  const uint16_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

/* Reverses the bytes of each element: used only on big-endian hosts. */
static void st_swap_elements(unsigned char *p, size_t nbytes, size_t esize) {
  if (esize < 2) return;
  for (size_t i = 0; i + esize <= nbytes; i += esize)
    for (size_t a = 0, b = esize - 1; a < b; a++, b--) {
      unsigned char t = p[i + a];
      p[i + a] = p[i + b];
      p[i + b] = t;
    }
}

/* ======================================================================
 * Loading
 * ====================================================================== */

static void st_free(nb_st_file *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) free(f->entries[i].name);
  for (int i = 0; i < f->n_meta; i++) {
    free(f->meta_keys[i]);
    free(f->meta_values[i]);
  }
  free(f->entries);
  free(f->meta_keys);
  free(f->meta_values);
  free(f->buf);
  free(f->label);
  free(f);
}

void nb_st_close(nb_st_file *f) { st_free(f); }

/* Records "safetensors 'label': what" as an I/O error; returns -1. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int st_reject(const nb_st_file *f, const char *fmt, ...) {
  char what[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  nb_error_set(NB_ERR_IO, "safetensors '%s': %s", f->label, what);
  return -1;
}

static char *st_strdup(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = 0;
  }
  return d;
}

static int st_dtype_parse(const char *s, nb_dtype *out) {
  for (int i = 0; i < NB_DTYPE_COUNT; i++)
    if (!strcmp(s, st_dtype_codes[i])) {
      *out = (nb_dtype)i;
      return 0;
    }
  return -1;
}

/* A non-negative JSON integer, or -1. */
static int64_t st_uint(const nb_json *v) {
  return v && v->type == NB_JSON_NUMBER && v->is_int && v->ival >= 0 ? v->ival : -1;
}

static int st_parse_shape(const nb_st_file *f, const char *name, const nb_json *v, st_entry *e) {
  if (!v || v->type != NB_JSON_ARRAY)
    return st_reject(f, "tensor \"%.80s\": \"shape\" must be an array", name);
  if (v->n > NB_MAX_DIMS)
    return st_reject(f, "tensor \"%.80s\": %zu dimensions (at most %d)", name, v->n, NB_MAX_DIMS);
  e->ndim = (int)v->n;
  for (size_t i = 0; i < v->n; i++) {
    e->shape[i] = st_uint(&v->items[i]);
    if (e->shape[i] < 0)
      return st_reject(f, "tensor \"%.80s\": shape entry %zu is not a non-negative integer", name, i);
  }
  return 0;
}

static int st_parse_offsets(const nb_st_file *f, const char *name, const nb_json *v, st_entry *e) {
  if (!v || v->type != NB_JSON_ARRAY || v->n != 2)
    return st_reject(f, "tensor \"%.80s\": \"data_offsets\" must be an array of two integers", name);
  int64_t b = st_uint(&v->items[0]), en = st_uint(&v->items[1]);
  if (b < 0 || en < 0)
    return st_reject(f, "tensor \"%.80s\": data_offsets must be non-negative integers", name);
  if (b > en)
    return st_reject(f, "tensor \"%.80s\": data_offsets [%" PRId64 ", %" PRId64 "] end before they begin",
                     name, b, en);
  uint64_t data_len = f->nbytes - f->data_start;
  if ((uint64_t)en > data_len)
    return st_reject(f, "tensor \"%.80s\": data_offsets [%" PRId64 ", %" PRId64 "] past the end of the "
                     "data section (%" PRIu64 " bytes)", name, b, en, data_len);
  e->begin = (uint64_t)b;
  e->end = (uint64_t)en;
  return 0;
}

/* The byte span must hold exactly numel elements (overflow checked). */
static int st_check_span(const nb_st_file *f, const st_entry *e) {
  uint64_t bytes = nb_dtype_size(e->dtype);
  for (int i = 0; i < e->ndim; i++) {
    uint64_t d = (uint64_t)e->shape[i];
    if (d && bytes > UINT64_MAX / d)
      return st_reject(f, "tensor \"%.80s\": shape overflows the byte count", e->name);
    bytes *= d;
  }
  if (bytes != e->end - e->begin)
    return st_reject(f, "tensor \"%.80s\": %s shape needs %" PRIu64 " bytes but data_offsets span %" PRIu64,
                     e->name, st_dtype_codes[e->dtype], bytes, e->end - e->begin);
  return 0;
}

static int st_parse_entry(const nb_st_file *f, const nb_json *key, const nb_json *v, st_entry *e) {
  if (strlen(key->str) != key->len) return st_reject(f, "a tensor name contains a NUL character");
  e->name = st_strdup(key->str, key->len);
  if (!e->name) return st_reject(f, "out of memory");
  if (v->type != NB_JSON_OBJECT)
    return st_reject(f, "tensor \"%.80s\": expected an object, got %s", e->name, nb_json_type_name(v->type));
  for (size_t i = 0; i < v->n; i++) {
    const char *k = v->keys[i].str;
    if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
      return st_reject(f, "tensor \"%.80s\": unknown field \"%.40s\"", e->name, k);
  }
  const nb_json *dt = nb_json_get(v, "dtype");
  if (!dt || dt->type != NB_JSON_STRING)
    return st_reject(f, "tensor \"%.80s\": missing string field \"dtype\"", e->name);
  if (st_dtype_parse(dt->str, &e->dtype))
    return st_reject(f, "tensor \"%.80s\": unsupported dtype \"%.20s\" (expected F64, F32, F16, BF16, "
                     "I64, I32, U8, BOOL, F8_E4M3 or F8_E5M2)", e->name, dt->str);
  if (st_parse_shape(f, e->name, nb_json_get(v, "shape"), e)) return -1;
  if (st_parse_offsets(f, e->name, nb_json_get(v, "data_offsets"), e)) return -1;
  return st_check_span(f, e);
}

static int st_parse_metadata(nb_st_file *f, const nb_json *v) {
  if (v->type == NB_JSON_NULL) return 0; /* the Python library accepts null */
  if (v->type != NB_JSON_OBJECT)
    return st_reject(f, "\"__metadata__\" must be an object of strings, got %s", nb_json_type_name(v->type));
  f->meta_keys = calloc(v->n ? v->n : 1, sizeof *f->meta_keys);
  f->meta_values = calloc(v->n ? v->n : 1, sizeof *f->meta_values);
  if (!f->meta_keys || !f->meta_values) return st_reject(f, "out of memory");
  for (size_t i = 0; i < v->n; i++) {
    const nb_json *k = &v->keys[i], *s = &v->items[i];
    if (s->type != NB_JSON_STRING)
      return st_reject(f, "metadata \"%.80s\": value must be a string, got %s", k->str,
                       nb_json_type_name(s->type));
    if (strlen(k->str) != k->len || strlen(s->str) != s->len)
      return st_reject(f, "metadata \"%.80s\": contains a NUL character", k->str);
    f->meta_keys[f->n_meta] = st_strdup(k->str, k->len);
    f->meta_values[f->n_meta] = st_strdup(s->str, s->len);
    f->n_meta++;
    if (!f->meta_keys[f->n_meta - 1] || !f->meta_values[f->n_meta - 1]) return st_reject(f, "out of memory");
  }
  return 0;
}

static int st_cmp_offsets(const void *a, const void *b) {
  const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

static int st_cmp_names(const void *a, const void *b) {
  return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

/* Sorted by offset, the tensors must tile the data section exactly. */
static int st_check_tiling(const nb_st_file *f) {
  uint64_t data_len = f->nbytes - f->data_start, cursor = 0;
  const st_entry **order = malloc((f->n ? f->n : 1) * sizeof *order);
  if (!order) return st_reject(f, "out of memory");
  for (int i = 0; i < f->n; i++) order[i] = &f->entries[i];
  qsort(order, (size_t)f->n, sizeof *order, st_cmp_offsets);
  int rc = 0;
  for (int i = 0; i < f->n && !rc; i++) {
    const st_entry *e = order[i];
    if (e->begin > cursor)
      rc = st_reject(f, "hole in the data section: bytes [%" PRIu64 ", %" PRIu64 ") belong to no tensor "
                     "(before \"%.80s\")", cursor, e->begin, e->name);
    else if (e->begin < cursor)
      rc = st_reject(f, "tensor \"%.80s\" at data_offsets [%" PRIu64 ", %" PRIu64 "] overlaps the previous "
                     "tensor (which ends at %" PRIu64 ")", e->name, e->begin, e->end, cursor);
    cursor = e->end;
  }
  if (!rc && cursor != data_len)
    rc = st_reject(f, "data section has %" PRIu64 " bytes but the tensors cover only %" PRIu64,
                   data_len, cursor);
  free(order);
  return rc;
}

static int st_parse_header(nb_st_file *f, const nb_json *root) {
  if (root->type != NB_JSON_OBJECT)
    return st_reject(f, "header is a JSON %s, expected an object", nb_json_type_name(root->type));
  if (root->n > (size_t)INT32_MAX) return st_reject(f, "too many tensors");
  f->entries = calloc(root->n ? root->n : 1, sizeof *f->entries);
  if (!f->entries) return st_reject(f, "out of memory");
  for (size_t i = 0; i < root->n; i++) {
    if (!strcmp(root->keys[i].str, "__metadata__") && root->keys[i].len == 12) {
      if (st_parse_metadata(f, &root->items[i])) return -1;
      continue;
    }
    st_entry *e = &f->entries[f->n++];
    if (st_parse_entry(f, &root->keys[i], &root->items[i], e)) return -1;
  }
  if (st_check_tiling(f)) return -1;
  /* Names are object keys, which the JSON reader already made unique. */
  qsort(f->entries, (size_t)f->n, sizeof *f->entries, st_cmp_names);
  return 0;
}

/* Validates f->buf[0..nbytes); f owns the buffer. */
static int st_parse_buffer(nb_st_file *f) {
  if (f->nbytes < 8)
    return st_reject(f, "file is %zu bytes, too short for the 8-byte header length", f->nbytes);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | f->buf[i];
  if (hlen > ST_MAX_HEADER)
    return st_reject(f, "header length %" PRIu64 " exceeds the %" PRIu64 "-byte limit", hlen, ST_MAX_HEADER);
  if (hlen > f->nbytes - 8)
    return st_reject(f, "header length %" PRIu64 " runs past the end of the file (%zu bytes)", hlen,
                     f->nbytes);
  f->data_start = 8 + (size_t)hlen;
  char err[300];
  nb_json *root = nb_json_parse((const char *)f->buf + 8, (size_t)hlen, ST_MAX_DEPTH, err, sizeof err);
  if (!root) return st_reject(f, "malformed JSON header: %s", err);
  int rc = st_parse_header(f, root);
  nb_json_free(root);
  return rc;
}

/* Takes ownership of buf (malloc'd); returns NULL (buf freed) on rejection. */
static nb_st_file *st_open_buffer(unsigned char *buf, size_t nbytes, const char *label) {
  nb_st_file *f = calloc(1, sizeof *f);
  char *lab = st_strdup(label, strlen(label));
  if (!f || !lab) {
    free(f);
    free(lab);
    free(buf);
    nb_error_set(NB_ERR_OOM, "safetensors '%s': out of memory", label);
    return NULL;
  }
  f->label = lab;
  f->buf = buf;
  f->nbytes = nbytes;
  if (st_parse_buffer(f)) {
    st_free(f);
    return NULL;
  }
  return f;
}

nb_st_file *nb_safetensors_parse(const void *data, size_t nbytes) {
  if (!data && nbytes) {
    nb_error_null("nb_safetensors_parse", "data");
    return NULL;
  }
  unsigned char *copy = malloc(nbytes ? nbytes : 1);
  if (!copy) {
    nb_error_set(NB_ERR_OOM, "nb_safetensors_parse: out of memory for %zu bytes", nbytes);
    return NULL;
  }
  if (nbytes) memcpy(copy, data, nbytes);
  return st_open_buffer(copy, nbytes, "<memory>");
}

/* Reads the whole file into a malloc'd buffer. */
static int st_read_file(const char *path, unsigned char **out, size_t *nbytes) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return nb_error_set(NB_ERR_IO, "nb_safetensors_load: cannot open '%s': %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fileno(fp), &sb) || !S_ISREG(sb.st_mode)) {
    int e = errno;
    fclose(fp);
    return nb_error_set(NB_ERR_IO, "nb_safetensors_load: '%s' is not a regular file%s%s", path,
                        e ? ": " : "", e ? strerror(e) : "");
  }
  size_t n = (size_t)sb.st_size;
  unsigned char *buf = malloc(n ? n : 1);
  if (!buf) {
    fclose(fp);
    return nb_error_set(NB_ERR_OOM, "nb_safetensors_load: out of memory reading '%s' (%zu bytes)", path, n);
  }
  size_t got = n ? fread(buf, 1, n, fp) : 0;
  int err = ferror(fp) ? errno : 0;
  fclose(fp);
  if (got != n) {
    free(buf);
    return nb_error_set(NB_ERR_IO, "nb_safetensors_load: reading '%s': %s", path,
                        err ? strerror(err) : "file shrank while being read");
  }
  *out = buf;
  *nbytes = n;
  return NB_OK;
}

nb_st_file *nb_safetensors_load(const char *path) {
  if (!path) {
    nb_error_null("nb_safetensors_load", "path");
    return NULL;
  }
  unsigned char *buf = NULL;
  size_t n = 0;
  if (st_read_file(path, &buf, &n)) return NULL;
  return st_open_buffer(buf, n, path);
}

int nb_st_count(const nb_st_file *f) { return f ? f->n : 0; }

const char *nb_st_name(const nb_st_file *f, int i) {
  return f && i >= 0 && i < f->n ? f->entries[i].name : NULL;
}

static const st_entry *st_find(const nb_st_file *f, const char *name) {
  st_entry key;
  key.name = (char *)name;
  return bsearch(&key, f->entries, (size_t)f->n, sizeof *f->entries, st_cmp_names);
}

nb_tensor *nb_st_tensor(const nb_st_file *f, const char *name) {
  if (!f || !name) {
    nb_error_null("nb_st_tensor", f ? "name" : "f");
    return NULL;
  }
  const st_entry *e = st_find(f, name);
  if (!e) {
    nb_error_set(NB_ERR_INDEX, "nb_st_tensor: safetensors '%s' has no tensor named \"%.200s\"", f->label, name);
    return NULL;
  }
  const unsigned char *src = f->buf + f->data_start + e->begin;
  size_t nbytes = (size_t)(e->end - e->begin);
  if (st_little_endian()) return nb_from_buffer(src, e->ndim, e->shape, e->dtype, NB_DEVICE_CPU);
  unsigned char *tmp = malloc(nbytes ? nbytes : 1);
  if (!tmp) {
    nb_error_set(NB_ERR_OOM, "nb_st_tensor: out of memory for \"%.200s\"", name);
    return NULL;
  }
  memcpy(tmp, src, nbytes);
  st_swap_elements(tmp, nbytes, nb_dtype_size(e->dtype));
  nb_tensor *t = nb_from_buffer(tmp, e->ndim, e->shape, e->dtype, NB_DEVICE_CPU);
  free(tmp);
  return t;
}

const char *nb_st_metadata(const nb_st_file *f, const char *key) {
  if (!f || !key) return NULL;
  for (int i = 0; i < f->n_meta; i++)
    if (!strcmp(f->meta_keys[i], key)) return f->meta_values[i];
  return NULL;
}

/* ======================================================================
 * Saving
 * ====================================================================== */

typedef struct {
  char *s;
  size_t len, cap;
  int oom;
} st_text;

static void st_put(st_text *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->len + n + 1) nc *= 2;
    char *ns = realloc(b->s, nc);
    if (!ns) {
      b->oom = 1;
      return;
    }
    b->s = ns;
    b->cap = nc;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = 0;
}

static void st_puts(st_text *b, const char *s) { st_put(b, s, strlen(s)); }

/* A JSON string the way serde_json writes it: only '"', '\\' and control
 * characters are escaped; UTF-8 passes through. */
static void st_put_json_string(st_text *b, const char *s) {
  st_put(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char esc[8];
    const char *named = *p == '"' ? "\\\"" : *p == '\\' ? "\\\\" : *p == '\b' ? "\\b"
                      : *p == '\f' ? "\\f" : *p == '\n' ? "\\n" : *p == '\r' ? "\\r"
                      : *p == '\t' ? "\\t" : NULL;
    if (named) st_puts(b, named);
    else if (*p < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", *p);
      st_puts(b, esc);
    } else st_put(b, (const char *)p, 1);
  }
  st_put(b, "\"", 1);
}

typedef struct {
  const char *name;
  nb_tensor *t;
  uint64_t begin, end;
} st_item;

/* The Python library's data order: by its dtype enum, descending (I64,
 * F64, F32, I32, BF16, F16, F8_E4M3, F8_E5M2, U8, BOOL: element sizes never
 * grow, so every tensor starts aligned to its element size, the header
 * being padded to 8), then by name. Indexed by nb_dtype. */
static const int st_dtype_rank[NB_DTYPE_COUNT] = {8, 7, 4, 5, 9, 6, 1, 0, 3, 2};

static int st_cmp_items(const void *a, const void *b) {
  const st_item *x = a, *y = b;
  int rx = st_dtype_rank[nb_dtype_of(x->t)], ry = st_dtype_rank[nb_dtype_of(y->t)];
  if (rx != ry) return rx > ry ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int st_strings_unique(int n, const char *const *s) {
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      if (!strcmp(s[i], s[j])) return 0;
  return 1;
}

static nb_status st_check_save_args(const char *path, int n, const char *const *names,
                                    nb_tensor *const *tensors, int n_meta,
                                    const char *const *keys, const char *const *values) {
  const char *op = "nb_safetensors_save";
  if (!path) return nb_error_null(op, "path");
  if (n < 0 || n_meta < 0) return nb_error_set(NB_ERR_VALUE, "%s: negative count (n %d, n_meta %d)", op, n, n_meta);
  if (n && (!names || !tensors)) return nb_error_null(op, names ? "tensors" : "names");
  if (n_meta && (!keys || !values)) return nb_error_null(op, keys ? "meta_values" : "meta_keys");
  for (int i = 0; i < n; i++) {
    if (!names[i]) return nb_error_null(op, "names[i]");
    if (!tensors[i]) return nb_error_null(op, "tensors[i]");
    if (!nb_json_utf8_valid(names[i], strlen(names[i])) || !strcmp(names[i], "__metadata__"))
      return nb_error_set(NB_ERR_VALUE, "%s: '%s': tensor name \"%.80s\" is not valid UTF-8 or is reserved",
                          op, path, names[i]);
  }
  for (int i = 0; i < n_meta; i++) {
    if (!keys[i] || !values[i]) return nb_error_null(op, keys[i] ? "meta_values[i]" : "meta_keys[i]");
    if (!nb_json_utf8_valid(keys[i], strlen(keys[i])) || !nb_json_utf8_valid(values[i], strlen(values[i])))
      return nb_error_set(NB_ERR_VALUE, "%s: '%s': metadata \"%.80s\" is not valid UTF-8", op, path, keys[i]);
  }
  if (!st_strings_unique(n, names))
    return nb_error_set(NB_ERR_VALUE, "%s: '%s': duplicate tensor names", op, path);
  if (!st_strings_unique(n_meta, keys))
    return nb_error_set(NB_ERR_VALUE, "%s: '%s': duplicate metadata keys", op, path);
  return NB_OK;
}

/* The header text, padded with spaces to a multiple of 8 bytes. */
static int st_build_header(st_text *h, int n, st_item *items, int n_meta, const char *const *keys,
                           const char *const *values) {
  uint64_t off = 0;
  st_puts(h, "{");
  if (n_meta) {
    st_puts(h, "\"__metadata__\":{");
    for (int i = 0; i < n_meta; i++) {
      if (i) st_puts(h, ",");
      st_put_json_string(h, keys[i]);
      st_puts(h, ":");
      st_put_json_string(h, values[i]);
    }
    st_puts(h, "}");
  }
  for (int i = 0; i < n; i++) {
    char num[64];
    const nb_tensor *t = items[i].t;
    items[i].begin = off;
    off += (uint64_t)nb_numel(t) * nb_dtype_size(nb_dtype_of(t));
    items[i].end = off;
    if (i || n_meta) st_puts(h, ",");
    st_put_json_string(h, items[i].name);
    st_puts(h, ":{\"dtype\":\"");
    st_puts(h, st_dtype_codes[nb_dtype_of(t)]);
    st_puts(h, "\",\"shape\":[");
    for (int d = 0; d < nb_ndim(t); d++) {
      snprintf(num, sizeof num, d ? ",%" PRId64 : "%" PRId64, nb_shape(t)[d]);
      st_puts(h, num);
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", items[i].begin, items[i].end);
    st_puts(h, num);
  }
  st_puts(h, "}");
  while (h->len % 8) st_puts(h, " ");
  return h->oom ? -1 : 0;
}

/* Writes one tensor's bytes, row-major and little-endian, from any device. */
static nb_status st_write_tensor(FILE *fp, const nb_tensor *t) {
  size_t nbytes = (size_t)nb_numel(t) * nb_dtype_size(nb_dtype_of(t));
  if (!nbytes) return NB_OK;
  unsigned char *host = malloc(nbytes);
  if (!host) return nb_error_set(NB_ERR_OOM, "nb_safetensors_save: out of memory (%zu bytes)", nbytes);
  nb_status st = nb_to_host(t, host, nbytes);
  if (!st && !st_little_endian()) st_swap_elements(host, nbytes, nb_dtype_size(nb_dtype_of(t)));
  if (!st && fwrite(host, 1, nbytes, fp) != nbytes) st = NB_ERR_IO;
  free(host);
  return st;
}

/* fsync of the directory holding path, so the rename itself is durable. */
static int st_sync_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? st_strdup(path, slash == path ? 1 : (size_t)(slash - path)) : st_strdup(".", 1);
  if (!dir) return -1;
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  free(dir);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  /* Some file systems refuse fsync on directories; the data is safe anyway. */
  if (rc && (errno == EINVAL || errno == EBADF)) rc = 0;
  close(fd);
  return rc;
}

static nb_status st_write_file(const char *path, const char *tmp, const st_text *h, int n,
                               const st_item *items) {
  FILE *fp = fopen(tmp, "wb");
  if (!fp) return nb_error_set(NB_ERR_IO, "nb_safetensors_save: cannot create '%s': %s", tmp, strerror(errno));
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h->len >> (8 * i));
  nb_status st = NB_OK;
  errno = 0;
  if (fwrite(len8, 1, 8, fp) != 8 || fwrite(h->s, 1, h->len, fp) != h->len) st = NB_ERR_IO;
  for (int i = 0; i < n && !st; i++) st = st_write_tensor(fp, items[i].t);
  int io_errno = errno;
  if (st == NB_ERR_IO || (!st && (fflush(fp) || fsync(fileno(fp))))) {
    if (!st) io_errno = errno;
    st = nb_error_set(NB_ERR_IO, "nb_safetensors_save: writing '%s': %s", path,
                      io_errno ? strerror(io_errno) : "short write");
  }
  if (fclose(fp) && !st) st = nb_error_set(NB_ERR_IO, "nb_safetensors_save: closing '%s': %s", path, strerror(errno));
  if (!st && rename(tmp, path))
    st = nb_error_set(NB_ERR_IO, "nb_safetensors_save: renaming onto '%s': %s", path, strerror(errno));
  if (!st && st_sync_dir(path))
    st = nb_error_set(NB_ERR_IO, "nb_safetensors_save: syncing the directory of '%s': %s", path, strerror(errno));
  return st;
}

nb_status nb_safetensors_save(const char *path, int n, const char *const *names,
                              nb_tensor *const *tensors, int n_meta, const char *const *meta_keys,
                              const char *const *meta_values) {
  nb_status st = st_check_save_args(path, n, names, tensors, n_meta, meta_keys, meta_values);
  if (st) return st;
  st_item *items = calloc(n ? (size_t)n : 1, sizeof *items);
  st_text h = {0};
  size_t tlen = strlen(path) + 32;
  char *tmp = malloc(tlen);
  if (items && tmp) {
    for (int i = 0; i < n; i++) items[i] = (st_item){names[i], tensors[i], 0, 0};
    qsort(items, (size_t)n, sizeof *items, st_cmp_items);
    snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
  }
  if (!items || !tmp || st_build_header(&h, n, items, n_meta, meta_keys, meta_values))
    st = nb_error_set(NB_ERR_OOM, "nb_safetensors_save: out of memory building the header of '%s'", path);
  else {
    st = st_write_file(path, tmp, &h, n, items);
    if (st) remove(tmp); /* no-op after a successful rename */
  }
  free(h.s);
  free(tmp);
  free(items);
  return st;
}
