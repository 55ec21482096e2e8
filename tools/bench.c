/* `nabla bench`: placeholder until the benchmark harness lands (it replaces
 * this file and keeps the entry point nb_tool_bench from tool.h). */
#include <stdio.h>

#include "tool.h"

int nb_tool_bench(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr,
          "usage: nabla bench [options]\n"
          "nabla bench: the benchmark harness is not built yet\n");
  return NB_TOOL_EXIT_RUNTIME;
}
