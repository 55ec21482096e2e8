/* CPU kernels: one function nb_cpu_NAME per kernel entry of
 * backend/backend_entries.h (each one's contract is written there),
 * declared here from that list; cpu_backend.c assembles them into the table.
 * Where they are: cpu_elementwise.c (fill, arange, copy, unary, binary,
 * where), cpu_reduce.c (reduce), cpu_gemm.c (matmul), cpu_gemm_ex.c
 * (gemm_ex), cpu_random.c (rand_uniform, rand_normal, randint), cpu_nn.c
 * (softmax, norm and cross-entropy entries), cpu_index.c (index_select,
 * index_add, gather, scatter_add, dropout), cpu_conv.c (im2col, col2im,
 * pooling),
 * cpu_optim.c (adamw_step, sgd_step, adamw_multi, sumsq_multi,
 * scale_multi), cpu_attention.c (attn_fwd, attn_bwd). */
#ifndef NB_CPU_KERNELS_H
#define NB_CPU_KERNELS_H
#include "backend/backend.h"

#define NB_BACKEND_KERNEL(NAME, PARAMS, ARGS, PROF) nb_status nb_cpu_##NAME PARAMS;
#include "backend/backend_entries.h"

#endif
