/* CUDA backend entries: one function per backend table entry (contracts in
 * backend/backend_entries.h). cuda_backend.cu assembles them into the table. */
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
/* The kernel entries, nb_cuda_NAME for each of backend/backend_entries.h:
 * cuda_elementwise.cu (fill, arange, copy, unary, binary, where),
 * cuda_random.cu (rand_uniform, rand_normal, randint, dropout),
 * cuda_reduce.cu (reduce), cuda_gemm.cu (matmul, gemm_ex), cuda_softmax.cu
 * (softmax_fwd, softmax_bwd), cuda_norm.cu (norm_fwd, norm_bwd),
 * cuda_xent.cu (xent_fwd, xent_bwd, xent_fused), cuda_index.cu
 * (index_select, index_add, gather, scatter_add), cuda_conv.cu (im2col,
 * col2im, pooling), cuda_optim.cu (adamw_step, sgd_step, adamw_multi,
 * sumsq_multi, scale_multi), cuda_attention.cu (attn_fwd, attn_bwd). */
#define NB_BACKEND_KERNEL(NAME, PARAMS, ARGS, PROF) nb_status nb_cuda_##NAME PARAMS;
#include "backend/backend_entries.h"

#ifdef __cplusplus
}
#endif
#endif /* NB_CUDA_KERNELS_H */
