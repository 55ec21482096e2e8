/* A small strict JSON reader (RFC 8259) for safetensors headers.
 *
 * Strict means: exactly one value with only whitespace around it, valid
 * UTF-8 everywhere, no control characters in strings, escapes checked
 * (surrogates paired), duplicate object keys rejected, nesting depth capped.
 * Numbers are checked against the grammar; integer tokens (no fraction, no
 * exponent) that fit in int64 are also decoded, since a header only needs
 * integers. Internal to the library (prefix nb_json_). */
#ifndef NB_JSON_H
#define NB_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  NB_JSON_NULL, NB_JSON_BOOL, NB_JSON_NUMBER, NB_JSON_STRING, NB_JSON_ARRAY, NB_JSON_OBJECT
} nb_json_type;

typedef struct nb_json nb_json;
struct nb_json {
  nb_json_type type;
  int boolean;          /* BOOL */
  int is_int;           /* NUMBER: an integer token that fits in int64 */
  int64_t ival;         /* NUMBER: its value when is_int */
  char *str;            /* STRING: decoded UTF-8, NUL-terminated */
  size_t len;           /* STRING: bytes, excluding the terminator */
  size_t n;             /* ARRAY, OBJECT: item count */
  nb_json *items;       /* ARRAY, OBJECT: the values */
  nb_json *keys;        /* OBJECT: the keys (STRING values), parallel to items */
};

/* Parses text[0..n). Returns a tree owned by the caller (nb_json_free) or
 * NULL with a message in err (e.g. "expected ':' at byte 17"). */
nb_json *nb_json_parse(const char *text, size_t n, int max_depth, char *err, size_t errn);
void nb_json_free(nb_json *v);
/* The value under key in an object, or NULL. */
const nb_json *nb_json_get(const nb_json *obj, const char *key);
const char *nb_json_type_name(nb_json_type t);
/* 1 if s[0..n) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
int nb_json_utf8_valid(const char *s, size_t n);

#endif /* NB_JSON_H */
