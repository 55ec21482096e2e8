/* dtypes: sizes, names, promotion, and exact f16/bf16 conversions. */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "core/half.h"

static const size_t dtype_sizes[NB_DTYPE_COUNT] = {8, 4, 2, 2, 8, 4, 1, 1, 1, 1};
static const char *const dtype_names[NB_DTYPE_COUNT] = {"f64", "f32", "f16",  "bf16",   "i64",
                                                        "i32", "u8",  "bool", "f8e4m3", "f8e5m2"};

size_t nb_dtype_size(nb_dtype dt) { return (unsigned)dt < NB_DTYPE_COUNT ? dtype_sizes[dt] : 0; }

const char *nb_dtype_name(nb_dtype dt) {
  return (unsigned)dt < NB_DTYPE_COUNT ? dtype_names[dt] : "invalid";
}

int nb_dtype_is_float(nb_dtype dt) { return dt == NB_F64 || dt == NB_F32 || dt == NB_F16 || dt == NB_BF16; }
int nb_dtype_is_fp8(nb_dtype dt) { return dt == NB_F8E4M3 || dt == NB_F8E5M2; }

/* Rank within a category; promotion takes the higher category, then the
 * higher rank. f16 and bf16 share a rank: together they give f32. */
static int category(nb_dtype dt) {
  return dt == NB_BOOL ? 0 : nb_dtype_is_float(dt) || nb_dtype_is_fp8(dt) ? 2 : 1;
}
static int rank(nb_dtype dt) {
  switch (dt) {
  case NB_F8E4M3: case NB_F8E5M2: return -1;
  case NB_U8: case NB_F16: case NB_BF16: return 0;
  case NB_I32: case NB_F32: return 1;
  case NB_I64: case NB_F64: return 2;
  default: return 0;
  }
}

nb_dtype nb_promote(nb_dtype a, nb_dtype b) {
  if (a == b) return a;
  int ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (rank(a) != rank(b)) return rank(a) > rank(b) ? a : b;
  return nb_dtype_is_fp8(a) ? NB_F16 : NB_F32; /* e4m3 with e5m2; f16 with bf16 */
}

static uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

uint16_t nb_f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}

float nb_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t nb_f32_to_f16(float x) {
  uint32_t u = f32_bits(x);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: inf */
  if (a < 0x38800000u) { /* subnormal or zero in f16: scale by 2^24, round even */
    float f = bits_f32(a) * 16777216.0f;   /* exact: a * 2^24 */
    uint32_t m = (uint32_t)f;              /* integer part */
    float rem = f - (float)m;
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
    return (uint16_t)(sign | m);
  }
  uint32_t mant = a & 0x7fffffu;
  uint32_t exp = (a >> 23) - 112; /* rebias 127 -> 15 */
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* carries into exp ok */
  return (uint16_t)(sign | h);
}

float nb_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) { /* zero or subnormal: mant * 2^-24 */
    float f = (float)mant * 5.9604644775390625e-08f;
    return sign ? -f : f;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
  return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

/* ---- fp8 ----------------------------------------------------------------
 * One encoder for both formats (mb mantissa bits, exponent bias, the
 * largest finite code and the code an overflow gives), on the f32 bits:
 * below the smallest normal the value is scaled to units of the smallest
 * subnormal (a power-of-two scaling, exact) and rounded to an integer, ties
 * to even (the count 2^mb is the smallest normal's code); above it the
 * mantissa keeps mb bits, ties to even, a carry running into the exponent.
 * A code past the largest finite one (an infinity included) is the
 * overflow code. NaN keeps its sign: 0x7F is NaN in both formats. */
typedef struct { int mb, bias; uint32_t maxc, ovf; } f8_fmt;
static const f8_fmt f8_e4m3 = {3, 7, 0x7e, 0x7f}, f8_e5m2 = {2, 15, 0x7b, 0x7c};

static uint8_t f8_encode(float x, const f8_fmt *f) {
  uint32_t u = f32_bits(x), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
  int e = (int)(a >> 23) - 127, emin = 1 - f->bias;
  uint32_t r;
  if (e < emin) {
    float s = bits_f32(a) * ldexpf(1.0f, f->mb - emin); /* exact */
    r = (uint32_t)nearbyintf(s);                           /* ties to even */
  } else {
    int shift = 23 - f->mb;
    uint32_t m = a & 0x7fffffu, half = 1u << (shift - 1), rest = m & ((1u << shift) - 1);
    r = ((uint32_t)(e - emin + 1) << f->mb) | (m >> shift);
    if (rest > half || (rest == half && (r & 1u))) r++;
  }
  return (uint8_t)(sign | (r > f->maxc ? f->ovf : r));
}

static float f8_decode(uint8_t b, const f8_fmt *f) {
  uint32_t sign = (uint32_t)(b & 0x80u) << 24, ef = (b & 0x7fu) >> f->mb, m = b & ((1u << f->mb) - 1);
  float v;
  if ((b & 0x7fu) > f->ovf || (f->ovf == 0x7f && (b & 0x7fu) == 0x7f)) v = NAN;
  else if ((b & 0x7fu) == f->ovf) v = INFINITY; /* e5m2 only */
  else if (ef == 0) v = ldexpf((float)m, 1 - f->bias - f->mb);
  else return bits_f32(sign | ((ef + 127 - (uint32_t)f->bias) << 23) | (m << (23 - f->mb)));
  return sign ? -v : v;
}

uint8_t nb_f32_to_f8e4m3(float x) { return f8_encode(x, &f8_e4m3); }
uint8_t nb_f32_to_f8e5m2(float x) { return f8_encode(x, &f8_e5m2); }
float nb_f8e4m3_to_f32(uint8_t b) { return f8_decode(b, &f8_e4m3); }
float nb_f8e5m2_to_f32(uint8_t b) { return f8_decode(b, &f8_e5m2); }

double nb_load_f64(const void *p, nb_dtype dt) {
  switch (dt) {
  case NB_F64: return *(const double *)p;
  case NB_F32: return *(const float *)p;
  case NB_F16: return nb_f16_to_f32(*(const uint16_t *)p);
  case NB_BF16: return nb_bf16_to_f32(*(const uint16_t *)p);
  case NB_I64: return (double)*(const int64_t *)p;
  case NB_I32: return *(const int32_t *)p;
  case NB_U8: return *(const uint8_t *)p;
  case NB_BOOL: return *(const uint8_t *)p != 0;
  case NB_F8E4M3: return nb_f8e4m3_to_f32(*(const uint8_t *)p);
  case NB_F8E5M2: return nb_f8e5m2_to_f32(*(const uint8_t *)p);
  default: return NAN;
  }
}

/* Float to integer conversion truncates toward zero (as C casts do);
 * out-of-range and NaN values saturate instead of being undefined. */
static int64_t sat_i64(double v, double lo, double hi) {
  if (v != v) return 0;
  if (v <= lo) return (int64_t)lo;
  if (v >= hi) return (int64_t)hi;
  return (int64_t)v;
}

void nb_store_f64(void *p, nb_dtype dt, double v) {
  switch (dt) {
  case NB_F64: *(double *)p = v; break;
  case NB_F32: *(float *)p = (float)v; break;
  case NB_F16: *(uint16_t *)p = nb_f64_to_f16(v); break;
  case NB_BF16: *(uint16_t *)p = nb_f64_to_bf16(v); break;
  case NB_I64: *(int64_t *)p = sat_i64(v, -9223372036854775808.0, 9223372036854774784.0); break;
  case NB_I32: *(int32_t *)p = (int32_t)sat_i64(v, -2147483648.0, 2147483647.0); break;
  case NB_U8: *(uint8_t *)p = (uint8_t)sat_i64(v, 0.0, 255.0); break;
  case NB_BOOL: *(uint8_t *)p = v != 0; break;
  case NB_F8E4M3: *(uint8_t *)p = nb_f64_to_f8e4m3(v); break;
  case NB_F8E5M2: *(uint8_t *)p = nb_f64_to_f8e5m2(v); break;
  default: break;
  }
}
