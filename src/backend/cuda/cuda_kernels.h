/* CUDA kernel entries: one function per backend table entry (contracts in
 * backend/backend.h). cuda_backend.cu assembles them into the table. */
#ifndef NB_CUDA_KERNELS_H
#define NB_CUDA_KERNELS_H
#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cuda_runtime.cu */
void *nb_cuda_alloc_entry(nb_device dev, size_t nbytes);
void nb_cuda_free_entry(nb_device dev, void *p, size_t nbytes);
nb_status nb_cuda_upload_entry(nb_device dev, void *dst, const void *src, size_t nbytes);
nb_status nb_cuda_download_entry(nb_device dev, void *dst, const void *src, size_t nbytes);
nb_status nb_cuda_sync_entry(nb_device dev);
void *nb_cuda_host_alloc_entry(size_t nbytes);
void nb_cuda_host_free_entry(void *p);
nb_status nb_cuda_upload_async_entry(nb_device dev, void *dst, const void *src, size_t nbytes);
/* cuda_elementwise.cu */
nb_status nb_cuda_fill(const nb_kview *out, double value);
nb_status nb_cuda_arange(const nb_kview *out, double start, double step);
nb_status nb_cuda_copy(const nb_kview *out, const nb_kview *in);
nb_status nb_cuda_unary(nb_uop op, const nb_kview *out, const nb_kview *in);
nb_status nb_cuda_binary(nb_bop op, const nb_kview *out, const nb_kview *a, const nb_kview *b);
nb_status nb_cuda_where(const nb_kview *out, const nb_kview *cond, const nb_kview *a,
                        const nb_kview *b);
/* cuda_random.cu */
nb_status nb_cuda_rand_uniform(const nb_kview *out, uint64_t seed, uint64_t offset, double lo,
                               double hi);
nb_status nb_cuda_rand_normal(const nb_kview *out, uint64_t seed, uint64_t offset, double mean,
                              double std);
nb_status nb_cuda_randint(const nb_kview *out, uint64_t seed, uint64_t offset, int64_t lo,
                          int64_t hi);
nb_status nb_cuda_dropout(const nb_kview *out, const nb_kview *x, double p, uint64_t seed,
                          uint64_t offset);
/* cuda_reduce.cu */
nb_status nb_cuda_reduce(nb_rop op, const nb_kview *out, const nb_kview *in, int nred);
/* cuda_gemm.cu */
nb_status nb_cuda_matmul(const nb_kview *out, const nb_kview *a, const nb_kview *b);
/* cuda_softmax.cu, cuda_norm.cu */
nb_status nb_cuda_softmax_fwd(const nb_kview *y, const nb_kview *x, int log);
nb_status nb_cuda_softmax_bwd(const nb_kview *dx, const nb_kview *dy, const nb_kview *y, int log);
nb_status nb_cuda_norm_fwd(const nb_kview *y, const nb_kview *mean, const nb_kview *rstd,
                           const nb_kview *x, const nb_kview *w, const nb_kview *b, double eps,
                           int rms);
nb_status nb_cuda_norm_bwd(const nb_kview *dx, const nb_kview *dw, const nb_kview *db,
                           const nb_kview *dy, const nb_kview *x, const nb_kview *mean,
                           const nb_kview *rstd, const nb_kview *w, int rms);
nb_status nb_cuda_xent_fwd(const nb_kview *loss, const nb_kview *lse, const nb_kview *logits,
                           const nb_kview *targets, int64_t ignore_index, double smoothing);
nb_status nb_cuda_xent_bwd(const nb_kview *dlogits, const nb_kview *dloss,
                           const nb_kview *logits, const nb_kview *targets, const nb_kview *lse,
                           int64_t ignore_index, double smoothing);
nb_status nb_cuda_xent_fused(const nb_kview *loss, const nb_kview *lse, const nb_kview *dlogits,
                             const nb_kview *dloss, const nb_kview *out, int mean,
                             const nb_kview *logits, const nb_kview *targets,
                             int64_t ignore_index, double smoothing);
/* cuda_index.cu */
nb_status nb_cuda_index_select(const nb_kview *out, const nb_kview *x, int axis,
                               const nb_kview *idx);
nb_status nb_cuda_index_add(const nb_kview *out, int axis, const nb_kview *idx,
                            const nb_kview *src, int deterministic);
nb_status nb_cuda_gather(const nb_kview *out, const nb_kview *x, int axis, const nb_kview *idx);
nb_status nb_cuda_scatter_add(const nb_kview *out, int axis, const nb_kview *idx,
                              const nb_kview *src, int deterministic);
/* cuda_conv.cu */
nb_status nb_cuda_im2col(const nb_kview *cols, const nb_kview *x, const nb_im2col_params *p);
nb_status nb_cuda_col2im(const nb_kview *x, const nb_kview *cols, const nb_im2col_params *p);
nb_status nb_cuda_maxpool2d_fwd(const nb_kview *y, const nb_kview *argmax, const nb_kview *x,
                                const nb_im2col_params *p);
nb_status nb_cuda_maxpool2d_bwd(const nb_kview *dx, const nb_kview *dy, const nb_kview *argmax,
                                const nb_im2col_params *p);
nb_status nb_cuda_avgpool2d_fwd(const nb_kview *y, const nb_kview *x, const nb_im2col_params *p);
nb_status nb_cuda_avgpool2d_bwd(const nb_kview *dx, const nb_kview *dy,
                                const nb_im2col_params *p);
/* cuda_optim.cu */
nb_status nb_cuda_adamw_step(const nb_kview *p, const nb_kview *g, const nb_kview *m,
                             const nb_kview *v, double lr, double beta1, double beta2,
                             double eps, double weight_decay, int64_t step);
nb_status nb_cuda_sgd_step(const nb_kview *p, const nb_kview *g, const nb_kview *buf, double lr,
                           double momentum, double dampening, int nesterov,
                           double weight_decay);
nb_status nb_cuda_adamw_multi(int n, const nb_kview *p, const nb_kview *g, const nb_kview *m,
                              const nb_kview *v, double lr, double beta1, double beta2, double eps,
                              double weight_decay, int64_t step);
nb_status nb_cuda_sumsq_multi(int n, const nb_kview *x, const nb_kview *out);
nb_status nb_cuda_scale_multi(int n, const nb_kview *x, double s);
/* cuda_attention.cu */
nb_status nb_cuda_attn_fwd(const nb_kview *o, const nb_kview *lse, const nb_kview *q,
                           const nb_kview *k, const nb_kview *v, double scale, int causal);
nb_status nb_cuda_attn_bwd(const nb_kview *dq, const nb_kview *dk, const nb_kview *dv,
                           const nb_kview *dout, const nb_kview *q, const nb_kview *k,
                           const nb_kview *v, const nb_kview *o, const nb_kview *lse, double scale,
                           int causal);

#ifdef __cplusplus
}
#endif
#endif /* NB_CUDA_KERNELS_H */
