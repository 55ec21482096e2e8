/* The CUDA backend's function table (contracts in backend/backend.h). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

static const nb_backend nb_cuda_table = {
  "cuda",
  nb_cuda_alloc_entry,
  nb_cuda_free_entry,
  nb_cuda_upload_entry,
  nb_cuda_download_entry,
  nb_cuda_sync_entry,
  nb_cuda_host_alloc_entry,
  nb_cuda_host_free_entry,
  nb_cuda_upload_async_entry,
  nb_cuda_fill,
  nb_cuda_arange,
  nb_cuda_copy,
  nb_cuda_unary,
  nb_cuda_binary,
  nb_cuda_where,
  nb_cuda_reduce,
  nb_cuda_matmul,
  nb_cuda_rand_uniform,
  nb_cuda_rand_normal,
  nb_cuda_randint,
  nb_cuda_softmax_fwd,
  nb_cuda_softmax_bwd,
  nb_cuda_norm_fwd,
  nb_cuda_norm_bwd,
  nb_cuda_xent_fwd,
  nb_cuda_xent_bwd,
  nb_cuda_xent_fused,
  nb_cuda_index_select,
  nb_cuda_index_add,
  nb_cuda_gather,
  nb_cuda_scatter_add,
  nb_cuda_dropout,
  nb_cuda_im2col,
  nb_cuda_col2im,
  nb_cuda_maxpool2d_fwd,
  nb_cuda_maxpool2d_bwd,
  nb_cuda_avgpool2d_fwd,
  nb_cuda_avgpool2d_bwd,
  nb_cuda_adamw_step,
  nb_cuda_sgd_step,
  nb_cuda_adamw_multi,
  nb_cuda_sumsq_multi,
  nb_cuda_scale_multi,
  nb_cuda_attn_fwd,
  nb_cuda_attn_bwd,
};

/* Positional initialisation (C++ has no designated initialisers for every
 * member in order before C++20): this checks the member count stays put. */
static_assert(sizeof(nb_backend) == sizeof(void *) * 45, "nb_backend changed: update the table");

extern "C" const nb_backend *nb_cuda_backend(void) { return &nb_cuda_table; }
