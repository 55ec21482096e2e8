/* Every primitive op, once: X(name) names the description nb_op_<name>
 * defined in its src/ops/op_*.c file. The order is the table's (the test
 * and benchmark walk it); a new op is one line here plus its description.
 * The elementwise ops come from the elementwise list (backend/ew_list.h). */
#ifndef NB_OPS_OP_LIST_H
#define NB_OPS_OP_LIST_H

#include "backend/ew_list.h"

/* X(name) for every op name of the elementwise list: its unary ops, their
 * fused backward kernels, its binary ops and its comparisons, in its order
 * (op_unary.c and op_binary.c define them). Each row becomes "X (name)",
 * which the outer expansion turns into a call of X (a macro's name). */
#define NB_EW_OP_NAME(ID, KNAME, NAME, ...) (NAME)
#define NB_EW_OP_NAME_C(ID, NAME, EXPR) (NAME)
#define NB_EW_OP_EXPAND(...) __VA_ARGS__
#define NB_EW_OP_LIST(X)                                                         \
  NB_EW_OP_EXPAND(NB_UOP_LIST(X NB_EW_OP_NAME) NB_BOP_DERIVATIVE_LIST(X NB_EW_OP_NAME) \
                  NB_BOP_LIST(X NB_EW_OP_NAME) NB_CMP_LIST(X NB_EW_OP_NAME_C))

#define NB_OP_LIST(X)                                                            \
  /* elementwise (op_unary.c, op_binary.c) */                                    \
  NB_EW_OP_LIST(X) X(where) X(clamp) X(cast)                                    \
  /* reductions (op_reduce.c) */                                                 \
  X(sum) X(max) X(min) X(argmax) X(argmin)                                      \
  /* contractions (op_matmul.c, op_linear.c, op_scaled_mm.c) */                  \
  X(matmul) X(linear) X(scaled_mm)                                              \
  /* losses (op_loss.c) */                                                       \
  X(cross_entropy) X(cross_entropy_backward)                                    \
  /* indexing (op_index.c) */                                                   \
  X(index_select) X(index_select_backward) X(gather) X(scatter_add)              \
  /* convolution and pooling (op_conv.c) */                                     \
  X(conv2d) X(im2col) X(col2im) X(max_pool2d) X(max_pool2d_backward)             \
  X(avg_pool2d) X(avg_pool2d_backward)                                          \
  /* views and copies (op_view.c, op_join.c) */                                  \
  X(reshape) X(permute) X(expand) X(slice) X(slice_backward) X(clone) X(cat)     \
  /* creation and transfer (op_create.c) */                                      \
  X(full) X(arange) X(rand) X(randn) X(randint) X(to_device)                     \
  /* row ops */                                                                  \
  X(softmax) X(log_softmax) X(softmax_backward) X(log_softmax_backward)          \
  X(layer_norm) X(rms_norm) X(layer_norm_backward) X(rms_norm_backward)         \
  /* attention and dropout (op_attention.c, op_attention_qkv.c) */               \
  X(scaled_dot_product_attention) X(scaled_dot_product_attention_backward)       \
  X(attention_qkv) X(attention_qkv_backward) X(dropout)

#endif
