/* cuBLASLt loaded at first use with dlopen: see cuda_blaslt.h. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <type_traits>

#include "backend/cuda/cuda_blaslt.h"

#define NB_STR2(x) #x
#define NB_STR(x) NB_STR2(x)
#define NB_BLASLT_SONAME "libcublasLt.so." NB_STR(CUBLAS_VER_MAJOR)

/* Every function of the table: its member, resolved from cublasLt<member>. */
#define NB_BLASLT_FUNCS(X)                                                                   \
  X(Create) X(GetStatusString) X(MatrixLayoutCreate) X(MatrixLayoutSetAttribute)           \
  X(MatrixLayoutDestroy) X(MatmulDescCreate) X(MatmulDescSetAttribute) X(MatmulDescDestroy) \
  X(MatmulPreferenceCreate) X(MatmulPreferenceSetAttribute) X(MatmulPreferenceDestroy)      \
  X(MatmulAlgoGetHeuristic) X(Matmul)

/* The table's types are cublasLt.h's, checked here at compile time. */
#define NB_BLASLT_SAME(m)                                                                     \
  static_assert(std::is_same<decltype(((nb_blaslt_api *)0)->m), decltype(&cublasLt##m)>::value, \
                "nb_blaslt_api::" #m " differs from cublasLt" #m);
NB_BLASLT_FUNCS(NB_BLASLT_SAME)

static const char *const g_candidates[] = {
    NB_BLASLT_SONAME,
#ifdef NABLA_CUBLASLT_DIR /* the toolkit's library directory at build time */
    NABLA_CUBLASLT_DIR "/" NB_BLASLT_SONAME,
#endif
    NULL};

extern "C" const char *const *nb_blaslt_candidates(void) { return g_candidates; }

extern "C" nb_status nb_blaslt_open(const char *const *names, nb_blaslt_api *api, void **handle) {
  char tried[1024] = "";
  size_t used = 0;
  *handle = NULL;
  memset(api, 0, sizeof *api);
  for (int i = 0; names && names[i]; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char *why = dlerror();
      int n = snprintf(tried + used, sizeof tried - used, "%s%s", used ? "; " : "",
                       why ? why : names[i]);
      if (n > 0) used = used + (size_t)n < sizeof tried ? used + (size_t)n : sizeof tried - 1;
      continue;
    }
    const char *missing = NULL;
#define NB_BLASLT_SYM(m)                                          \
    if (!missing) {                                               \
      void *p = dlsym(h, "cublasLt" #m);                          \
      if (p) api->m = (decltype(api->m))p;                        \
      else missing = "cublasLt" #m;                               \
    }
    NB_BLASLT_FUNCS(NB_BLASLT_SYM)
#undef NB_BLASLT_SYM
    if (missing) {
      dlclose(h);
      memset(api, 0, sizeof *api);
      return nb_error_set(NB_ERR_BACKEND, "cuda: cuBLASLt: %s has no function %s (expected the "
                          "cuBLAS %d library nabla was built with)", names[i], missing,
                          (int)CUBLAS_VER_MAJOR);
    }
    *handle = h;
    return NB_OK;
  }
  return nb_error_set(NB_ERR_BACKEND, "cuda: cuBLASLt could not be loaded (%s); f32/f64 products "
                      "and those nabla's own GEMM kernels do not take need %s (CUDA toolkit's "
                      "cuBLAS): install it or add its directory to LD_LIBRARY_PATH",
                      used ? tried : "no file to try", NB_BLASLT_SONAME);
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static nb_blaslt_api g_api;
static void *g_handle;
static nb_status g_status = NB_OK;
static char g_error[1536]; /* the failed load's message, repeated on every call */

static void blaslt_load(void) {
  g_status = nb_blaslt_open(g_candidates, &g_api, &g_handle);
  if (g_status) snprintf(g_error, sizeof g_error, "%s", nb_last_error());
}

extern "C" const nb_blaslt_api *nb_blaslt(void) {
  pthread_once(&g_once, blaslt_load);
  if (g_status) {
    nb_error_set(g_status, "%s", g_error);
    return NULL;
  }
  return &g_api;
}

extern "C" int nb_blaslt_loaded(void) { return g_handle != NULL; }

extern "C" const char *nb_blaslt_status_string(cublasStatus_t s) {
  return g_handle && g_api.GetStatusString ? g_api.GetStatusString(s) : "(cuBLASLt not loaded)";
}
