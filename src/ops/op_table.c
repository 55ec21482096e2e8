/* The op table: every primitive's description, in op_list.h's order. */
#include <string.h>

#include "ops/op_list.h"
#include "ops/ops.h"

#define NB_OP_DECLARE(name) extern const nb_op nb_op_##name;
NB_OP_LIST(NB_OP_DECLARE)

#define NB_OP_ENTRY(name) &nb_op_##name,
const nb_op *const nb_op_table[] = {NB_OP_LIST(NB_OP_ENTRY)};
const int nb_op_count = (int)(sizeof nb_op_table / sizeof nb_op_table[0]);

const nb_op *nb_op_find(const char *name) {
  for (int i = 0; i < nb_op_count; i++)
    if (!strcmp(nb_op_table[i]->name, name)) return nb_op_table[i];
  return NULL;
}
