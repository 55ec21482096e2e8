/* MNIST with nabla: an MLP and a small CNN trained on IDX files.
 *
 *   mnist [options] TRAIN_IMAGES TRAIN_LABELS TEST_IMAGES TEST_LABELS
 *   mnist [options] --dir DIR     (DIR holds the four standard file names)
 *
 * Reads the IDX files (validating magic numbers, dimensions and sizes),
 * trains each model with AdamW and prints its test accuracy. Exit status: 0
 * done, 1 run-time failure, 2 bad input (options or files). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h" /* the nabla tools' option parser (tools/cli.c) */
#include "nabla.h"

#define MN_CLASSES 10
#define MN_EXIT_RUNTIME 1
#define MN_EXIT_USAGE 2

/* ---- IDX files ------------------------------------------------------------- */

typedef struct {
  int64_t n, rows, cols; /* rows = cols = 1 for labels */
  unsigned char *data;   /* n * rows * cols bytes */
} mn_idx;

static int mn_fail(const char *what, const char *path, const char *why) {
  fprintf(stderr, "mnist: %s '%s': %s\n", what, path, why);
  return MN_EXIT_USAGE;
}

static uint32_t mn_be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int mn_slurp(const char *what, const char *path, unsigned char **buf, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return mn_fail(what, path, strerror(errno));
  size_t cap = 1 << 20, n = 0, got;
  unsigned char *b = malloc(cap);
  while (b && (got = fread(b + n, 1, cap - n, f)) > 0)
    if ((n += got) == cap) {
      unsigned char *nb = realloc(b, cap *= 2);
      if (!nb) free(b);
      b = nb;
    }
  int err = ferror(f);
  fclose(f);
  if (!b || err) {
    free(b);
    return mn_fail(what, path, b ? "read error" : "out of memory");
  }
  *buf = b;
  *len = n;
  return 0;
}

/* Reads an IDX file of unsigned bytes with ndim dimensions (3: images, 1:
 * labels): magic 0x0000 08 <ndim>, then ndim big-endian sizes, then data. */
static int mn_idx_read(const char *what, const char *path, int ndim, mn_idx *out) {
  unsigned char *b;
  size_t len;
  char why[200];
  int rc = mn_slurp(what, path, &b, &len);
  if (rc) return rc;
  size_t head = 4 + 4 * (size_t)ndim;
  uint32_t magic = len >= 4 ? mn_be32(b) : 0, want = 0x0800u | (uint32_t)ndim;
  if (len < 4 || magic != want) {
    snprintf(why, sizeof why, "bad magic number 0x%08x (expected 0x%08x: unsigned bytes, %d "
             "dimension%s)%s", magic, want, ndim, ndim > 1 ? "s" : "", len < 4 ? ", file too short" : "");
    free(b);
    return mn_fail(what, path, why);
  }
  /* The product is checked against the data's length before each
   * multiplication: three 32-bit sizes can overflow 64 bits. */
  int64_t dims[3] = {1, 1, 1}, total = 1, data = len >= head ? (int64_t)(len - head) : 0;
  int over = 0;
  for (int i = 0; i < ndim && len >= head; i++) {
    dims[i] = mn_be32(b + 4 + 4 * i);
    if (dims[i] && total > data / dims[i]) over = 1;
    else total *= dims[i];
  }
  if (len < head || over || total == 0 || total != data) {
    char prod[32] = "more than the file has";
    if (!over) snprintf(prod, sizeof prod, "%lld", (long long)total);
    snprintf(why, sizeof why, "size mismatch: the header says %lld x %lld x %lld = %s bytes of "
             "data, the file has %lld", (long long)dims[0], (long long)dims[1], (long long)dims[2],
             prod, (long long)data);
    free(b);
    return mn_fail(what, path, why);
  }
  memmove(b, b + head, (size_t)total);
  *out = (mn_idx){dims[0], dims[1], dims[2], b};
  return 0;
}

typedef struct {
  mn_idx images, labels;
} mn_set;

static int mn_set_read(const char *name, const char *img, const char *lab, mn_set *s) {
  char w1[64], w2[64], why[160];
  snprintf(w1, sizeof w1, "%s images", name);
  snprintf(w2, sizeof w2, "%s labels", name);
  int rc = mn_idx_read(w1, img, 3, &s->images);
  if (!rc) rc = mn_idx_read(w2, lab, 1, &s->labels);
  if (rc) return rc;
  if (s->images.n != s->labels.n) {
    snprintf(why, sizeof why, "%lld labels for %lld images in '%s'", (long long)s->labels.n,
             (long long)s->images.n, img);
    return mn_fail(w2, lab, why);
  }
  for (int64_t i = 0; i < s->labels.n; i++)
    if (s->labels.data[i] >= MN_CLASSES) {
      snprintf(why, sizeof why, "label %d at index %lld (expected 0..%d)", s->labels.data[i],
               (long long)i, MN_CLASSES - 1);
      return mn_fail(w2, lab, why);
    }
  return 0;
}

/* ---- models -------------------------------------------------------------- */

typedef enum { MN_MLP, MN_CNN } mn_kind;

typedef struct {
  mn_kind kind;
  int64_t rows, cols;
  nb_params *params;
  nb_tensor *w[3], *b[3]; /* borrowed from params */
} mn_model;

static nb_tensor *mn_param(nb_params *p, const char *name, int ndim, const int64_t *shape,
                           nb_rng *rng, nb_device dev) {
  nb_tensor *t = nb_zeros(ndim, shape, NB_F32, dev);
  if (t && ndim > 1 && nb_init_kaiming_uniform_(t, rng, sqrt(2.0)) != NB_OK) return NULL;
  return t ? nb_params_add(p, name, t) : NULL;
}

/* Layer l: weight of shape ws (ndim wn), bias of size ws[0]. */
static int mn_layer(mn_model *m, int l, int wn, const int64_t *ws, nb_rng *rng, nb_device dev) {
  char name[32];
  snprintf(name, sizeof name, "layer%d.weight", l);
  m->w[l] = mn_param(m->params, name, wn, ws, rng, dev);
  snprintf(name, sizeof name, "layer%d.bias", l);
  m->b[l] = mn_param(m->params, name, 1, ws, rng, dev);
  return m->w[l] && m->b[l];
}

/* MLP: pixels -> 128 -> 10. CNN: conv3x3(8) relu pool2, conv3x3(16) relu
 * pool2, linear to 10. */
static int mn_model_init(mn_model *m, mn_kind kind, int64_t rows, int64_t cols, nb_rng *rng,
                         nb_device dev) {
  memset(m, 0, sizeof *m);
  m->kind = kind, m->rows = rows, m->cols = cols;
  if (!(m->params = nb_params_new())) return 0;
  nb_scope_begin();
  int ok;
  if (kind == MN_MLP)
    ok = mn_layer(m, 0, 2, (int64_t[]){128, rows * cols}, rng, dev) &&
         mn_layer(m, 1, 2, (int64_t[]){MN_CLASSES, 128}, rng, dev);
  else
    ok = mn_layer(m, 0, 4, (int64_t[]){8, 1, 3, 3}, rng, dev) &&
         mn_layer(m, 1, 4, (int64_t[]){16, 8, 3, 3}, rng, dev) &&
         mn_layer(m, 2, 2, (int64_t[]){MN_CLASSES, 16 * (rows / 4) * (cols / 4)}, rng, dev);
  nb_scope_end();
  return ok;
}

/* x: (B, rows*cols) normalised pixels. Returns logits (B, 10). */
static nb_tensor *mn_forward(const mn_model *m, nb_tensor *x) {
  if (m->kind == MN_MLP)
    return nb_linear(nb_relu(nb_linear(x, m->w[0], m->b[0])), m->w[1], m->b[1]);
  nb_conv2d_params cp = nb_conv2d_defaults();
  cp.padding[0] = cp.padding[1] = 1;
  nb_tensor *h = nb_reshape(x, 4, (int64_t[]){-1, 1, m->rows, m->cols});
  h = nb_max_pool2d(nb_relu(nb_conv2d(h, m->w[0], m->b[0], cp)), 2, 2, 2, 2, 0, 0);
  h = nb_max_pool2d(nb_relu(nb_conv2d(h, m->w[1], m->b[1], cp)), 2, 2, 2, 2, 0, 0);
  return nb_linear(nb_flatten(h, 1, -1), m->w[2], m->b[2]);
}

/* ---- training ------------------------------------------------------------ */

typedef struct {
  int epochs, batch;
  double lr;
  int64_t limit;
  uint64_t seed;
  nb_device dev;
} mn_opts;

/* Normalised pixels and labels of samples idx[0..B) as tensors. */
static void mn_batch(const mn_set *s, const int64_t *idx, int B, float *xb, int64_t *yb) {
  int64_t px = s->images.rows * s->images.cols;
  for (int r = 0; r < B; r++) {
    const unsigned char *img = s->images.data + idx[r] * px;
    for (int64_t j = 0; j < px; j++) xb[r * px + j] = (img[j] / 255.0f - 0.1307f) / 0.3081f;
    yb[r] = s->labels.data[idx[r]];
  }
}

static void mn_shuffle(int64_t *idx, int64_t n, nb_rng *rng) {
  for (int64_t i = n - 1; i > 0; i--) {
    uint32_t r[4];
    nb_philox4x32(rng->seed, rng->offset++, r);
    int64_t j = (int64_t)(((uint64_t)r[0] << 32 | r[1]) % (uint64_t)(i + 1));
    int64_t t = idx[i];
    idx[i] = idx[j], idx[j] = t;
  }
}

/* One optimizer step on a batch; returns its loss (NaN on error). */
static double mn_step(const mn_model *m, nb_optim *opt, const float *xb, const int64_t *yb, int B,
                      const mn_opts *o) {
  double loss_v = NAN;
  nb_clear_error(); /* a NaN loss with no error is divergence, not a failure */
  nb_scope_begin();
  nb_tensor *x = nb_from_buffer(xb, 2, (int64_t[]){B, m->rows * m->cols}, NB_F32, o->dev);
  nb_tensor *y = nb_from_buffer(yb, 1, (int64_t[]){B}, NB_I64, o->dev);
  nb_tensor *loss = nb_cross_entropy(mn_forward(m, x), y, NB_REDUCE_MEAN, -100, 0.0);
  if (loss && nb_backward(loss, NULL) == NB_OK && nb_optim_step(opt) == NB_OK)
    loss_v = nb_item(loss);
  nb_params_zero_grad(m->params);
  nb_scope_end();
  return loss_v;
}

/* Fraction of s classified correctly (negative on error). */
static double mn_accuracy(const mn_model *m, const mn_set *s, const mn_opts *o, float *xb,
                          int64_t *yb, int64_t *idx, int cap) {
  int64_t correct = 0, n = s->images.n;
  int failed = 0;
  nb_no_grad_begin();
  for (int64_t at = 0; at < n && !failed; at += cap) {
    int B = n - at < cap ? (int)(n - at) : cap;
    for (int r = 0; r < B; r++) idx[r] = at + r;
    mn_batch(s, idx, B, xb, yb);
    nb_scope_begin();
    nb_tensor *x = nb_from_buffer(xb, 2, (int64_t[]){B, m->rows * m->cols}, NB_F32, o->dev);
    nb_tensor *pred = nb_argmax(mn_forward(m, x), 1, 0);
    int64_t *pb = malloc(sizeof *pb * (size_t)B);
    failed = !pred || !pb || nb_to_host(pred, pb, sizeof *pb * (size_t)B) != NB_OK;
    for (int r = 0; r < B && !failed; r++) correct += pb[r] == yb[r];
    free(pb);
    nb_scope_end();
  }
  nb_no_grad_end();
  return failed ? -1.0 : (double)correct / (double)n;
}

static double mn_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int mn_train(mn_kind kind, const mn_set *train, const mn_set *test, const mn_opts *o) {
  const char *name = kind == MN_MLP ? "mlp" : "cnn";
  int64_t n = o->limit && o->limit < train->images.n ? o->limit : train->images.n;
  int cap = o->batch > 1000 ? o->batch : 1000, px = (int)(train->images.rows * train->images.cols);
  nb_rng rng = nb_rng_new(o->seed);
  mn_model m = {0};
  float *xb = malloc(sizeof *xb * (size_t)cap * px);
  int64_t *yb = malloc(sizeof *yb * (size_t)cap), *idx = malloc(sizeof *idx * (size_t)(n > cap ? n : cap));
  nb_optim *opt = NULL;
  int rc = MN_EXIT_RUNTIME;
  double t0 = mn_now();
  if (xb && yb && idx && mn_model_init(&m, kind, train->images.rows, train->images.cols, &rng, o->dev) &&
      (opt = nb_adamw_new(m.params, o->lr, 0.9, 0.999, 1e-8, 1e-4))) {
    rc = 0;
    printf("%s: %lld parameters, %lld training images, %d epoch%s\n", name,
           (long long)nb_params_numel(m.params), (long long)n, o->epochs, o->epochs > 1 ? "s" : "");
    for (int e = 0; e < o->epochs && !rc; e++) {
      for (int64_t i = 0; i < n; i++) idx[i] = i;
      mn_shuffle(idx, n, &rng);
      double sum = 0;
      int64_t steps = 0;
      for (int64_t at = 0; at < n && !rc; at += o->batch, steps++) {
        int B = n - at < o->batch ? (int)(n - at) : o->batch;
        mn_batch(train, idx + at, B, xb, yb);
        double l = mn_step(&m, opt, xb, yb, B, o);
        rc = isnan(l) && nb_last_status() != NB_OK ? MN_EXIT_RUNTIME : 0;
        sum += l;
      }
      if (!rc) printf("%s: epoch %d/%d  mean loss %.4f  (%.1f s)\n", name, e + 1, o->epochs,
                      sum / (double)steps, mn_now() - t0);
      fflush(stdout);
    }
    double acc = rc ? -1 : mn_accuracy(&m, test, o, xb, yb, idx, cap);
    if (acc < 0) rc = MN_EXIT_RUNTIME;
    else printf("%s test accuracy: %.2f%% (%lld images)\n", name, 100 * acc, (long long)test->images.n);
  }
  if (rc) fprintf(stderr, "mnist: %s: %s\n", name, nb_last_error());
  nb_optim_free(opt);
  nb_params_free(m.params);
  free(xb), free(yb), free(idx);
  return rc;
}

/* ---- command line ---------------------------------------------------------- */

static void mn_usage(FILE *f) {
  fprintf(f,
          "usage: mnist [options] TRAIN_IMAGES TRAIN_LABELS TEST_IMAGES TEST_LABELS\n"
          "       mnist [options] --dir DIR\n"
          "  --model mlp|cnn|both   (default both)\n"
          "  --epochs N             (default 1)\n"
          "  --batch N              (default 64)\n"
          "  --lr X                 (default 0.001, AdamW)\n"
          "  --limit N              use the first N training images\n"
          "  --seed N               (default 1)\n"
          "  --device D             cpu, cuda, cuda:N (default cpu)\n"
          "Values go as --opt VALUE or --opt=VALUE; -- ends the options.\n");
}

typedef struct {
  mn_opts o;
  const char *model, *dir, *device, *paths[4];
  int n_paths, help;
} mn_args;

/* Options through the nabla tools' shared parser (tools/cli.c): --opt
 * VALUE or --opt=VALUE, -- before paths that start with a dash. Returns 0,
 * -1 for --help, or 2 after a message. */
static int mn_parse(int argc, char **argv, mn_args *a) {
  memset(a, 0, sizeof *a);
  a->o = (mn_opts){1, 64, 1e-3, 0, 1, NB_DEVICE_CPU};
  a->model = "both";
  a->device = "cpu";
  const cli_opt rows[] = {
      CLI_OPT_CHOICE("model", &a->model, "mlp|cnn|both"),
      CLI_OPT_STR("dir", &a->dir, 0),
      CLI_OPT_STR("device", &a->device, 0),
      CLI_OPT_NUM(CLI_INT, "epochs", &a->o.epochs, 1, 1000, 0),
      CLI_OPT_NUM(CLI_INT, "batch", &a->o.batch, 1, 65536, 0),
      CLI_OPT_REAL("lr", &a->o.lr, 0, 10, 1, 0),
      CLI_OPT_NUM(CLI_I64, "limit", &a->o.limit, 1, INT64_MAX, 0),
      CLI_OPT_NUM(CLI_U64, "seed", &a->o.seed, 0, INT64_MAX, 0),
      CLI_OPT_FLAG("help", 'h', &a->help),
  };
  cli_spec spec = {.prog = "mnist", .opts = rows, .n_opts = sizeof rows / sizeof *rows,
                   .pos = a->paths, .max_pos = 4};
  int rc = cli_parse(&spec, argc, argv);
  a->n_paths = spec.n_pos;
  if (rc) return rc;
  if (a->help) return mn_usage(stdout), -1;
  if (nb_device_parse(a->device, &a->o.dev) != NB_OK ||
      (a->o.dev.type == NB_CUDA && a->o.dev.index >= nb_cuda_available())) {
    fprintf(stderr, "mnist: --device '%s' is not an available device (cpu, cuda, cuda:N)\n",
            a->device);
    return MN_EXIT_USAGE;
  }
  if ((a->dir != NULL) == (a->n_paths == 4) || (a->dir && a->n_paths)) {
    fprintf(stderr, "mnist: give --dir DIR or the four files, not %s\n",
            a->dir ? "both" : a->n_paths ? "fewer" : "neither");
    mn_usage(stderr);
    return MN_EXIT_USAGE;
  }
  return 0;
}

int main(int argc, char **argv) {
  static const char *std_names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                     "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
  mn_args a;
  int rc = mn_parse(argc, argv, &a);
  if (rc) return rc < 0 ? 0 : rc;
  char buf[4][4096];
  for (int i = 0; a.dir && i < 4; i++) {
    snprintf(buf[i], sizeof buf[i], "%s/%s", a.dir, std_names[i]);
    a.paths[i] = buf[i];
  }
  mn_set train = {0}, test = {0};
  rc = mn_set_read("train", a.paths[0], a.paths[1], &train);
  if (!rc) rc = mn_set_read("test", a.paths[2], a.paths[3], &test);
  if (!rc && (test.images.rows != train.images.rows || test.images.cols != train.images.cols)) {
    fprintf(stderr, "mnist: test images are %lldx%lld, training images %lldx%lld\n",
            (long long)test.images.rows, (long long)test.images.cols, (long long)train.images.rows,
            (long long)train.images.cols);
    rc = MN_EXIT_USAGE;
  }
  if (!rc && strcmp(a.model, "mlp") && (train.images.rows < 4 || train.images.cols < 4)) {
    fprintf(stderr, "mnist: the CNN needs images of at least 4x4 (two 2x2 poolings)\n");
    rc = MN_EXIT_USAGE;
  }
  if (!rc && strcmp(a.model, "cnn")) rc = mn_train(MN_MLP, &train, &test, &a.o);
  if (!rc && strcmp(a.model, "mlp")) rc = mn_train(MN_CNN, &train, &test, &a.o);
  free(train.images.data), free(train.labels.data), free(test.images.data), free(test.labels.data);
  return rc;
}
