/* Strict JSON reader: a recursive-descent parser over a byte span that never
 * reads past its end. Values are plain structs; containers own malloc'd
 * arrays of children. See json.h for what "strict" covers. */
#include "io/json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const unsigned char *s;
  size_t n, pos;
  int max_depth;
  char *err;
  size_t errn;
  int failed;
} json_parser;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int json_fail(json_parser *p, const char *fmt, ...) {
  if (p->failed) return -1;
  p->failed = 1;
  if (p->err && p->errn) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(p->err, p->errn, "%s at byte %zu", msg, p->pos);
  }
  return -1;
}

const char *nb_json_type_name(nb_json_type t) {
  static const char *const names[] = {"null", "boolean", "number", "string", "array", "object"};
  return (unsigned)t <= NB_JSON_OBJECT ? names[t] : "invalid";
}

static void json_free_inner(nb_json *v) {
  if (!v) return;
  free(v->str);
  for (size_t i = 0; i < v->n; i++) {
    if (v->items) json_free_inner(&v->items[i]);
    if (v->keys) json_free_inner(&v->keys[i]);
  }
  free(v->items);
  free(v->keys);
}

void nb_json_free(nb_json *v) {
  json_free_inner(v);
  free(v);
}

static void json_skip_ws(json_parser *p) {
  while (p->pos < p->n) {
    unsigned char c = p->s[p->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    p->pos++;
  }
}

/* ---- UTF-8 ---------------------------------------------------------------- */
/* Length of the valid UTF-8 sequence at s[0..n), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp, min;
  if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
  else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
  else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
  else return 0;
  if (len > n) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

int nb_json_utf8_valid(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq(u + i, n - i);
    if (!k) return 0;
    i += k;
  }
  return 1;
}

static size_t utf8_put(char *out, uint32_t cp) {
  if (cp < 0x80) { out[0] = (char)cp; return 1; }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* ---- strings ---------------------------------------------------------------- */
static int json_hex4(json_parser *p, uint32_t *out) {
  if (p->n - p->pos < 4) return json_fail(p, "truncated \\u escape");
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned char c = p->s[p->pos + i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return json_fail(p, "bad hex digit in \\u escape");
    v = v * 16 + (uint32_t)d;
  }
  p->pos += 4;
  *out = v;
  return 0;
}

/* After the 'u' of \uXXXX: decodes one code point, pairing surrogates. */
static int json_unicode_escape(json_parser *p, uint32_t *cp) {
  if (json_hex4(p, cp)) return -1;
  if (*cp >= 0xDC00 && *cp <= 0xDFFF) return json_fail(p, "unpaired low surrogate escape");
  if (*cp < 0xD800 || *cp > 0xDBFF) return 0;
  if (p->n - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
    return json_fail(p, "unpaired high surrogate escape");
  p->pos += 2;
  uint32_t lo;
  if (json_hex4(p, &lo)) return -1;
  if (lo < 0xDC00 || lo > 0xDFFF) return json_fail(p, "bad low surrogate escape");
  *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
  return 0;
}

static int json_escape(json_parser *p, char *out, size_t *k) {
  unsigned char c = p->s[p->pos++];
  const char *simple = "\"\"\\\\//b\bf\fn\nr\rt\t";
  for (const char *e = simple; *e; e += 2)
    if (c == (unsigned char)e[0]) { out[(*k)++] = e[1]; return 0; }
  if (c != 'u') { p->pos--; return json_fail(p, "bad escape '\\%c'", c >= 0x20 && c < 0x7F ? c : '?'); }
  uint32_t cp;
  if (json_unicode_escape(p, &cp)) return -1;
  *k += utf8_put(out + *k, cp);
  return 0;
}

/* At the opening quote. The decoded string is never longer than its source
 * span (each escape of n bytes decodes to at most n bytes), so one buffer of
 * the remaining length bounds it; it is shrunk to the end of the string. */
static int json_string(json_parser *p, nb_json *v) {
  p->pos++;
  size_t end = p->pos;
  while (end < p->n && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
  if (end >= p->n) return json_fail(p, "unterminated string");
  char *out = malloc(end - p->pos + 1);
  if (!out) return json_fail(p, "out of memory");
  size_t k = 0;
  while (p->pos < end) {
    unsigned char c = p->s[p->pos];
    if (c == '\\') {
      p->pos++;
      if (json_escape(p, out, &k)) { free(out); return -1; }
    } else if (c < 0x20) {
      free(out);
      return json_fail(p, "control character 0x%02x in string", c);
    } else {
      size_t len = utf8_seq(p->s + p->pos, end - p->pos);
      if (!len) { free(out); return json_fail(p, "invalid UTF-8 in string"); }
      memcpy(out + k, p->s + p->pos, len);
      k += len;
      p->pos += len;
    }
  }
  if (p->pos != end) { free(out); return json_fail(p, "malformed escape at end of string"); }
  p->pos++; /* closing quote */
  out[k] = 0;
  v->type = NB_JSON_STRING;
  v->str = out;
  v->len = k;
  return 0;
}

/* ---- numbers and literals -------------------------------------------------- */
static int is_digit(json_parser *p) { return p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9'; }

static int json_number(json_parser *p, nb_json *v) {
  int neg = 0, integral = 1, overflow = 0;
  uint64_t mag = 0;
  if (p->s[p->pos] == '-') { neg = 1; p->pos++; }
  if (!is_digit(p)) return json_fail(p, "bad number");
  if (p->s[p->pos] == '0') p->pos++;
  else
    while (is_digit(p)) {
      unsigned d = p->s[p->pos++] - '0';
      if (mag > (UINT64_MAX - d) / 10) overflow = 1;
      else mag = mag * 10 + d;
    }
  if (p->pos < p->n && p->s[p->pos] == '.') {
    integral = 0;
    p->pos++;
    if (!is_digit(p)) return json_fail(p, "bad number: digits expected after '.'");
    while (is_digit(p)) p->pos++;
  }
  if (p->pos < p->n && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
    integral = 0;
    p->pos++;
    if (p->pos < p->n && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
    if (!is_digit(p)) return json_fail(p, "bad number: digits expected in exponent");
    while (is_digit(p)) p->pos++;
  }
  v->type = NB_JSON_NUMBER;
  uint64_t lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  if (integral && !overflow && mag <= lim) {
    v->is_int = 1;
    v->ival = neg ? (int64_t)(0 - mag) : (int64_t)mag;
  }
  return 0;
}

static int json_literal(json_parser *p, nb_json *v) {
  static const struct { const char *word; nb_json_type type; int b; } lits[] = {
      {"true", NB_JSON_BOOL, 1}, {"false", NB_JSON_BOOL, 0}, {"null", NB_JSON_NULL, 0}};
  for (size_t i = 0; i < sizeof lits / sizeof lits[0]; i++) {
    size_t len = strlen(lits[i].word);
    if (p->n - p->pos >= len && !memcmp(p->s + p->pos, lits[i].word, len)) {
      p->pos += len;
      v->type = lits[i].type;
      v->boolean = lits[i].b;
      return 0;
    }
  }
  unsigned char c = p->s[p->pos];
  return json_fail(p, "unexpected character '%c' (0x%02x)", c >= 0x20 && c < 0x7F ? c : '?', c);
}

/* ---- containers --------------------------------------------------------------- */
static int json_value(json_parser *p, nb_json *v, int depth);

/* Grows *arr (of *cap elements of size sz) to hold at least need. */
static int json_grow(json_parser *p, void **arr, size_t *cap, size_t need, size_t sz) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap * 2 : 4;
  void *na = realloc(*arr, nc * sz);
  if (!na) return json_fail(p, "out of memory");
  memset((char *)na + *cap * sz, 0, (nc - *cap) * sz);
  *arr = na;
  *cap = nc;
  return 0;
}

static int json_array(json_parser *p, nb_json *v, int depth) {
  size_t cap = 0;
  v->type = NB_JSON_ARRAY;
  p->pos++;
  json_skip_ws(p);
  if (p->pos < p->n && p->s[p->pos] == ']') { p->pos++; return 0; }
  for (;;) {
    if (json_grow(p, (void **)&v->items, &cap, v->n + 1, sizeof *v->items)) return -1;
    v->n++; /* counted before parsing so a failure frees the partial child */
    if (json_value(p, &v->items[v->n - 1], depth + 1)) return -1;
    json_skip_ws(p);
    if (p->pos >= p->n) return json_fail(p, "unterminated array");
    unsigned char c = p->s[p->pos++];
    if (c == ']') return 0;
    if (c != ',') { p->pos--; return json_fail(p, "expected ',' or ']' in array"); }
  }
}

static int key_cmp(const void *a, const void *b) {
  const nb_json *x = *(const nb_json *const *)a, *y = *(const nb_json *const *)b;
  size_t m = x->len < y->len ? x->len : y->len;
  int c = memcmp(x->str, y->str, m);
  return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Duplicate keys: pairwise for small objects, by sorting key pointers for
 * large ones (a header may name thousands of tensors). */
static int json_check_duplicates(json_parser *p, const nb_json *obj) {
  if (obj->n <= 16) {
    for (size_t i = 0; i < obj->n; i++)
      for (size_t j = i + 1; j < obj->n; j++)
        if (obj->keys[i].len == obj->keys[j].len &&
            !memcmp(obj->keys[i].str, obj->keys[j].str, obj->keys[i].len))
          return json_fail(p, "duplicate key \"%.80s\"", obj->keys[i].str);
    return 0;
  }
  const nb_json **ptr = malloc(obj->n * sizeof *ptr);
  if (!ptr) return json_fail(p, "out of memory");
  for (size_t i = 0; i < obj->n; i++) ptr[i] = &obj->keys[i];
  qsort(ptr, obj->n, sizeof *ptr, key_cmp);
  int rc = 0;
  for (size_t i = 1; i < obj->n && !rc; i++)
    if (!key_cmp(&ptr[i - 1], &ptr[i])) rc = json_fail(p, "duplicate key \"%.80s\"", ptr[i]->str);
  free(ptr);
  return rc;
}

/* Room for one more member: items and keys grow together. */
static int json_grow_member(json_parser *p, nb_json *obj, size_t *cap) {
  if (obj->n < *cap) return 0;
  size_t nc = *cap ? *cap * 2 : 4;
  nb_json *ni = realloc(obj->items, nc * sizeof *ni);
  if (ni) obj->items = ni;
  nb_json *nk = ni ? realloc(obj->keys, nc * sizeof *nk) : NULL;
  if (nk) obj->keys = nk;
  if (!ni || !nk) return json_fail(p, "out of memory");
  memset(ni + *cap, 0, (nc - *cap) * sizeof *ni);
  memset(nk + *cap, 0, (nc - *cap) * sizeof *nk);
  *cap = nc;
  return 0;
}

static int json_member(json_parser *p, nb_json *obj, size_t *cap, int depth) {
  if (json_grow_member(p, obj, cap)) return -1;
  obj->n++; /* counted before parsing so a failure frees the partial member */
  json_skip_ws(p);
  if (p->pos >= p->n || p->s[p->pos] != '"') return json_fail(p, "expected a string key");
  if (json_string(p, &obj->keys[obj->n - 1])) return -1;
  json_skip_ws(p);
  if (p->pos >= p->n || p->s[p->pos] != ':') return json_fail(p, "expected ':' after key");
  p->pos++;
  return json_value(p, &obj->items[obj->n - 1], depth + 1);
}

static int json_object(json_parser *p, nb_json *v, int depth) {
  size_t cap = 0;
  v->type = NB_JSON_OBJECT;
  p->pos++;
  json_skip_ws(p);
  if (p->pos < p->n && p->s[p->pos] == '}') { p->pos++; return 0; }
  for (;;) {
    if (json_member(p, v, &cap, depth)) return -1;
    json_skip_ws(p);
    if (p->pos >= p->n) return json_fail(p, "unterminated object");
    unsigned char c = p->s[p->pos++];
    if (c == '}') return json_check_duplicates(p, v);
    if (c != ',') { p->pos--; return json_fail(p, "expected ',' or '}' in object"); }
  }
}

static int json_value(json_parser *p, nb_json *v, int depth) {
  if (depth > p->max_depth) return json_fail(p, "nesting deeper than %d", p->max_depth);
  json_skip_ws(p);
  if (p->pos >= p->n) return json_fail(p, "unexpected end of input");
  unsigned char c = p->s[p->pos];
  if (c == '{') return json_object(p, v, depth);
  if (c == '[') return json_array(p, v, depth);
  if (c == '"') return json_string(p, v);
  if (c == '-' || (c >= '0' && c <= '9')) return json_number(p, v);
  return json_literal(p, v);
}

nb_json *nb_json_parse(const char *text, size_t n, int max_depth, char *err, size_t errn) {
  json_parser p = {(const unsigned char *)text, n, 0, max_depth, err, errn, 0};
  if (err && errn) err[0] = 0;
  nb_json *v = calloc(1, sizeof *v);
  if (!v) { json_fail(&p, "out of memory"); return NULL; }
  if (!text && n) { json_fail(&p, "no input"); free(v); return NULL; }
  int rc = json_value(&p, v, 1);
  if (!rc) {
    json_skip_ws(&p);
    if (p.pos != p.n) rc = json_fail(&p, "trailing characters after the JSON value");
  }
  if (rc) { nb_json_free(v); return NULL; }
  return v;
}

const nb_json *nb_json_get(const nb_json *obj, const char *key) {
  if (!obj || obj->type != NB_JSON_OBJECT || !key) return NULL;
  size_t len = strlen(key);
  for (size_t i = 0; i < obj->n; i++)
    if (obj->keys[i].len == len && !memcmp(obj->keys[i].str, key, len)) return &obj->items[i];
  return NULL;
}
