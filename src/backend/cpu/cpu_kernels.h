/* CPU kernels: one function per backend table entry (see backend/backend.h
 * for each one's contract). cpu_backend.c assembles them into the table. */
#ifndef NB_CPU_KERNELS_H
#define NB_CPU_KERNELS_H
#include "backend/backend.h"

/* cpu_elementwise.c */
nb_status nb_cpu_fill(const nb_kview *out, double value);
nb_status nb_cpu_arange(const nb_kview *out, double start, double step);
nb_status nb_cpu_copy(const nb_kview *out, const nb_kview *in);
nb_status nb_cpu_unary(nb_uop op, const nb_kview *out, const nb_kview *in);
nb_status nb_cpu_binary(nb_bop op, const nb_kview *out, const nb_kview *a, const nb_kview *b);
nb_status nb_cpu_where(const nb_kview *out, const nb_kview *cond, const nb_kview *a,
                       const nb_kview *b);
/* cpu_reduce.c */
nb_status nb_cpu_reduce(nb_rop op, const nb_kview *out, const nb_kview *in, int nred);
/* cpu_random.c */
nb_status nb_cpu_rand_uniform(const nb_kview *out, uint64_t seed, uint64_t offset, double lo,
                              double hi);
nb_status nb_cpu_rand_normal(const nb_kview *out, uint64_t seed, uint64_t offset, double mean,
                             double std);
nb_status nb_cpu_randint(const nb_kview *out, uint64_t seed, uint64_t offset, int64_t lo,
                         int64_t hi);
/* cpu_gemm.c */
nb_status nb_cpu_matmul(const nb_kview *out, const nb_kview *a, const nb_kview *b);
/* cpu_nn.c */
nb_status nb_cpu_softmax_fwd(const nb_kview *y, const nb_kview *x, int log);
nb_status nb_cpu_softmax_bwd(const nb_kview *dx, const nb_kview *dy, const nb_kview *y, int log);
nb_status nb_cpu_norm_fwd(const nb_kview *y, const nb_kview *mean, const nb_kview *rstd,
                          const nb_kview *x, const nb_kview *w, const nb_kview *b, double eps,
                          int rms);
nb_status nb_cpu_norm_bwd(const nb_kview *dx, const nb_kview *dw, const nb_kview *db,
                          const nb_kview *dy, const nb_kview *x, const nb_kview *mean,
                          const nb_kview *rstd, const nb_kview *w, int rms);
nb_status nb_cpu_xent_fwd(const nb_kview *loss, const nb_kview *lse, const nb_kview *logits,
                          const nb_kview *targets, int64_t ignore_index, double smoothing);
nb_status nb_cpu_xent_bwd(const nb_kview *dlogits, const nb_kview *dloss,
                          const nb_kview *logits, const nb_kview *targets, const nb_kview *lse,
                          int64_t ignore_index, double smoothing);
/* Forward, N_valid, row-scaled backward and the reduced loss (backend.h). */
nb_status nb_cpu_xent_fused(const nb_kview *loss, const nb_kview *lse, const nb_kview *dlogits,
                            const nb_kview *dloss, const nb_kview *out, int mean,
                            const nb_kview *logits, const nb_kview *targets,
                            int64_t ignore_index, double smoothing);
/* cpu_index.c */
nb_status nb_cpu_index_select(const nb_kview *out, const nb_kview *x, int axis,
                              const nb_kview *idx);
nb_status nb_cpu_index_add(const nb_kview *out, int axis, const nb_kview *idx,
                           const nb_kview *src, int deterministic);
nb_status nb_cpu_gather(const nb_kview *out, const nb_kview *x, int axis, const nb_kview *idx);
nb_status nb_cpu_scatter_add(const nb_kview *out, int axis, const nb_kview *idx,
                             const nb_kview *src, int deterministic);
nb_status nb_cpu_dropout(const nb_kview *out, const nb_kview *x, double p, uint64_t seed,
                         uint64_t offset);
/* cpu_conv.c */
nb_status nb_cpu_im2col(const nb_kview *cols, const nb_kview *x, const nb_im2col_params *p);
nb_status nb_cpu_col2im(const nb_kview *x, const nb_kview *cols, const nb_im2col_params *p);
nb_status nb_cpu_maxpool2d_fwd(const nb_kview *y, const nb_kview *argmax, const nb_kview *x,
                               const nb_im2col_params *p);
nb_status nb_cpu_maxpool2d_bwd(const nb_kview *dx, const nb_kview *dy, const nb_kview *argmax,
                               const nb_im2col_params *p);
nb_status nb_cpu_avgpool2d_fwd(const nb_kview *y, const nb_kview *x, const nb_im2col_params *p);
nb_status nb_cpu_avgpool2d_bwd(const nb_kview *dx, const nb_kview *dy,
                               const nb_im2col_params *p);
/* cpu_optim.c */
nb_status nb_cpu_adamw_step(const nb_kview *p, const nb_kview *g, const nb_kview *m,
                            const nb_kview *v, double lr, double beta1, double beta2,
                            double eps, double weight_decay, int64_t step);
nb_status nb_cpu_sgd_step(const nb_kview *p, const nb_kview *g, const nb_kview *buf, double lr,
                          double momentum, double dampening, int nesterov,
                          double weight_decay);
nb_status nb_cpu_adamw_multi(int n, const nb_kview *p, const nb_kview *g, const nb_kview *m,
                             const nb_kview *v, double lr, double beta1, double beta2, double eps,
                             double weight_decay, int64_t step);
nb_status nb_cpu_sumsq_multi(int n, const nb_kview *x, const nb_kview *out);
nb_status nb_cpu_scale_multi(int n, const nb_kview *x, double s);
/* cpu_attention.c */
nb_status nb_cpu_attn_fwd(const nb_kview *o, const nb_kview *lse, const nb_kview *q,
                          const nb_kview *k, const nb_kview *v, double scale, int causal);
nb_status nb_cpu_attn_bwd(const nb_kview *dq, const nb_kview *dk, const nb_kview *dv,
                          const nb_kview *dout, const nb_kview *q, const nb_kview *k,
                          const nb_kview *v, const nb_kview *o, const nb_kview *lse, double scale,
                          int causal);
#endif
