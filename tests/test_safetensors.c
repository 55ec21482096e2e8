/* safetensors: bit-exact round trips for every dtype, strided tensors,
 * metadata, byte-for-byte compatibility with the Python library's layout,
 * atomic writes, and a catalogue of corrupt files that must each be
 * rejected with a message saying what is wrong. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
  static char buf[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
  return buf[k];
}

/* Row-major bytes of any tensor (malloc'd; *n set). */
static unsigned char *bytes_of(const nb_tensor *t, size_t *n) {
  *n = (size_t)nb_numel(t) * nb_dtype_size(nb_dtype_of(t));
  unsigned char *b = malloc(*n ? *n : 1);
  if (b && nb_to_host(t, b, *n)) {
    free(b);
    return NULL;
  }
  return b;
}

static int same_tensor(const nb_tensor *a, const nb_tensor *b) {
  if (!a || !b || nb_dtype_of(a) != nb_dtype_of(b) || nb_ndim(a) != nb_ndim(b)) return 0;
  for (int i = 0; i < nb_ndim(a); i++)
    if (nb_shape(a)[i] != nb_shape(b)[i]) return 0;
  size_t na, nb;
  unsigned char *x = bytes_of(a, &na), *y = bytes_of(b, &nb);
  int ok = x && y && na == nb && !memcmp(x, y, na);
  free(x);
  free(y);
  return ok;
}

/* A tensor of dtype dt filled with arbitrary bit patterns (bools 0/1),
 * including NaN payloads, infinities and subnormals for the float types. */
static nb_tensor *patterned(nb_dtype dt, int ndim, const int64_t *shape, uint32_t seed) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  size_t es = nb_dtype_size(dt), nbytes = (size_t)n * es;
  unsigned char *b = malloc(nbytes ? nbytes : 1);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < nbytes; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    b[i] = (unsigned char)(dt == NB_BOOL ? x & 1 : x);
  }
  if (dt == NB_F32 && n >= 3) {
    uint32_t special[3] = {0x7fc12345u, 0xff800000u, 0x00000001u}; /* NaN payload, -inf, subnormal */
    memcpy(b, special, sizeof special);
  }
  nb_tensor *t = nb_from_buffer(b, ndim, shape, dt, NB_DEVICE_CPU);
  free(b);
  return t;
}

/* ---- round trips ---------------------------------------------------------- */
static void test_roundtrip_dtypes(void) {
  nb_scope_begin();
  int64_t live = nb_live_tensors();
  const int64_t shapes[4][3] = {{3, 5, 7}, {1, 0, 0}, {0}, {6, 1, 0}};
  const int ndims[4] = {3, 1, 0, 2};
  nb_tensor *ts[NB_DTYPE_COUNT * 4];
  char namebuf[NB_DTYPE_COUNT * 4][32];
  const char *names[NB_DTYPE_COUNT * 4];
  int n = 0;
  for (int d = 0; d < NB_DTYPE_COUNT; d++)
    for (int s = 0; s < 4; s++, n++) {
      ts[n] = patterned((nb_dtype)d, ndims[s], shapes[s], (uint32_t)n + 1);
      snprintf(namebuf[n], sizeof namebuf[n], "%s.shape%d", nb_dtype_name((nb_dtype)d), s);
      names[n] = namebuf[n];
    }
  const char *path = tmp_path("dtypes.safetensors");
  NBT_CHECK(nb_safetensors_save(path, n, names, ts, 0, NULL, NULL) == NB_OK, "save: %s", nb_last_error());
  nb_st_file *f = nb_safetensors_load(path);
  NBT_CHECK(f != NULL, "load: %s", nb_last_error());
  if (f) {
    NBT_CHECK(nb_st_count(f) == n, "count %d (expected %d)", nb_st_count(f), n);
    for (int i = 0; i < n; i++) {
      nb_tensor *t = nb_st_tensor(f, names[i]);
      NBT_CHECK(same_tensor(t, ts[i]), "%s round-trips bit for bit", names[i]);
      NBT_CHECK(t && nb_device_of(t).type == NB_CPU && nb_is_contiguous(t), "%s is a CPU tensor", names[i]);
    }
    for (int i = 1; i < nb_st_count(f); i++)
      NBT_CHECK(strcmp(nb_st_name(f, i - 1), nb_st_name(f, i)) < 0, "names listed in sorted order");
    NBT_CHECK(nb_st_name(f, n) == NULL && nb_st_name(f, -1) == NULL, "name index out of range gives NULL");
    NBT_CHECK(nb_st_metadata(f, "format") == NULL, "no metadata");
    nbt_check_error("absent tensor", nb_st_tensor(f, "nope") == NULL, NB_ERR_INDEX, "nope", NULL);
    nb_st_close(f);
  }
  nb_scope_end();
  NBT_CHECK(nb_live_tensors() == live, "no tensors leaked (%lld live, %lld before)",
            (long long)nb_live_tensors(), (long long)live);
}

static void test_roundtrip_strided(void) {
  nb_scope_begin();
  int64_t s[2] = {5, 6};
  nb_tensor *base = patterned(NB_F64, 2, s, 99);
  nb_tensor *tr = nb_transpose(base, 0, 1);             /* (6, 5), strides (1, 6) */
  nb_tensor *sl = nb_slice(base, 1, 1, 6, 2);           /* (5, 3), stride 2 */
  nb_tensor *ex = nb_expand(nb_slice(base, 0, 0, 1, 1), 2, (int64_t[]){4, 6}); /* stride 0 */
  NBT_CHECK(!nb_is_contiguous(tr) && !nb_is_contiguous(sl), "views are strided");
  nb_tensor *ts[3] = {tr, sl, ex};
  const char *names[3] = {"transposed", "sliced", "expanded"};
  const char *path = tmp_path("strided.safetensors");
  NBT_CHECK(nb_safetensors_save(path, 3, names, ts, 0, NULL, NULL) == NB_OK, "save: %s", nb_last_error());
  nb_st_file *f = nb_safetensors_load(path);
  NBT_CHECK(f != NULL, "load: %s", nb_last_error());
  for (int i = 0; f && i < 3; i++) {
    nb_tensor *t = nb_st_tensor(f, names[i]);
    NBT_CHECK(same_tensor(t, nb_contiguous(ts[i])), "%s is stored in row-major order", names[i]);
    /* values checked elementwise too, independent of nb_to_host */
    int ok = t != NULL;
    for (int64_t a = 0; ok && a < nb_size(t, 0); a++)
      for (int64_t b = 0; b < nb_size(t, 1); b++)
        ok &= nb_get(t, (int64_t[]){a, b}) == nb_get(ts[i], (int64_t[]){a, b}) ||
              (isnan(nb_get(t, (int64_t[]){a, b})) && isnan(nb_get(ts[i], (int64_t[]){a, b})));
    NBT_CHECK(ok, "%s elementwise", names[i]);
  }
  nb_st_close(f);
  nb_scope_end();
}

static void test_metadata(void) {
  nb_scope_begin();
  nb_tensor *t = nb_arange(0, 4, 1, NB_F32, NB_DEVICE_CPU);
  const char *keys[4] = {"format", "quote\"and\\slash", "control\n\t\x01", "unicode \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"};
  const char *vals[4] = {"pt", "va\"l\\ue", "line1\nline2\r\x1f", "\xe2\x88\x87 nabla"};
  const char *name = "w";
  const char *path = tmp_path("meta.safetensors");
  NBT_CHECK(nb_safetensors_save(path, 1, &name, &t, 4, keys, vals) == NB_OK, "save: %s", nb_last_error());
  nb_st_file *f = nb_safetensors_load(path);
  NBT_CHECK(f != NULL, "load: %s", nb_last_error());
  for (int i = 0; f && i < 4; i++) {
    const char *v = nb_st_metadata(f, keys[i]);
    NBT_CHECK(v && !strcmp(v, vals[i]), "metadata \"%s\" round-trips (got \"%s\")", keys[i], v ? v : "(null)");
  }
  NBT_CHECK(f && nb_st_metadata(f, "absent") == NULL, "absent key gives NULL");
  nb_st_close(f);
  /* header padded with spaces to a multiple of 8, as Python pads it */
  FILE *fp = fopen(path, "rb");
  unsigned char len8[8] = {0};
  NBT_CHECK(fp && fread(len8, 1, 8, fp) == 8, "read header length");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
  NBT_CHECK(hlen % 8 == 0, "header length %llu is a multiple of 8", (unsigned long long)hlen);
  if (fp) fclose(fp);
  /* metadata only, no tensors */
  const char *path2 = tmp_path("meta_only.safetensors");
  NBT_CHECK(nb_safetensors_save(path2, 0, NULL, NULL, 1, keys, vals) == NB_OK, "save metadata only");
  f = nb_safetensors_load(path2);
  NBT_CHECK(f && nb_st_count(f) == 0 && nb_st_metadata(f, "format") && !strcmp(nb_st_metadata(f, "format"), "pt"),
            "metadata-only file");
  nb_st_close(f);
  nb_scope_end();
}

/* ---- byte-level files -------------------------------------------------------- */
typedef struct {
  unsigned char *b;
  size_t n;
} blob;

/* u64 header length | header | data, header padded with spaces to 8 bytes
 * when pad is set (as Python writes it). */
static blob make_file(const char *header, const void *data, size_t ndata, int pad) {
  size_t h = strlen(header), hp = pad ? (h + 7) / 8 * 8 : h;
  blob f = {malloc(8 + hp + ndata + 1), 8 + hp + ndata};
  for (int i = 0; i < 8; i++) f.b[i] = (unsigned char)((uint64_t)hp >> (8 * i));
  memcpy(f.b + 8, header, h);
  memset(f.b + 8 + h, ' ', hp - h);
  if (ndata) memcpy(f.b + 8 + hp, data, ndata);
  return f;
}

static void test_python_layout(void) {
  nb_scope_begin();
  /* What `safetensors.torch.save_file({"x": f64[1], "a": f32[2], "b": f32[2,1]},
   * metadata={"format": "pt"})` writes: compact JSON, metadata first, then the
   * tensors in data order (wider dtypes first, then by name), padded. */
  const char *header =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[16,24]}}";
  unsigned char data[24];
  double x = -1.25;
  float a[2] = {1.5f, -2.0f}, b[2] = {3.0f, 0.25f};
  memcpy(data, &x, 8); /* the test host is little-endian, like the file */
  memcpy(data + 8, a, 8);
  memcpy(data + 16, b, 8);
  blob py = make_file(header, data, sizeof data, 1);
  NBT_CHECK((py.n - 8 - 24) % 8 == 0, "reference header padded");
  nb_st_file *f = nb_safetensors_parse(py.b, py.n);
  NBT_CHECK(f != NULL, "parse the Python layout: %s", nb_last_error());
  if (f) {
    nb_tensor *tx = nb_st_tensor(f, "x"), *ta = nb_st_tensor(f, "a"), *tb = nb_st_tensor(f, "b");
    NBT_CHECK(tx && nb_dtype_of(tx) == NB_F64 && nb_ndim(tx) == 1 && nb_item(tx) == -1.25, "x");
    NBT_CHECK(ta && nb_dtype_of(ta) == NB_F32 && nb_get(ta, (int64_t[]){1}) == -2.0, "a");
    NBT_CHECK(tb && nb_ndim(tb) == 2 && nb_size(tb, 0) == 2 && nb_get(tb, (int64_t[]){1, 0}) == 0.25, "b");
    NBT_CHECK(nb_st_metadata(f, "format") && !strcmp(nb_st_metadata(f, "format"), "pt"), "format pt");
    /* and our writer produces exactly the same bytes from the same tensors */
    nb_tensor *ts[3] = {ta, tb, tx};
    const char *names[3] = {"a", "b", "x"}, *mk = "format", *mv = "pt";
    const char *path = tmp_path("python.safetensors");
    NBT_CHECK(nb_safetensors_save(path, 3, names, ts, 1, &mk, &mv) == NB_OK, "save: %s", nb_last_error());
    FILE *fp = fopen(path, "rb");
    unsigned char *mine = malloc(py.n + 16);
    size_t got = fp ? fread(mine, 1, py.n + 16, fp) : 0;
    if (fp) fclose(fp);
    NBT_CHECK(got == py.n && !memcmp(mine, py.b, py.n), "writer output identical to the Python layout "
              "(%zu vs %zu bytes)", got, py.n);
    free(mine);
    nb_st_close(f);
  }
  free(py.b);
  /* Every dtype class and an escaped metadata value, as safetensors 0.8
   * writes {"i": i64 arange(3), "f": f64 arange(2), "h": f16 zeros(3),
   * "u": u8 ones(5), "q": bool True (0-d)}: data order I64, F64, F16, U8,
   * BOOL; serde_json escapes; 7 spaces of padding. */
  const char *header2 =
      "{\"__metadata__\":{\"k\":\"q\\\"\\\\\\n\\u0001\xc3\xa9\"},"
      "\"i\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]},"
      "\"f\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[24,40]},"
      "\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[40,46]},"
      "\"u\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[46,51]},"
      "\"q\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[51,52]}}";
  unsigned char data2[52] = {0};
  int64_t iv[3] = {0, 1, 2};
  double fv[2] = {0, 1};
  memcpy(data2, iv, 24);
  memcpy(data2 + 24, fv, 16);
  memset(data2 + 46, 1, 6);
  blob py2 = make_file(header2, data2, sizeof data2, 1);
  nb_tensor *t2[5] = {nb_arange(0, 3, 1, NB_I64, NB_DEVICE_CPU), nb_arange(0, 2, 1, NB_F64, NB_DEVICE_CPU),
                      nb_zeros(1, (int64_t[]){3}, NB_F16, NB_DEVICE_CPU),
                      nb_ones(1, (int64_t[]){5}, NB_U8, NB_DEVICE_CPU), nb_scalar(1, NB_BOOL, NB_DEVICE_CPU)};
  const char *n2[5] = {"q", "u", "h", "f", "i"}; /* the writer orders them */
  nb_tensor *t2o[5] = {t2[4], t2[3], t2[2], t2[1], t2[0]};
  const char *k2 = "k", *v2 = "q\"\\\n\x01\xc3\xa9";
  const char *path2 = tmp_path("python2.safetensors");
  NBT_CHECK(nb_safetensors_save(path2, 5, n2, t2o, 1, &k2, &v2) == NB_OK, "save: %s", nb_last_error());
  FILE *fp2 = fopen(path2, "rb");
  unsigned char *mine2 = malloc(py2.n + 16);
  size_t got2 = fp2 ? fread(mine2, 1, py2.n + 16, fp2) : 0;
  if (fp2) fclose(fp2);
  NBT_CHECK(got2 == py2.n && !memcmp(mine2, py2.b, py2.n), "writer output identical to the Python layout "
            "with every dtype class (%zu vs %zu bytes)", got2, py2.n);
  free(mine2);
  f = nb_safetensors_parse(py2.b, py2.n);
  NBT_CHECK(f && nb_st_metadata(f, "k") && !strcmp(nb_st_metadata(f, "k"), v2), "escaped metadata read back");
  for (int i = 0; f && i < 5; i++)
    NBT_CHECK(same_tensor(nb_st_tensor(f, n2[i]), t2o[i]), "python layout tensor %s", n2[i]);
  nb_st_close(f);
  free(py2.b);
  /* Python also accepts an unpadded header and "__metadata__": null */
  float one = 1.0f;
  blob u = make_file("{\"__metadata__\":null,\"o\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}",
                     &one, 4, 0);
  f = nb_safetensors_parse(u.b, u.n);
  NBT_CHECK(f && nb_item(nb_st_tensor(f, "o")) == 1.0, "unpadded header, null metadata, 0-d tensor: %s",
            nb_last_error());
  nb_st_close(f);
  free(u.b);
  nb_scope_end();
}

/* ---- corrupt files -------------------------------------------------------------- */
static void expect_reject(const char *what, blob f, const char *needle) {
  nb_clear_error();
  nb_st_file *s = nb_safetensors_parse(f.b, f.n);
  nbt_check_error(what, s == NULL, NB_ERR_IO, "<memory>", needle, NULL);
  nb_st_close(s);
  free(f.b);
}

static void reject_header(const char *what, const char *header, size_t ndata, const char *needle) {
  unsigned char data[256] = {0};
  expect_reject(what, make_file(header, data, ndata, 1), needle);
}

#define T1(dt, shape, off) "{\"t\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" off "}}"

static void test_corrupt(void) {
  /* sizes and lengths */
  blob tiny = {malloc(5), 5};
  memset(tiny.b, 0, 5);
  expect_reject("file shorter than 8 bytes", tiny, "too short");
  blob past = make_file(T1("F32", "[2]", "[0,8]"), "01234567", 8, 1);
  past.b[0] = 0xff, past.b[1] = 0x10; /* header length beyond the file */
  expect_reject("header length past the end", past, "past the end of the file");
  blob huge = make_file(T1("F32", "[2]", "[0,8]"), "01234567", 8, 1);
  huge.b[7] = 0x80;
  expect_reject("header length over the cap", huge, "limit");
  blob trunc = make_file(T1("F32", "[2]", "[0,8]"), "01234567", 8, 1);
  trunc.n -= 1;
  expect_reject("truncated data", trunc, "past the end of the data section");
  blob cut = make_file(T1("F32", "[2]", "[0,8]"), "01234567", 8, 1);
  cut.n = 20;
  expect_reject("truncated inside the header", cut, "past the end of the file");
  reject_header("offsets past the end", T1("F32", "[2]", "[8,16]"), 8, "past the end of the data section");
  reject_header("trailing bytes after the tensors", T1("F32", "[2]", "[0,8]"), 12, "cover only");
  /* layout of the data section */
  reject_header("overlapping ranges",
                "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlaps");
  reject_header("a hole",
                "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, "hole");
  reject_header("a hole at the start", T1("U8", "[4]", "[4,8]"), 8, "hole");
  reject_header("span != numel * size", T1("F32", "[3]", "[0,8]"), 8, "needs 12 bytes");
  reject_header("span != numel * size (dtype)", T1("F64", "[2]", "[0,8]"), 8, "needs 16 bytes");
  reject_header("begin > end", T1("U8", "[0]", "[8,0]"), 8, "end before");
  reject_header("shape overflow", T1("F64", "[4294967296,4294967296,4294967296]", "[0,8]"), 8, "overflow");
  reject_header("negative shape", T1("F32", "[-2]", "[0,8]"), 8, "non-negative");
  reject_header("fractional shape", T1("F32", "[2.0]", "[0,8]"), 8, "non-negative integer");
  reject_header("too many dims", T1("U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]"), 1, "dimensions");
  reject_header("offset too large", T1("U8", "[1]", "[0,18446744073709551616]"), 1, "non-negative integers");
  reject_header("one offset", T1("U8", "[1]", "[1]"), 1, "two integers");
  /* schema */
  reject_header("unknown dtype", T1("I16", "[1]", "[0,2]"), 2, "unsupported dtype \"I16\"");
  reject_header("dtype not a string", T1("\",\"x\":\"", "[1]", "[0,1]"), 1, "unknown field");
  reject_header("missing dtype", "{\"t\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "dtype");
  reject_header("entry not an object", "{\"t\":[1,2]}", 0, "expected an object");
  reject_header("header not an object", "[1,2]", 0, "expected an object");
  reject_header("metadata value not a string", "{\"__metadata__\":{\"k\":1}}", 0, "must be a string");
  reject_header("metadata not an object", "{\"__metadata__\":[]}", 0, "must be an object");
  reject_header("NUL in a name", "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, "NUL");
  /* duplicate names are duplicate keys of the header object */
  reject_header("duplicate names",
                "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "duplicate key \"a\"");
  reject_header("duplicate metadata keys", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "duplicate key");
  /* JSON syntax */
  reject_header("malformed JSON: unterminated", "{\"t\":{\"dtype\":\"U8\"", 0, "malformed JSON");
  reject_header("malformed JSON: trailing garbage", "{} x", 0, "trailing characters");
  reject_header("malformed JSON: trailing comma", "{\"__metadata__\":{},}", 0, "malformed JSON");
  reject_header("malformed JSON: single quotes", "{'a':1}", 0, "malformed JSON");
  reject_header("malformed JSON: bad escape", "{\"\\x\":1}", 0, "bad escape");
  reject_header("malformed JSON: lone surrogate", "{\"\\ud800\":1}", 0, "surrogate");
  reject_header("malformed JSON: leading zero", T1("U8", "[01]", "[0,1]"), 1, "malformed JSON");
  reject_header("malformed JSON: invalid UTF-8", "{\"\xc3\x28\":1}", 0, "UTF-8");
  reject_header("malformed JSON: overlong UTF-8", "{\"\xc0\xaf\":1}", 0, "UTF-8");
  reject_header("malformed JSON: control char", "{\"a\nb\":1}", 0, "control character");
  reject_header("empty header", "", 0, "unexpected end");
  char deep[200] = "{\"__metadata__\":";
  for (int i = 0; i < 40; i++) strcat(deep, "[");
  reject_header("deep nesting", deep, 0, "nesting");
  /* through the file API too: the message names the path */
  const char *path = tmp_path("corrupt.safetensors");
  blob bad = make_file(T1("F32", "[3]", "[0,8]"), "01234567", 8, 1);
  FILE *fp = fopen(path, "wb");
  if (fp) {
    fwrite(bad.b, 1, bad.n, fp);
    fclose(fp);
  }
  free(bad.b);
  nbt_check_error("corrupt file on disk", nb_safetensors_load(path) == NULL, NB_ERR_IO, path, "needs 12 bytes", NULL);
  nbt_check_error("missing file", nb_safetensors_load(tmp_path("absent.safetensors")) == NULL, NB_ERR_IO,
                  "absent.safetensors", "No such file", NULL);
  nbt_check_error("a directory", nb_safetensors_load(tmpdir) == NULL, NB_ERR_IO, tmpdir, NULL);
}

/* ---- writing ------------------------------------------------------------------ */
static int count_temp_files(void) {
  DIR *d = opendir(tmpdir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
  if (d) closedir(d);
  return n;
}

static void test_atomic_write(void) {
  nb_scope_begin();
  const char *path = tmp_path("atomic.safetensors");
  nb_tensor *a = nb_full(1, (int64_t[]){3}, 1.0, NB_F32, NB_DEVICE_CPU);
  nb_tensor *b = nb_full(1, (int64_t[]){5}, 2.0, NB_F64, NB_DEVICE_CPU);
  const char *name = "t";
  NBT_CHECK(nb_safetensors_save(path, 1, &name, &a, 0, NULL, NULL) == NB_OK, "first save");
  NBT_CHECK(nb_safetensors_save(path, 1, &name, &b, 0, NULL, NULL) == NB_OK, "overwrite");
  NBT_CHECK(count_temp_files() == 0, "no temporary file left behind");
  nb_st_file *f = nb_safetensors_load(path);
  nb_tensor *t = f ? nb_st_tensor(f, "t") : NULL;
  NBT_CHECK(same_tensor(t, b), "the file holds the second version");
  nb_st_close(f);
  /* a failing save: the target directory does not exist */
  const char *bad = tmp_path("no/such/dir/x.safetensors");
  nbt_check_error("save into a missing directory", nb_safetensors_save(bad, 1, &name, &a, 0, NULL, NULL) != NB_OK,
                  NB_ERR_IO, "no/such/dir/x.safetensors", "No such file or directory", NULL);
  NBT_CHECK(count_temp_files() == 0, "no temporary file after a failure");
  /* argument errors, nothing written */
  const char *dup[2] = {"d", "d"};
  nb_tensor *two[2] = {a, b};
  const char *p2 = tmp_path("dup.safetensors");
  nbt_check_error("duplicate names", nb_safetensors_save(p2, 2, dup, two, 0, NULL, NULL) != NB_OK, NB_ERR_VALUE,
                  "duplicate tensor names", NULL);
  nb_tensor *none[1] = {NULL};
  nbt_check_error("NULL tensor", nb_safetensors_save(p2, 1, &name, none, 0, NULL, NULL) != NB_OK, NB_ERR_NULL,
                  "tensors", NULL);
  const char *bad_utf8 = "\xff";
  nbt_check_error("invalid UTF-8 name", nb_safetensors_save(p2, 1, &bad_utf8, &a, 0, NULL, NULL) != NB_OK,
                  NB_ERR_VALUE, "UTF-8", NULL);
  NBT_CHECK(access(p2, F_OK) != 0, "nothing written on argument errors");
  nb_scope_end();
}

static void test_cuda_tensor(void) {
  if (!nb_cuda_available()) return;
  nb_scope_begin();
  int64_t s[2] = {7, 9};
  nb_tensor *h = patterned(NB_BF16, 2, s, 5);
  nb_tensor *d = nb_transpose(nb_to_device(h, nb_device_cuda(0)), 0, 1);
  const char *name = "dev";
  const char *path = tmp_path("cuda.safetensors");
  NBT_CHECK(nb_safetensors_save(path, 1, &name, &d, 0, NULL, NULL) == NB_OK, "save a CUDA tensor: %s",
            nb_last_error());
  nb_st_file *f = nb_safetensors_load(path);
  NBT_CHECK(f && same_tensor(nb_st_tensor(f, "dev"), nb_transpose(h, 0, 1)), "CUDA tensor round-trips");
  nb_st_close(f);
  nb_scope_end();
}

static void remove_tmpdir(void) {
  DIR *d = opendir(tmpdir);
  for (struct dirent *e; d && (e = readdir(d));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) remove(tmp_path(e->d_name));
  if (d) closedir(d);
  rmdir(tmpdir);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/nb_st_XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_roundtrip_dtypes();
  test_roundtrip_strided();
  test_metadata();
  test_python_layout();
  test_corrupt();
  test_atomic_write();
  test_cuda_tensor();
  remove_tmpdir();
  return nbt_finish();
}
