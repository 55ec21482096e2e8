/* test_cuda sections "unary", "binary", "copy/cast", "cast ties". */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "cuda_test.h"

/* ---- elementwise ---------------------------------------------------------- */
typedef nb_tensor *(*un_fn)(const nb_tensor *);
static const struct { const char *name; un_fn f; int positive; } UNARY[] = {
  {"neg", nb_neg, 0}, {"abs", nb_abs, 0}, {"exp", nb_exp, 0}, {"log", nb_log, 1},
  {"log1p", nb_log1p, 1}, {"expm1", nb_expm1, 0}, {"sqrt", nb_sqrt, 1}, {"rsqrt", nb_rsqrt, 1},
  {"square", nb_square, 0}, {"reciprocal", nb_reciprocal, 1}, {"sin", nb_sin, 0},
  {"cos", nb_cos, 0}, {"tanh", nb_tanh, 0}, {"sigmoid", nb_sigmoid, 0}, {"relu", nb_relu, 0},
  {"gelu", nb_gelu, 0}, {"gelu_tanh", nb_gelu_tanh, 0}, {"silu", nb_silu, 0},
  {"softplus", nb_softplus, 0}, {"sign", nb_sign, 0}, {"floor", nb_floor, 0},
  {"ceil", nb_ceil, 0}, {"round", nb_round, 0},
};

void test_unary(void) {
  int64_t R = quick ? 7 : 37, C = quick ? 9 : 53;
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++)
    for (int k = 0; k < 3; k++)
      for (size_t u = 0; u < sizeof UNARY / sizeof *UNARY; u++) {
        nb_scope_begin();
        nb_tensor *x = layout(10 + u, R, C, FLOATS[d], k);
        if (UNARY[u].positive) x = nb_add_scalar(nb_abs(x), 0.5);
        else x = nb_mul_scalar(x, 2.0);
        char name[64];
        snprintf(name, sizeof name, "%s (%s)", UNARY[u].name, LAYOUT[k]);
        /* floor/ceil/round/sign are exact functions: the inputs match, so must they */
        cmp(name, FLOATS[d], UNARY[u].f(x), UNARY[u].f(gpu(x)), 1.0);
        nb_scope_end();
      }
  nb_scope_begin();
  nb_tensor *xi = nbt_randn(3, 2, (int64_t[]){5, 7}, NB_I64);
  cmp("neg i64", NB_I64, nb_neg(xi), nb_neg(gpu(xi)), 1.0);
  cmp("abs i32", NB_I32, nb_abs(nb_cast(xi, NB_I32)), nb_abs(gpu(nb_cast(xi, NB_I32))), 1.0);
  nb_scope_end();
}

typedef nb_tensor *(*bin_fn)(const nb_tensor *, const nb_tensor *);
static const struct { const char *name; bin_fn f; int positive_a; } BINARY[] = {
  {"add", nb_add, 0}, {"sub", nb_sub, 0}, {"mul", nb_mul, 0}, {"div", nb_div, 0},
  {"pow", nb_pow, 1}, {"maximum", nb_maximum, 0}, {"minimum", nb_minimum, 0},
  {"eq", nb_eq, 0}, {"ne", nb_ne, 0}, {"lt", nb_lt, 0}, {"le", nb_le, 0},
  {"gt", nb_gt, 0}, {"ge", nb_ge, 0},
};

static void test_binary_broadcast(void);

void test_binary(void) {
  int64_t R = quick ? 5 : 33, C = quick ? 11 : 71;
  for (size_t d = 0; d < sizeof FLOATS / sizeof *FLOATS; d++)
    for (int k = 0; k < 4; k++)
      for (size_t o = 0; o < sizeof BINARY / sizeof *BINARY; o++) {
        nb_scope_begin();
        nb_dtype dt = FLOATS[d];
        nb_tensor *a = layout(100 + o, R, C, dt, k % 3), *b;
        if (k == 3) b = randn(200 + o, 1, (int64_t[]){C}, dt);          /* row broadcast */
        else if (k == 2) b = randn(200 + o, 2, (int64_t[]){R, 1}, dt);  /* column broadcast */
        else b = layout(300 + o, R, C, dt, (k + 1) % 3);
        if (BINARY[o].positive_a) a = nb_add_scalar(nb_abs(a), 0.25);
        if (!strcmp(BINARY[o].name, "eq")) b = nb_where(nb_gt(b, nb_scalar(0, dt, NB_DEVICE_CPU)), b, nb_broadcast_to(a, 2, (int64_t[]){R, C}));
        char name[64];
        snprintf(name, sizeof name, "%s (case %d)", BINARY[o].name, k);
        cmp(name, dt, BINARY[o].f(a, b), BINARY[o].f(gpu(a), gpu(b)), 1.0);
        nb_scope_end();
      }
  nb_scope_begin();
  nb_tensor *ai = nbt_randn(5, 2, (int64_t[]){9, 13}, NB_I64), *bi = nbt_randn(6, 1, (int64_t[]){13}, NB_I64);
  cmp("add i64", NB_I64, nb_add(ai, bi), nb_add(gpu(ai), gpu(bi)), 1.0);
  cmp("mul i32", NB_I32, nb_mul(nb_cast(ai, NB_I32), nb_cast(bi, NB_I32)),
      nb_mul(gpu(nb_cast(ai, NB_I32)), gpu(nb_cast(bi, NB_I32))), 1.0);
  cmp("maximum i64", NB_I64, nb_maximum(ai, bi), nb_maximum(gpu(ai), gpu(bi)), 1.0);
  cmp("div i64 -> f32", NB_F32, nb_div(ai, nb_add_scalar(nb_abs(bi), 1)),
      nb_div(gpu(ai), gpu(nb_add_scalar(nb_abs(bi), 1))), 1.0);
  nb_tensor *x = randn(7, 2, (int64_t[]){17, 23}, NB_F32);
  nb_tensor *c = nb_gt(randn(8, 2, (int64_t[]){17, 1}, NB_F32), nb_scalar(0, NB_F32, NB_DEVICE_CPU));
  nb_tensor *y = randn(9, 1, (int64_t[]){23}, NB_F32);
  cmp("where", NB_F32, nb_where(c, x, y), nb_where(gpu(c), gpu(x), gpu(y)), 1.0);
  cmp("clamp", NB_F32, nb_clamp(x, -0.5, 0.7), nb_clamp(gpu(x), -0.5, 0.7), 1.0);
  nb_scope_end();
  test_binary_broadcast();
}

/* ---- row and column broadcasts ---------------------------------------------
 * out (m, n) = a (m, n) op r and r op a, r a row (n) or a column (m, 1): the
 * broadcast vector kernel when n is a multiple of the 16-byte pack width w
 * and the operands are 16-byte aligned (a row r too), the strided kernel
 * otherwise (n not a multiple of w, a view one element off, comparisons),
 * the contiguous kernel for m = 1. Views are built the same way on both
 * devices, so an offset view stays misaligned on the GPU. */
typedef struct { nb_tensor *c, *g; } bc_pair;

/* shape's elements from a flat tensor's element shift on; kind 0 normal
 * values, 1 positive (pow's base), 2 small integers (comparisons meet equal
 * values); stride > 1 takes column 0 of an (m, stride) tensor as (m, 1). */
static bc_pair bc_operand(uint64_t seed, int nd, const int64_t *shape, nb_dtype dt, int64_t shift,
                          int kind, int64_t stride) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  int64_t len = (stride > 1 ? n * stride : n) + shift;
  nb_tensor *f = nbt_randn(seed, 1, (int64_t[]){len}, NB_F64);
  if (kind == 1) f = nb_add_scalar(nb_abs(f), 0.25);
  if (kind == 2) f = nb_round(nb_mul_scalar(f, 2.0));
  f = nb_cast(f, dt);
  bc_pair p = {f, gpu(f)};
  nb_tensor **v[2] = {&p.c, &p.g};
  for (int k = 0; k < 2; k++) {
    nb_tensor *t = nb_slice(*v[k], 0, shift, len, 1);
    if (stride > 1) t = nb_slice(nb_view(t, 2, (int64_t[]){n, stride}), 1, 0, 1, 1);
    else t = nb_view(t, nd, shape);
    *v[k] = t;
  }
  return p;
}

/* kind: 0 row (n), 1 column (m, 1), 2 (3, m, n) op (n), 3 (3, m, n) op (m, n) */
typedef struct { int64_t m, n; int kind, shift_a, shift_r, stride_r; const char *what; } bc_case;

static void bc_run(nb_dtype dt, const bc_case *c, uint64_t seed) {
  int64_t full[3], rs[3];
  int nf = c->kind >= 2 ? 3 : 2, nr;
  if (nf == 3) full[0] = 3, full[1] = c->m, full[2] = c->n;
  else full[0] = c->m, full[1] = c->n;
  if (c->kind == 1) nr = 2, rs[0] = c->m, rs[1] = 1;
  else if (c->kind == 3) nr = 2, rs[0] = c->m, rs[1] = c->n;
  else nr = 1, rs[0] = c->n;
  for (size_t o = 0; o < sizeof BINARY / sizeof *BINARY; o++)
    for (int swap = 0; swap < 2; swap++) {
      nb_scope_begin();
      int cmpop = o >= 7, pw = !strcmp(BINARY[o].name, "pow");
      int ka = cmpop ? 2 : pw && !swap ? 1 : 0, kr = cmpop ? 2 : pw && swap ? 1 : 0;
      bc_pair a = bc_operand(seed + o, nf, full, dt, c->shift_a, ka, 1);
      bc_pair r = bc_operand(seed + 50 + o, nr, rs, dt, c->shift_r, kr, c->stride_r);
      nb_tensor *x = swap ? r.c : a.c, *z = swap ? a.c : r.c;
      nb_tensor *xg = swap ? r.g : a.g, *zg = swap ? a.g : r.g;
      char name[128];
      snprintf(name, sizeof name, "%s %s (%lldx%lld, %s)", BINARY[o].name,
               swap ? "r op a" : "a op r", (long long)c->m, (long long)c->n, c->what);
      cmp(name, dt, BINARY[o].f(x, z), BINARY[o].f(xg, zg), 1.0);
      nb_scope_end();
    }
}

static void test_binary_broadcast(void) {
  const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  int64_t big = quick ? 9 : 67;
  for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
    int64_t w = 16 / (int64_t)nb_dtype_size(dts[d]);
    const bc_case cases[] = {
      {big, 24 * w, 0, 0, 0, 1, "row, several blocks"},
      {33, w, 0, 0, 0, 1, "row of one pack"},
      {9, 3 * w + 1, 0, 0, 0, 1, "row, n not a multiple of the pack"},
      {1, 8 * w, 0, 0, 0, 1, "one row"},
      {17, 4 * w, 0, 1, 0, 1, "row, a misaligned"},
      {17, 4 * w, 0, 0, 1, 1, "row, r misaligned"},
      {big, 8 * w, 1, 0, 0, 1, "column"},
      {13, 2 * w + 1, 1, 0, 0, 1, "column, n not a multiple of the pack"},
      {17, 4 * w, 1, 0, 1, 1, "column, r misaligned"},
      {19, 2 * w, 1, 0, 0, 3, "column of stride 3"},
      {17, 4 * w, 1, 1, 0, 1, "column, a misaligned"},
      {7, 4 * w, 2, 0, 0, 1, "(3, m, n) op (n)"},
      {7, 4 * w, 3, 0, 0, 1, "(3, m, n) op (m, n)"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) bc_run(dts[d], &cases[k], 400 + 20 * k);
  }
}

void test_copy_cast(void) {
  nb_scope_begin();
  const nb_dtype all[] = {NB_F64, NB_F32, NB_F16, NB_BF16, NB_I64, NB_I32, NB_U8, NB_BOOL};
  nb_tensor *base = nb_mul_scalar(randn(11, 2, (int64_t[]){13, 29}, NB_F64), 40.0);
  for (int k = 0; k < 2; k++) {
    nb_tensor *src = k ? nb_transpose(base, 0, 1) : base;
    for (int i = 0; i < 8; i++)
      for (int j = 0; j < 8; j++) {
        nb_tensor *s = nb_cast(src, all[i]);
        char name[64];
        snprintf(name, sizeof name, "cast %s->%s%s", nb_dtype_name(all[i]), nb_dtype_name(all[j]),
                 k ? " (transposed)" : "");
        nb_tensor *a = nb_cast(s, all[j]), *b = nb_cast(gpu(s), all[j]);
        cmp_bits(name, nb_contiguous(a), nb_contiguous(b));
      }
  }
  /* copy into a strided view of a GPU tensor, broadcasting the source */
  nb_tensor *dst_c = nb_zeros(2, (int64_t[]){6, 10}, NB_F32, NB_DEVICE_CPU);
  nb_tensor *dst_g = gpu(dst_c);
  nb_tensor *row = randn(12, 1, (int64_t[]){5}, NB_F32);
  nb_copy_(nb_slice(dst_c, 1, 0, 10, 2), row);
  nb_copy_(nb_slice(dst_g, 1, 0, 10, 2), gpu(row));
  cmp_bits("copy_ into slice (broadcast)", dst_c, dst_g);
  nb_fill_(nb_slice(dst_c, 0, 1, 6, 3), 2.5);
  nb_fill_(nb_slice(dst_g, 0, 1, 6, 3), 2.5);
  cmp_bits("fill_ slice", dst_c, dst_g);
  cmp("arange f32", NB_F32, nb_arange(-3, 7, 0.37, NB_F32, NB_DEVICE_CPU), nb_arange(-3, 7, 0.37, NB_F32, G), 1.0);
  cmp_bits("arange i64", nb_arange(5, 100, 3, NB_I64, NB_DEVICE_CPU), nb_arange(5, 100, 3, NB_I64, G));
  cmp_bits("full bf16", nb_full(1, (int64_t[]){33}, 1.2345, NB_BF16, NB_DEVICE_CPU),
           nb_full(1, (int64_t[]){33}, 1.2345, NB_BF16, G));
  nb_tensor *parts_c[2] = {randn(13, 2, (int64_t[]){3, 5}, NB_F32), randn(14, 2, (int64_t[]){3, 7}, NB_F32)};
  nb_tensor *parts_g[2] = {gpu(parts_c[0]), gpu(parts_c[1])};
  cmp_bits("cat", nb_cat(2, parts_c, 1), nb_cat(2, parts_g, 1));
  nb_tensor *z = nb_zeros(2, (int64_t[]){0, 5}, NB_F32, G);
  NBT_CHECK(z && nb_numel(nb_sum(z, 0, NULL, 0)) == 1 && nb_item(nb_sum(z, 0, NULL, 0)) == 0,
            "sum of an empty CUDA tensor is 0 (%s)", nb_last_error());
  nb_scope_end();
}

/* ---- f64 -> f16/bf16 rounds once ------------------------------------------
 * Doubles at and just off the ties (midpoints) of the 16-bit type, cast and
 * copied on the GPU, give the CPU's bits (core/half.h rounds once). Through
 * f32 with two nearest roundings, as CUDA converted before, tie * (1 +- 2^-k),
 * k >= 25, is closer to the tie than f32 resolves: it lands on the tie, which
 * then goes to the even neighbour. That is wrong for tie+ when the even one
 * is below (1 + 2^-11 + 2^-40 gave f16 1.0, not 1 + 2^-10) and for tie- when
 * it is above (65520 - tiny gave inf, not 65504; 3 * 2^-25 - tiny gave
 * 2^-23, not 2^-24): a third of these values. (Fast math also flushed the
 * f32 step below 2^-126, so bf16's smallest ties all gave 0.) */
enum { TIE_N = 1515 }; /* 505 ties; viewed as (15, 101) */

static uint64_t tie_rand(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double tie_val(nb_dtype dt, unsigned h) {
  return dt == NB_F16 ? nb_f16_to_f32((uint16_t)h) : nb_bf16_to_f32((uint16_t)h);
}

/* 3 values per tie (exact, above, below) for n / 3 ties between a and a + 1:
 * first 0, 1, 1.0, its successor and the largest finite (whose tie is the
 * overflow threshold), then random a of either sign. */
static void tie_values(nb_dtype dt, double *v, int64_t n) {
  unsigned inf = dt == NB_F16 ? 0x7c00u : 0x7f80u, one = dt == NB_F16 ? 0x3c00u : 0x3f80u;
  unsigned fixed[] = {0, 1, one, one + 1, inf - 1};
  uint64_t s = 42;
  for (int64_t i = 0; i + 3 <= n; i += 3) {
    int rnd = i / 3 >= 5;
    unsigned a = rnd ? (unsigned)(tie_rand(&s) % inf) : fixed[i / 3];
    double lo = tie_val(dt, a), hi = a + 1 == inf ? 2 * lo - tie_val(dt, a - 1) : tie_val(dt, a + 1);
    double t = (lo + hi) / 2, e = ldexp(1.0, rnd ? -25 - (int)(tie_rand(&s) % 28) : -30);
    if (rnd && (tie_rand(&s) & 1)) t = -t;
    v[i] = t;
    v[i + 1] = t * (1 + e);
    v[i + 2] = t * (1 - e);
  }
}

/* The four GPU paths: cast of a contiguous and of a transposed f64 source
 * (the contiguous and the strided convert kernels), copy_ into a contiguous
 * and into a strided destination. */
static nb_tensor *tie_path(int path, const double *v, nb_dtype dt, nb_device dev) {
  nb_tensor *c = nb_from_buffer(v, 1, (int64_t[]){TIE_N}, NB_F64, dev);
  nb_tensor *t = nb_transpose(nb_view(c, 2, (int64_t[]){15, 101}), 0, 1); /* (101, 15) */
  if (path == 0) return nb_cast(c, dt);
  if (path == 1) return nb_cast(t, dt);
  nb_tensor *d = nb_zeros(2, (int64_t[]){101, path == 2 ? 15 : 31}, dt, dev);
  nb_tensor *dv = path == 2 ? d : nb_slice(d, 1, 1, 31, 2);
  return nb_copy_(dv, path == 2 ? nb_view(c, 2, (int64_t[]){101, 15}) : t) == NB_OK ? d : NULL;
}

void test_cast_ties(void) {
  nb_scope_begin();
  static const char *const what[] = {"cast", "cast (transposed source)", "copy_",
                                     "copy_ (strided source and destination)"};
  double v[TIE_N];
  for (int d = 0; d < 2; d++) {
    nb_dtype dt = d ? NB_BF16 : NB_F16;
    tie_values(dt, v, TIE_N);
    for (int p = 0; p < 4; p++) {
      char name[96];
      snprintf(name, sizeof name, "f64 ties -> %s %s", nb_dtype_name(dt), what[p]);
      cmp_bits(name, tie_path(p, v, dt, NB_DEVICE_CPU), tie_path(p, v, dt, G));
    }
    /* the values catch a conversion through f32 (the old CUDA path): one of
     * each tie's two neighbours */
    uint16_t got[TIE_N];
    int twice = 0;
    NBT_CHECK(nb_to_host(tie_path(0, v, dt, NB_DEVICE_CPU), got, sizeof got) == NB_OK, "%s", nb_last_error());
    for (int i = 0; i < TIE_N; i++)
      twice += got[i] != (dt == NB_F16 ? nb_f32_to_f16((float)v[i]) : nb_f32_to_bf16((float)v[i]));
    NBT_CHECK(twice == TIE_N / 3, "f64 ties -> %s: %d values round differently through f32, not one a tie",
              nb_dtype_name(dt), twice);
  }
  nb_scope_end();
}
