/* The elementwise list (backend/ew_list.h) and what it expands into: the
 * enums keep their values, the profiler's names and the expressions' text
 * are the list's, and the CPU kernels' integer paths (generated from the
 * list's integer column) wrap, reject float-only ops and report negative
 * integer powers. */
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "testutil.h"

#define CHECK(name, ok) NBT_CHECK(ok, "%s", name)

static void check_str(const char *what, const char *got, const char *want) {
  NBT_CHECK(strcmp(got, want) == 0, "%s: \"%s\" (expected \"%s\")", what, got, want);
}

static void test_tables(void) {
  /* the values the enums had before the list: kernels' callers and saved
   * profiles depend on them */
  CHECK("uop count", NB_UOP_COUNT == 26);
  CHECK("bop count", NB_BOP_COUNT == 16);
  CHECK("uop order", NB_UOP_NEG == 0 && NB_UOP_SQUARE == 8 && NB_UOP_RELU == 14 &&
                             NB_UOP_ROUND == 22 && NB_UOP_GELU_ERF_D == 23 && NB_UOP_SILU_D == 25);
  CHECK("bop order", NB_BOP_ADD == 0 && NB_BOP_MIN == 6 && NB_BOP_GELU_ERF_BW == 7 &&
                             NB_BOP_SILU_BW == 9 && NB_BOP_EQ == 10 && NB_BOP_GE == 15);
  check_str("bop name gelu_tanh_bw", nb_bop_names[NB_BOP_GELU_TANH_BW], "gelu_tanh_bw");
  check_str("bop text gelu_tanh_bw", nb_bop_expr_text[NB_BOP_GELU_TANH_BW], "z * E_GELU_TANH_D(x)");
  check_str("uop name gelu_erf", nb_uop_names[NB_UOP_GELU_ERF], "gelu_erf");
  check_str("uop name silu_d", nb_uop_names[NB_UOP_SILU_D], "silu_d");
  check_str("bop name max", nb_bop_names[NB_BOP_MAX], "max");
  check_str("bop name ge", nb_bop_names[NB_BOP_GE], "ge");
  check_str("uop text exp", nb_uop_expr_text[NB_UOP_EXP], "E_EXP(x)");
  check_str("uop text square", nb_uop_expr_text[NB_UOP_SQUARE], "x * x");
  check_str("uop text gelu_tanh_d", nb_uop_expr_text[NB_UOP_GELU_TANH_D], "E_GELU_TANH_D(x)");
  check_str("bop text add", nb_bop_expr_text[NB_BOP_ADD], "x + z");
  check_str("bop text pow", nb_bop_expr_text[NB_BOP_POW], "E_POW(x, z)");
  check_str("bop text lt", nb_bop_expr_text[NB_BOP_LT], "x < z");
  for (int op = 0; op < NB_UOP_COUNT; op++)
    CHECK("every uop named", nb_uop_names[op] && nb_uop_expr_text[op] && nb_uop_names[op][0]);
  for (int op = 0; op < NB_BOP_COUNT; op++)
    CHECK("every bop named", nb_bop_names[op] && nb_bop_expr_text[op] && nb_bop_names[op][0]);
}

static nb_kview view_i64(int64_t *p, int64_t n) {
  nb_kview v = {p, NB_I64, 1, {n}, {1}};
  return v;
}

static void test_cpu_integers(void) {
  int64_t x[4] = {INT64_MIN, -5, 0, 3037000500}, y[4], z[4];
  nb_kview vx = view_i64(x, 4), vy = view_i64(y, 4), vz = view_i64(z, 4);
  CHECK("neg i64 runs", nb_cpu_unary(NB_UOP_NEG, &vy, &vx) == NB_OK);
  CHECK("neg wraps", y[0] == INT64_MIN && y[1] == 5 && y[2] == 0 && y[3] == -3037000500);
  nb_cpu_unary(NB_UOP_ABS, &vy, &vx);
  CHECK("abs wraps", y[0] == INT64_MIN && y[1] == 5 && y[3] == 3037000500);
  nb_cpu_unary(NB_UOP_SIGN, &vy, &vx);
  CHECK("sign", y[0] == -1 && y[1] == -1 && y[2] == 0 && y[3] == 1);
  nb_cpu_unary(NB_UOP_SQUARE, &vy, &vx);
  CHECK("square wraps", y[0] == 0 && y[1] == 25 &&
                                y[3] == (int64_t)((uint64_t)3037000500 * 3037000500u));
  nb_status st = nb_cpu_unary(NB_UOP_EXP, &vy, &vx);
  nbt_check_error("exp on i64 rejected", st != NB_OK, st, "cpu unary: op exp on dtype i64", NULL);
  st = nb_cpu_unary(NB_UOP_FLOOR, &vy, &vx); /* the op copies integers */
  nbt_check_error("floor on i64 rejected", st != NB_OK, st, "expected a float dtype", NULL);

  int64_t b[4] = {1, 2, 0, 2};
  nb_kview vb = view_i64(b, 4);
  nb_cpu_binary(NB_BOP_ADD, &vz, &vx, &vb);
  CHECK("add wraps", z[0] == INT64_MIN + 1 && z[1] == -3 && z[3] == 3037000502);
  nb_cpu_binary(NB_BOP_SUB, &vz, &vx, &vb);
  CHECK("sub wraps", z[0] == INT64_MAX && z[1] == -7);
  nb_cpu_binary(NB_BOP_MUL, &vz, &vx, &vb);
  CHECK("mul wraps", z[0] == INT64_MIN && z[1] == -10 && z[3] == 6074001000);
  nb_cpu_binary(NB_BOP_MAX, &vz, &vx, &vb);
  CHECK("max", z[0] == 1 && z[1] == 2 && z[2] == 0 && z[3] == 3037000500);
  nb_cpu_binary(NB_BOP_MIN, &vz, &vx, &vb);
  CHECK("min", z[0] == INT64_MIN && z[1] == -5 && z[3] == 2);
  CHECK("pow runs", nb_cpu_binary(NB_BOP_POW, &vz, &vx, &vb) == NB_OK);
  CHECK("pow", z[0] == INT64_MIN && z[1] == 25 && z[2] == 1 &&
                       z[3] == (int64_t)((uint64_t)3037000500 * 3037000500u));
  b[2] = -1;
  st = nb_cpu_binary(NB_BOP_POW, &vz, &vx, &vb);
  nbt_check_error("pow to a negative power", st != NB_OK, st, "negative integer powers", NULL);
  st = nb_cpu_binary(NB_BOP_DIV, &vz, &vx, &vb);
  nbt_check_error("div on i64 rejected", st != NB_OK, st, "div on dtype i64", NULL);

  uint8_t c[4];
  nb_kview vc = {c, NB_BOOL, 1, {4}, {1}};
  nb_cpu_binary(NB_BOP_LE, &vc, &vx, &vb);
  CHECK("le", c[0] == 1 && c[1] == 1 && c[2] == 0 && c[3] == 0);
}

int main(void) {
  test_tables();
  test_cpu_integers();
  return nbt_finish();
}
