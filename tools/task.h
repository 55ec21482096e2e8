/* Training tasks of `nabla train`: the built-in addition task (no download)
 * and character-level text from a file. */
#ifndef NB_TOOL_TASK_H
#define NB_TOOL_TASK_H

#include <stdint.h>

#include "gpt.h"

/* "123+456=" followed by the sum's digits least significant first, padded
 * to digits+1: "123+456=9750". Writing the answer reversed lets the model
 * produce each digit right after the digits (and carry) it depends on. */
#define TASK_ADD_VOCAB 12 /* '0'..'9', '+', '=' */
#define TASK_ADD_PLUS 10
#define TASK_ADD_EQ 11

typedef struct {
  int digits;     /* per operand */
  int prompt_len; /* 2 * digits + 2 */
  int answer_len; /* digits + 1 */
  int context;    /* model input length: prompt_len + answer_len - 1 */
} task_add;

void task_add_init(task_add *t, int digits);
/* B examples as model inputs x (B, context) and targets y (B, context); only
 * the answer positions have targets, the rest are -1 (ignored by the loss).
 * held_out selects the held-out pairs (evaluation) instead of the training
 * pairs; the two sets are disjoint. */
void task_add_batch(const task_add *t, nb_rng *rng, int B, int held_out, int64_t *x,
                    int64_t *y);
/* Greedy-decodes n held-out problems drawn from rng and returns the fraction
 * answered exactly (all digits), or a negative value on a library error.
 * If show > 0, prints that many worked examples to stdout. */
double task_add_accuracy(const task_add *t, const gpt_model *m, nb_rng *rng, int n, int show);

#endif
