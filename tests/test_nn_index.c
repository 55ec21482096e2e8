/* Neural-network ops, part 2: index_select, gather, scatter_add, embedding
 * and one_hot. Forward against naive float64 references (f64, f32, bf16),
 * gradients against finite differences (repeated indices included), and
 * the error classes (out-of-range and negative indices, dtypes, shapes). */
#include "nn_testutil.h"

/* Row-major strides of a small shape. */
static void strides_of(int nd, const int64_t *shape, int64_t *st) {
  int64_t s = 1;
  for (int i = nd - 1; i >= 0; i--) { st[i] = s; s *= shape[i]; }
}

/* ---- index_select / embedding --------------------------------------------------- */
typedef struct { int64_t shape[3]; int axis; const int64_t *idx; int64_t n; int i32; } is_ctx;

static void is_ref(double *const *in, double *out, void *vc) {
  const is_ctx *c = vc;
  int a = c->axis < 0 ? c->axis + 3 : c->axis;
  int64_t oshape[3], xs[3], os[3], k = 0;
  memcpy(oshape, c->shape, sizeof oshape);
  oshape[a] = c->n;
  strides_of(3, c->shape, xs);
  strides_of(3, oshape, os);
  for (int64_t i = 0; i < oshape[0]; i++)
    for (int64_t j = 0; j < oshape[1]; j++)
      for (int64_t l = 0; l < oshape[2]; l++) {
        int64_t ix[3] = {i, j, l};
        ix[a] = c->idx[ix[a]];
        out[k++] = in[0][ix[0] * xs[0] + ix[1] * xs[1] + ix[2] * xs[2]];
      }
}

static nb_tensor *is_apply(nb_tensor *const *in, void *vc) {
  const is_ctx *c = vc;
  nb_tensor *idx = nnt_i64(c->idx, 1, &c->n);
  if (c->i32) idx = nb_cast(idx, NB_I32);
  return nb_index_select(in[0], c->axis, idx);
}

static void test_index_select(void) {
  static const int64_t i1[] = {4, 0, 4, 2}, i2[] = {1, 1, 0}, i3[] = {2};
  is_ctx cases[] = {{{4, 5, 3}, 1, i1, 4, 0}, {{4, 5, 3}, -1, i2, 3, 1}, {{4, 5, 3}, 0, i3, 1, 0},
                    {{3, 1, 2}, 0, i2, 3, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    nb_tensor *x = nbt_leaf(200 + i, 3, cases[i].shape);
    char name[64];
    snprintf(name, sizeof name, "index_select axis %d case %zu", cases[i].axis, i);
    nnt_check_forward(name, is_apply, is_ref, &cases[i], 1, &x);
    nbt_gradcheck(name, is_apply, &cases[i], 1, &x, 1e-6, 1e-6, 1e-9);
    nb_release(x);
  }
}

typedef struct { const int64_t *idx; int64_t ishape[2]; int ind; int64_t V, D; } emb_ctx;

static void emb_ref(double *const *in, double *out, void *vc) {
  const emb_ctx *c = vc;
  int64_t n = 1;
  for (int i = 0; i < c->ind; i++) n *= c->ishape[i];
  for (int64_t r = 0; r < n; r++)
    for (int64_t d = 0; d < c->D; d++) out[r * c->D + d] = in[0][c->idx[r] * c->D + d];
}

static nb_tensor *emb_apply(nb_tensor *const *in, void *vc) {
  const emb_ctx *c = vc;
  return nb_embedding(in[0], nnt_i64(c->idx, c->ind, c->ishape));
}

static void test_embedding(void) {
  static const int64_t idx[] = {3, 0, 3, 5, 3, 1};
  emb_ctx cases[] = {{idx, {2, 3}, 2, 6, 4}, {idx, {6}, 1, 6, 3}, {idx + 3, {0}, 0, 6, 2}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    nb_tensor *w = nbt_leaf(220 + i, 2, (int64_t[]){cases[i].V, cases[i].D});
    char name[64];
    snprintf(name, sizeof name, "embedding case %zu", i);
    nnt_check_forward(name, emb_apply, emb_ref, &cases[i], 1, &w);
    nbt_gradcheck(name, emb_apply, &cases[i], 1, &w, 1e-6, 1e-6, 1e-9);
    nb_release(w);
  }
  /* the output shape is indices.shape + (D); the gradient is the same with
   * the non-deterministic switch */
  nb_scope_begin();
  nb_tensor *w = nbt_leaf(230, 2, (int64_t[]){6, 4});
  nb_tensor *y = nb_embedding(w, nnt_i64(idx, 2, (int64_t[]){2, 3}));
  NBT_CHECK(y && nb_ndim(y) == 3 && nb_shape(y)[0] == 2 && nb_shape(y)[1] == 3 && nb_shape(y)[2] == 4,
            "embedding shape");
  nb_backward(nb_sum(y, 0, NULL, 0), NULL);
  double *g1 = nbt_f64(nb_grad(w));
  nb_zero_grad(w);
  nb_set_deterministic(0);
  nb_backward(nb_sum(nb_embedding(w, nnt_i64(idx, 2, (int64_t[]){2, 3})), 0, NULL, 0), NULL);
  nb_set_deterministic(1);
  nbt_check_close("embedding gradient, non-deterministic switch", nb_grad(w), g1, 0, 0);
  NBT_CHECK(g1[3 * 4] == 3 && g1[0] == 1 && g1[2 * 4] == 0, "embedding gradient counts repeats");
  free(g1);
  nb_release(w);
  nb_scope_end();
}

/* ---- gather / scatter_add ---------------------------------------------------------- */
typedef struct { int64_t xs[3], is[3]; int axis; const int64_t *idx; } ga_ctx;

static void ga_ref(double *const *in, double *out, void *vc) {
  const ga_ctx *c = vc;
  int a = c->axis < 0 ? c->axis + 3 : c->axis;
  int64_t xs[3], k = 0;
  strides_of(3, c->xs, xs);
  for (int64_t i = 0; i < c->is[0]; i++)
    for (int64_t j = 0; j < c->is[1]; j++)
      for (int64_t l = 0; l < c->is[2]; l++, k++) {
        int64_t ix[3] = {i, j, l};
        ix[a] = c->idx[k];
        out[k] = in[0][ix[0] * xs[0] + ix[1] * xs[1] + ix[2] * xs[2]];
      }
}

static nb_tensor *ga_apply(nb_tensor *const *in, void *vc) {
  const ga_ctx *c = vc;
  return nb_gather(in[0], c->axis, nnt_i64(c->idx, 3, c->is));
}

/* out = x; out[.., idx, ..] += src over idx's positions. */
static void sa_ref(double *const *in, double *out, void *vc) {
  const ga_ctx *c = vc;
  int a = c->axis < 0 ? c->axis + 3 : c->axis;
  int64_t xs[3], k = 0;
  strides_of(3, c->xs, xs);
  memcpy(out, in[0], (size_t)(c->xs[0] * c->xs[1] * c->xs[2]) * sizeof *out);
  for (int64_t i = 0; i < c->is[0]; i++)
    for (int64_t j = 0; j < c->is[1]; j++)
      for (int64_t l = 0; l < c->is[2]; l++, k++) {
        int64_t ix[3] = {i, j, l};
        ix[a] = c->idx[k];
        out[ix[0] * xs[0] + ix[1] * xs[1] + ix[2] * xs[2]] += in[1][k];
      }
}

static nb_tensor *sa_apply(nb_tensor *const *in, void *vc) {
  const ga_ctx *c = vc;
  return nb_scatter_add(in[0], c->axis, nnt_i64(c->idx, 3, c->is), in[1]);
}

static void test_gather_scatter(void) {
  static const int64_t g1[] = {0, 3, 3, 1, 2, 0, 1, 1, 0, 2, 3, 3};           /* (3, 2, 2) on axis 1 of (3, 4, 2) */
  static const int64_t g2[] = {2, 0, 1, 2, 2, 2, 0, 1, 1, 0, 2, 0, 1, 1, 0, 1}; /* (2, 4, 2) on axis 0 of (3, 4, 2) */
  static const int64_t g3[] = {1, 0, 1, 1, 0, 0};                                 /* (3, 2, 1) axis -1 of (3, 4, 2) */
  ga_ctx cases[] = {
    {{3, 4, 2}, {3, 2, 2}, 1, g1}, {{3, 4, 2}, {2, 4, 2}, 0, g2}, {{3, 4, 2}, {3, 2, 1}, -1, g3},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ga_ctx *c = &cases[i];
    nb_tensor *ins[2] = {nbt_leaf(240 + i, 3, c->xs), nbt_leaf(250 + i, 3, c->is)};
    char name[64];
    snprintf(name, sizeof name, "gather axis %d case %zu", c->axis, i);
    nnt_check_forward(name, ga_apply, ga_ref, c, 1, ins);
    nbt_gradcheck(name, ga_apply, c, 1, ins, 1e-6, 1e-6, 1e-9);
    snprintf(name, sizeof name, "scatter_add axis %d case %zu", c->axis, i);
    nnt_check_forward(name, sa_apply, sa_ref, c, 2, ins);
    nbt_gradcheck(name, sa_apply, c, 2, ins, 1e-6, 1e-6, 1e-9);
    nnt_release_all(2, ins);
  }
  /* gather on a transposed input and i32 indices */
  nb_scope_begin();
  nb_tensor *x = nnt_f64((double[]){0, 1, 2, 3, 4, 5}, 2, (int64_t[]){2, 3});
  nb_tensor *idx = nb_cast(nnt_i64((int64_t[]){1, 0, 0, 0, 1, 1}, 2, (int64_t[]){3, 2}), NB_I32);
  /* x^T = [[0,3],[1,4],[2,5]]; gather along axis 1 */
  nbt_check_close("gather transposed, i32 indices", nb_gather(nb_transpose(x, 0, 1), 1, idx),
                  (double[]){3, 0, 1, 1, 5, 5}, 0, 0);
  /* scatter_add on integers */
  nb_tensor *xi = nnt_i64((int64_t[]){1, 1, 1}, 1, (int64_t[]){3});
  nbt_check_close("scatter_add i64", nb_scatter_add(xi, 0, nnt_i64((int64_t[]){2, 2}, 1, (int64_t[]){2}),
                                                    nnt_i64((int64_t[]){5, 7}, 1, (int64_t[]){2})),
                  (double[]){1, 1, 13}, 0, 0);
  nb_scope_end();
}

/* ---- one_hot ------------------------------------------------------------------------ */
static void test_one_hot(void) {
  nb_scope_begin();
  nb_tensor *idx = nnt_i64((int64_t[]){0, 2, 1, 2}, 2, (int64_t[]){2, 2});
  nb_tensor *y = nb_one_hot(idx, 4);
  NBT_CHECK(y && nb_dtype_of(y) == NB_I64 && nb_ndim(y) == 3 && nb_shape(y)[2] == 4, "one_hot shape and dtype");
  nbt_check_close("one_hot", y, (double[]){1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0}, 0, 0);
  nb_tensor *z = nb_one_hot(nb_cast(idx, NB_I32), -1);
  NBT_CHECK(z && nb_shape(z)[2] == 3, "one_hot infers num_classes = max + 1");
  nbt_check_error("one_hot out of range", !nb_one_hot(idx, 2), NB_ERR_INDEX, "one_hot", "index 2", "2 classes", NULL);
  nbt_check_error("one_hot negative", !nb_one_hot(nnt_i64((int64_t[]){0, -1}, 1, (int64_t[]){2}), 3),
                  NB_ERR_INDEX, "one_hot", "index -1", NULL);
  nbt_check_error("one_hot float", !nb_one_hot(nb_cast(idx, NB_F32), 3), NB_ERR_DTYPE, "one_hot", NULL);
  nbt_check_error("one_hot NULL", !nb_one_hot(NULL, 3), NB_ERR_NULL, "one_hot", NULL);
  nb_scope_end();
}

/* ---- errors ------------------------------------------------------------------------- */
static void test_errors(void) {
  nb_scope_begin();
  nb_tensor *x = nbt_randn(1, 2, (int64_t[]){3, 4}, NB_F32);
  nb_tensor *ok = nnt_i64((int64_t[]){0, 2}, 1, (int64_t[]){2});
  nb_tensor *big = nnt_i64((int64_t[]){0, 4}, 1, (int64_t[]){2});
  nb_tensor *neg = nnt_i64((int64_t[]){-1, 0}, 1, (int64_t[]){2});
  nb_clear_error();
  /* out of range, including negative (never wrapped) */
  nbt_check_error("index_select range", !nb_index_select(x, 1, big), NB_ERR_INDEX, "index_select", "index 4", "size 4", NULL);
  nbt_check_error("index_select negative", !nb_index_select(x, 0, neg), NB_ERR_INDEX, "index_select", "index -1", NULL);
  nbt_check_error("embedding range", !nb_embedding(x, nnt_i64((int64_t[]){3}, 1, (int64_t[]){1})), NB_ERR_INDEX,
                  "embedding", "index 3", "size 3", NULL);
  nb_tensor *gbig = nnt_i64((int64_t[]){0, 1, 5, 0}, 2, (int64_t[]){2, 2});
  nb_tensor *gneg = nnt_i64((int64_t[]){0, 1, -2, 0}, 2, (int64_t[]){2, 2});
  nbt_check_error("gather range", !nb_gather(x, 1, gbig), NB_ERR_INDEX, "gather", "index 5", NULL);
  nbt_check_error("gather negative", !nb_gather(x, 1, gneg), NB_ERR_INDEX, "gather", "index -2", NULL);
  nb_tensor *src = nbt_randn(2, 2, (int64_t[]){2, 2}, NB_F32);
  nbt_check_error("scatter_add range", !nb_scatter_add(x, 1, gbig, src), NB_ERR_INDEX, "scatter_add", "index 5", NULL);
  nbt_check_error("scatter_add negative", !nb_scatter_add(x, 0, gneg, src), NB_ERR_INDEX, "scatter_add", "index -2", NULL);
  /* dtypes */
  nbt_check_error("index_select float indices", !nb_index_select(x, 0, nb_cast(ok, NB_F32)), NB_ERR_DTYPE,
                  "index_select", "f32", "i64 or i32", NULL);
  nbt_check_error("gather bool indices", !nb_gather(x, 0, nb_cast(gbig, NB_BOOL)), NB_ERR_DTYPE, "gather", NULL);
  nbt_check_error("embedding float indices", !nb_embedding(x, nb_cast(ok, NB_F64)), NB_ERR_DTYPE, "embedding", NULL);
  nbt_check_error("scatter_add int src into float", !nb_scatter_add(x, 1, gbig, nb_cast(src, NB_I64)), NB_ERR_DTYPE,
                  "scatter_add", NULL);
  /* shapes */
  nbt_check_error("index_select 2-D indices", !nb_index_select(x, 0, gbig), NB_ERR_SHAPE, "index_select", "i64[2, 2]", NULL);
  nbt_check_error("gather rank", !nb_gather(x, 0, ok), NB_ERR_SHAPE, "gather", "i64[2]", "f32[3, 4]", NULL);
  nbt_check_error("gather too large", !nb_gather(x, 1, nnt_i64((int64_t[]){0, 0, 0, 0}, 2, (int64_t[]){4, 1})),
                  NB_ERR_SHAPE, "gather", "i64[4, 1]", NULL);
  nbt_check_error("scatter_add src shape", !nb_scatter_add(x, 1, gbig, nbt_randn(3, 2, (int64_t[]){2, 3}, NB_F32)),
                  NB_ERR_SHAPE, "scatter_add", "src f32[2, 3]", NULL);
  nbt_check_error("embedding 1-D weight", !nb_embedding(nb_reshape(x, 1, (int64_t[]){12}), ok), NB_ERR_SHAPE,
                  "embedding", "weight", NULL);
  /* axes and NULLs */
  nbt_check_error("index_select axis", !nb_index_select(x, 2, ok), NB_ERR_AXIS, "index_select", "axis 2", NULL);
  nbt_check_error("gather axis", !nb_gather(x, -3, gbig), NB_ERR_AXIS, "gather", NULL);
  nbt_check_error("scatter_add NULL src", !nb_scatter_add(x, 0, gbig, NULL), NB_ERR_NULL, "scatter_add", "src", NULL);
  nbt_check_error("gather NULL chain", !nb_gather(nb_index_select(x, 0, NULL), 0, gbig), NB_ERR_NULL,
                  "index_select", "indices", NULL);
  nb_scope_end();
}

int main(void) {
  test_index_select();
  test_embedding();
  test_gather_scatter();
  test_one_hot();
  test_errors();
  return nbt_finish();
}
