/* The elementwise math, written once.
 *
 * Each row of these X-macro lists is one unary or binary op. The lists
 * expand into the nb_uop/nb_bop enums (backend.h), the profiler's names and
 * the expressions' text (profile.c), the CPU kernels (cpu_elementwise.c),
 * the CUDA kernels (cuda_elementwise.cu) and the ops layer's tables with
 * their backward rules (op_unary.c, op_binary.c). A new elementwise op is
 * one row here plus, if it needs one, a primitive in each backend.
 *
 * Forward expressions are written in x (and z, the second operand) with a
 * small fixed set of primitives, which each backend defines for its scalar
 * types (the CPU: cpu_vmath.h's double-lane f32 functions and libm for f64;
 * CUDA: the standard math functions, in float for f32/f16/bf16):
 *   E_ABS E_EXP E_LOG E_LOG1P E_EXPM1 E_SQRT E_RSQRT E_SIN E_COS E_TANH
 *   E_FLOOR E_CEIL E_ROUND (half to even) E_SIGMOID E_SILU E_SOFTPLUS
 *   E_GELU_ERF E_GELU_TANH and their derivatives E_GELU_ERF_D
 *   E_GELU_TANH_D E_SILU_D; binary E_POW E_MAX E_MIN (NaN propagates).
 * Integer expressions (int64 x, z; wrapping like two's complement) use the
 * E_I* primitives below, shared by both backends, and E_IPOW, which each
 * backend defines (the CPU: exact repeated squaring; CUDA: through double).
 * Plain operators (-x, x * z, x < 0 ? 0 : x) mean the same in C and CUDA C
 * for float and double x.
 *
 * Backward rules are nabla-ops expressions, expanded only by the ops layer:
 * unary rules see g (the output's gradient), x (the input) and y (the
 * output, saved when save_y is 1); binary rules see g, a, b and w, an
 * expression computed once for both operands' gradients. Names that are not
 * public ops (NB_EW_BACKWARD, pow_da, pick_a, ...) are the ops layer's
 * helpers. */
#ifndef NB_EW_LIST_H
#define NB_EW_LIST_H

/* X(ID, kernel name, op name, int, save_y, expression, int expression, backward, flops)
 * int: 0 float only (integer inputs are cast to f32), 1 an integer kernel
 * (integer dtypes kept), 2 the identity on integers (the op returns a copy).
 * The kernel name is the profiler's row; the op name is an identifier: the
 * public function nb_<op name>, its op-table entry nb_op_<op name> and, as
 * text, the entry's and its nodes' name. flops: floating-point operations
 * per element for the op table's cost (a transcendental function counts as
 * one). */
#define NB_UOP_LIST(X)                                                                     \
  X(NEG, "neg", neg, 1, 0, -x, E_INEG(x), nb_neg(g), 1)                                    \
  X(ABS, "abs", abs, 1, 0, E_ABS(x), E_IABS(x), nb_mul(g, nb_sign(x)), 1)                  \
  X(EXP, "exp", exp, 0, 1, E_EXP(x), 0, nb_mul(g, y), 1)                                   \
  X(LOG, "log", log, 0, 0, E_LOG(x), 0, nb_div(g, x), 1)                                   \
  X(LOG1P, "log1p", log1p, 0, 0, E_LOG1P(x), 0, nb_div(g, nb_add_scalar(x, 1.0)), 1)       \
  X(EXPM1, "expm1", expm1, 0, 1, E_EXPM1(x), 0, nb_mul(g, nb_add_scalar(y, 1.0)), 1)       \
  X(SQRT, "sqrt", sqrt, 0, 1, E_SQRT(x), 0, nb_div(nb_mul_scalar(g, 0.5), y), 1)           \
  X(RSQRT, "rsqrt", rsqrt, 0, 1, E_RSQRT(x), 0,                                            \
    nb_mul(nb_mul_scalar(g, -0.5), nb_mul(y, nb_square(y))), 2)                            \
  X(SQUARE, "square", square, 1, 0, x * x, E_IMUL(x, x), nb_mul(g, nb_mul_scalar(x, 2.0)), 1) \
  X(RECIPROCAL, "reciprocal", reciprocal, 0, 1, 1 / x, 0, nb_neg(nb_mul(g, nb_square(y))), 1) \
  X(SIN, "sin", sin, 0, 0, E_SIN(x), 0, nb_mul(g, nb_cos(x)), 1)                           \
  X(COS, "cos", cos, 0, 0, E_COS(x), 0, nb_neg(nb_mul(g, nb_sin(x))), 1)                   \
  X(TANH, "tanh", tanh, 0, 1, E_TANH(x), 0, nb_mul(g, nb_rsub_scalar(nb_square(y), 1.0)), 1) \
  X(SIGMOID, "sigmoid", sigmoid, 0, 1, E_SIGMOID(x), 0,                                    \
    nb_mul(g, nb_mul(y, nb_rsub_scalar(y, 1.0))), 3)                                       \
  X(RELU, "relu", relu, 0, 0, x < 0 ? 0 : x, 0, /* NaN passes through */                   \
    nb_mul(g, nb_cast(nb_gt(x, nb_scalar(0, x->dtype, nb_device_of(x))), x->dtype)), 1)    \
  X(GELU_ERF, "gelu_erf", gelu, 0, 0, E_GELU_ERF(x), 0,                                    \
    NB_EW_BACKWARD(GELU_ERF_BW, g, x), 5)                                         \
  X(GELU_TANH, "gelu_tanh", gelu_tanh, 0, 0, E_GELU_TANH(x), 0,                            \
    NB_EW_BACKWARD(GELU_TANH_BW, g, x), 9)                                        \
  X(SILU, "silu", silu, 0, 0, E_SILU(x), 0, NB_EW_BACKWARD(SILU_BW, g, x), 4)             \
  X(SOFTPLUS, "softplus", softplus, 0, 0, E_SOFTPLUS(x), 0, nb_mul(g, nb_sigmoid(x)), 5)   \
  X(SIGN, "sign", sign, 1, 0, x > 0 ? 1 : x < 0 ? -1 : x, /* 0 and NaN kept */             \
    (x > 0) - (x < 0), nb_zeros_like(x), 1)                                                \
  X(FLOOR, "floor", floor, 2, 0, E_FLOOR(x), 0, nb_zeros_like(x), 1)                       \
  X(CEIL, "ceil", ceil, 2, 0, E_CEIL(x), 0, nb_zeros_like(x), 1)                           \
  X(ROUND, "round", round, 2, 0, E_ROUND(x), 0, nb_zeros_like(x), 1)

/* The derivatives alone, as unary kernels: the primitives' accuracy is
 * checked through them (test_vmath, test_cpu_kernels) and the code
 * generator has their text; no op runs them (the backward rules run the
 * fused rows of NB_BOP_DERIVATIVE_LIST below).
 * D(ID, kernel name, name, expression) */
#define NB_UOP_DERIVATIVE_LIST(D)                                                          \
  D(GELU_ERF_D, "gelu_erf_d", gelu_derivative, E_GELU_ERF_D(x))                            \
  D(GELU_TANH_D, "gelu_tanh_d", gelu_tanh_derivative, E_GELU_TANH_D(x))                    \
  D(SILU_D, "silu_d", silu_derivative, E_SILU_D(x))

/* The backward rules of the unary rows whose derivative is a primitive
 * (NB_EW_BACKWARD above): one binary kernel g * f'(x), x the input and z
 * the output's gradient g, computed in the compute type (f32 for f32, f16,
 * bf16; f64 for f64) and rounded once when stored, where a derivative
 * kernel and a mul were two passes over memory and two roundings to a
 * 16-bit dtype. Their op-table entries (op_unary.c, op name X_backward,
 * inputs g and x) have no gradient of their own. The columns are the
 * binary list's first ones, so its expansions take these rows too:
 * D(ID, kernel name, op name, int (0: float only), expression, flops) */
#define NB_BOP_DERIVATIVE_LIST(D)                                                          \
  D(GELU_ERF_BW, "gelu_erf_bw", gelu_backward, 0, z * E_GELU_ERF_D(x), 9)                   \
  D(GELU_TANH_BW, "gelu_tanh_bw", gelu_tanh_backward, 0, z * E_GELU_TANH_D(x), 15)          \
  D(SILU_BW, "silu_bw", silu_backward, 0, z * E_SILU_D(x), 8)

/* X(ID, kernel name, op name, int, expression, int expression, w, da, db, flops)
 * int: 1 an integer kernel, 0 float only (integer operands are divided in
 * f32). da and db are the gradients before nb_op_grad_to sums them to each
 * operand's shape. The op name and flops as in NB_UOP_LIST. */
#define NB_BOP_LIST(X)                                                                     \
  X(ADD, "add", add, 1, x + z, E_IADD(x, z), g, w, w, 1)                                   \
  X(SUB, "sub", sub, 1, x - z, E_ISUB(x, z), g, w, nb_neg(w), 1)                           \
  X(MUL, "mul", mul, 1, x * z, E_IMUL(x, z), g, nb_mul(w, b), nb_mul(w, a), 1)             \
  X(DIV, "div", div, 0, x / z, 0, nb_div(g, b), w, nb_neg(nb_mul(w, nb_div(a, b))), 1)     \
  X(POW, "pow", pow, 1, E_POW(x, z), E_IPOW(x, z), g, pow_da(g, a, b), pow_db(g, a, b), 3) \
  X(MAX, "max", maximum, 1, E_MAX(x, z), x > z ? x : z, pick_a(g, a, b, nb_gt),            \
    nb_mul(g, w), nb_mul(g, nb_rsub_scalar(w, 1.0)), 1)                                    \
  X(MIN, "min", minimum, 1, E_MIN(x, z), x < z ? x : z, pick_a(g, a, b, nb_lt),            \
    nb_mul(g, w), nb_mul(g, nb_rsub_scalar(w, 1.0)), 1)

/* Comparisons: bool results, no gradient; IEEE rules for floats (NaN
 * compares unequal). C(ID, name, expression): the name is an identifier,
 * the kernel's (as text) and the op's (as in NB_UOP_LIST). */
#define NB_CMP_LIST(C)                                                                     \
  C(EQ, eq, x == z)                                                                        \
  C(NE, ne, x != z)                                                                        \
  C(LT, lt, x < z)                                                                         \
  C(LE, le, x <= z)                                                                        \
  C(GT, gt, x > z)                                                                         \
  C(GE, ge, x >= z)

/* Integer primitives shared by both backends (int64 in, int64 out). */
#define E_INEG(x) ((int64_t)(0 - (uint64_t)(x)))
#define E_IABS(x) ((x) < 0 ? E_INEG(x) : (x))
#define E_IADD(x, z) ((int64_t)((uint64_t)(x) + (uint64_t)(z)))
#define E_ISUB(x, z) ((int64_t)((uint64_t)(x) - (uint64_t)(z)))
#define E_IMUL(x, z) ((int64_t)((uint64_t)(x) * (uint64_t)(z)))

#endif /* NB_EW_LIST_H */
