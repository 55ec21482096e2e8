/* CUDA runtime: device discovery, one stream per device, the caching
 * allocator, host transfers, the device error flag, events, and the
 * iteration-space builder shared by the kernels.
 *
 * Allocator: blocks are rounded up (to 512 B below 1 MiB, to 2 MiB above)
 * and a freed block goes to the free list of its exact rounded size; the
 * next request of that size takes it without cudaMalloc. All work on a
 * device runs on its one stream, so a block freed after its last kernel was
 * enqueued can be handed out again at once: later users are ordered after
 * it. cudaFree happens only in nb_cuda_empty_cache and on the OOM retry,
 * both after a stream sync. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_blaslt.h"
#include "backend/cuda/cuda_common.cuh"

#define NB_CUDA_MAX_DEVICES 16
#define NB_SMALL_LIMIT ((size_t)1 << 20)
#define NB_SMALL_ROUND ((size_t)512)
#define NB_LARGE_ROUND ((size_t)2 << 20)
#define NB_LT_WORKSPACE ((size_t)32 << 20)

typedef struct nb_cuda_block {
  void *ptr;
  struct nb_cuda_block *next;
} nb_cuda_block;

typedef struct {
  size_t size;
  nb_cuda_block *head;
} nb_cuda_bin;

typedef struct {
  int ready;
  cudaStream_t stream;
  int n_sm, l2_bytes;
  /* allocator: bins sorted by size */
  nb_cuda_bin *bins;
  int n_bins, cap_bins;
  nb_memory_stats stats;
  /* index error flag */
  int64_t *flag, *flag_host;
  /* work counters of persistent kernels (nb_cuda_work_counters) */
  unsigned *work;
  /* cuBLASLt */
  cublasLtHandle_t lt;
  void *lt_ws;
} nb_cuda_dev;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_ndev = 0;
static int g_index_eager = 1;
static nb_cuda_dev g_dev[NB_CUDA_MAX_DEVICES];

/* ---- errors -------------------------------------------------------------- */
nb_status nb_cuda_status(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return NB_OK;
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nb_error_set(NB_ERR_OOM, "cuda: %s: %s", what, cudaGetErrorString(e));
  }
  return nb_error_set(NB_ERR_BACKEND, "cuda: %s: %s (%s)", what, cudaGetErrorString(e),
                      cudaGetErrorName(e));
}

nb_status nb_cuda_launch_check(const char *name) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return NB_OK;
  return nb_error_set(NB_ERR_BACKEND, "cuda: kernel %s failed to launch: %s (%s)", name,
                      cudaGetErrorString(e), cudaGetErrorName(e));
}

/* ---- devices ------------------------------------------------------------- */
static void discover(void) {
  int n = 0;
  /* No driver or no GPU: an error code, never a crash; clear it. */
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  g_ndev = n > NB_CUDA_MAX_DEVICES ? NB_CUDA_MAX_DEVICES : n;
  const char *env = getenv("NABLA_CUDA_INDEX_CHECK");
  if (env && env[0] == '0') g_index_eager = 0;
}

extern "C" int nb_cuda_available(void) {
  pthread_once(&g_once, discover);
  return g_ndev;
}

extern "C" void nb_cuda_set_index_check(int eager) { g_index_eager = eager != 0; }

/* Creates the device's stream and flag on first use; caller holds g_lock. */
static nb_status dev_init(int d) {
  nb_cuda_dev *s = &g_dev[d];
  if (s->ready) return NB_OK;
  NB_CUDA_TRY(cudaSetDevice(d), "cudaSetDevice");
  NB_CUDA_TRY(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  NB_CUDA_TRY(cudaDeviceGetAttribute(&s->n_sm, cudaDevAttrMultiProcessorCount, d),
              "cudaDeviceGetAttribute");
  if (cudaDeviceGetAttribute(&s->l2_bytes, cudaDevAttrL2CacheSize, d) != cudaSuccess)
    s->l2_bytes = 0, cudaGetLastError(); /* sections then fall back to one batch index (nb_fa3_section) */
  NB_CUDA_TRY(cudaMalloc((void **)&s->flag, 2 * sizeof(int64_t)), "cudaMalloc(flag)");
  NB_CUDA_TRY(cudaMemsetAsync(s->flag, 0, 2 * sizeof(int64_t), s->stream), "cudaMemsetAsync(flag)");
  NB_CUDA_TRY(cudaHostAlloc((void **)&s->flag_host, 2 * sizeof(int64_t), cudaHostAllocDefault),
              "cudaHostAlloc(flag)");
  NB_CUDA_TRY(cudaMalloc((void **)&s->work, NB_CUDA_WORK_WORDS * sizeof(unsigned)), "cudaMalloc(counters)");
  NB_CUDA_TRY(cudaMemsetAsync(s->work, 0, NB_CUDA_WORK_WORDS * sizeof(unsigned), s->stream),
              "cudaMemsetAsync(counters)");
  s->ready = 1;
  return NB_OK;
}

/* Makes device d current and initialised. */
static nb_status dev_use(int d, const char *op) {
  if (nb_cuda_available() == 0)
    return nb_error_set(NB_ERR_DEVICE, "%s: no CUDA device is available", op);
  if (d < 0 || d >= g_ndev)
    return nb_error_set(NB_ERR_DEVICE, "%s: device cuda:%d does not exist (%d found)", op, d, g_ndev);
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != d) NB_CUDA_TRY(cudaSetDevice(d), "cudaSetDevice");
  if (g_dev[d].ready) return NB_OK;
  pthread_mutex_lock(&g_lock);
  nb_status st = dev_init(d);
  pthread_mutex_unlock(&g_lock);
  return st;
}

static void ctx_fill(nb_cuda_ctx *ctx, int d) {
  ctx->dev = d;
  ctx->stream = g_dev[d].stream;
  ctx->n_sm = g_dev[d].n_sm > 0 ? g_dev[d].n_sm : 1;
  ctx->l2_bytes = g_dev[d].l2_bytes;
}

nb_status nb_cuda_enter(const void *ptr, const char *op, nb_cuda_ctx *ctx) {
  int d = 0;
  if (nb_cuda_available() > 1 && ptr) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, ptr) == cudaSuccess && a.type == cudaMemoryTypeDevice)
      d = a.device;
    else
      cudaGetLastError();
  }
  nb_status st = dev_use(d, op);
  if (st == NB_OK) ctx_fill(ctx, d);
  return st;
}

/* ---- caching allocator --------------------------------------------------- */
static size_t round_size(size_t n) {
  if (n < NB_SMALL_LIMIT) return n <= NB_SMALL_ROUND ? NB_SMALL_ROUND : (n + NB_SMALL_ROUND - 1) & ~(NB_SMALL_ROUND - 1);
  return (n + NB_LARGE_ROUND - 1) & ~(NB_LARGE_ROUND - 1);
}

/* Index of the bin of size, or where it would be inserted (sorted). */
static int bin_find(nb_cuda_dev *s, size_t size, int *found) {
  int lo = 0, hi = s->n_bins;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (s->bins[mid].size < size) lo = mid + 1;
    else hi = mid;
  }
  *found = lo < s->n_bins && s->bins[lo].size == size;
  return lo;
}

static void *cache_take(nb_cuda_dev *s, size_t size) {
  int found, i = bin_find(s, size, &found);
  if (!found || !s->bins[i].head) return NULL;
  nb_cuda_block *b = s->bins[i].head;
  s->bins[i].head = b->next;
  void *p = b->ptr;
  free(b);
  return p;
}

static int cache_put(nb_cuda_dev *s, void *p, size_t size) {
  int found, i = bin_find(s, size, &found);
  if (!found) {
    if (s->n_bins == s->cap_bins) {
      int cap = s->cap_bins ? 2 * s->cap_bins : 32;
      nb_cuda_bin *nb = (nb_cuda_bin *)realloc(s->bins, (size_t)cap * sizeof *nb);
      if (!nb) return 0;
      s->bins = nb;
      s->cap_bins = cap;
    }
    memmove(s->bins + i + 1, s->bins + i, (size_t)(s->n_bins - i) * sizeof *s->bins);
    s->bins[i].size = size;
    s->bins[i].head = NULL;
    s->n_bins++;
  }
  nb_cuda_block *b = (nb_cuda_block *)malloc(sizeof *b);
  if (!b) return 0;
  b->ptr = p;
  b->next = s->bins[i].head;
  s->bins[i].head = b;
  return 1;
}

/* Frees every cached block; caller holds g_lock and has made d current. */
static void cache_release_all(int d) {
  nb_cuda_dev *s = &g_dev[d];
  cudaStreamSynchronize(s->stream);
  for (int i = 0; i < s->n_bins; i++) {
    for (nb_cuda_block *b = s->bins[i].head, *nx; b; b = nx) {
      nx = b->next;
      cudaFree(b->ptr);
      s->stats.reserved -= (int64_t)s->bins[i].size;
      free(b);
    }
    s->bins[i].head = NULL;
  }
  cudaGetLastError();
}

static void *dev_alloc(int d, size_t nbytes) {
  if (nbytes > ((size_t)1 << 62)) {
    nb_error_set(NB_ERR_OOM, "cuda:%d: out of memory: %zu bytes requested", d, nbytes);
    return NULL;
  }
  size_t size = round_size(nbytes);
  nb_cuda_dev *s = &g_dev[d];
  pthread_mutex_lock(&g_lock);
  void *p = cache_take(s, size);
  if (p) {
    s->stats.n_cache_hits++;
  } else {
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) { /* give the cache back and retry once */
      cudaGetLastError();
      cache_release_all(d);
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t fr = 0, tot = 0;
      cudaMemGetInfo(&fr, &tot);
      cudaGetLastError();
      pthread_mutex_unlock(&g_lock);
      if (e == cudaErrorMemoryAllocation)
        nb_error_set(NB_ERR_OOM, "cuda:%d: out of memory: %zu bytes requested, %zu bytes free of "
                     "%zu (the cache was emptied and the allocation retried)", d, nbytes, fr, tot);
      else
        nb_cuda_status(e, "cudaMalloc");
      return NULL;
    }
    s->stats.n_cuda_malloc++;
    s->stats.reserved += (int64_t)size;
  }
  s->stats.allocated += (int64_t)size;
  if (s->stats.allocated > s->stats.peak) s->stats.peak = s->stats.allocated;
  pthread_mutex_unlock(&g_lock);
  return p;
}

static void dev_free(int d, void *p, size_t nbytes) {
  size_t size = round_size(nbytes);
  nb_cuda_dev *s = &g_dev[d];
  pthread_mutex_lock(&g_lock);
  s->stats.allocated -= (int64_t)size;
  if (!cache_put(s, p, size)) { /* no host memory for bookkeeping: give it back */
    cudaStreamSynchronize(s->stream);
    cudaFree(p);
    s->stats.reserved -= (int64_t)size;
  }
  pthread_mutex_unlock(&g_lock);
}

void *nb_cuda_scratch(const nb_cuda_ctx *ctx, size_t nbytes) { return dev_alloc(ctx->dev, nbytes); }
void nb_cuda_scratch_free(const nb_cuda_ctx *ctx, void *p, size_t nbytes) {
  if (p) dev_free(ctx->dev, p, nbytes);
}

extern "C" nb_status nb_cuda_memory_stats(int device, nb_memory_stats *out) {
  if (!out) return nb_error_null("nb_cuda_memory_stats", "out");
  memset(out, 0, sizeof *out);
  nb_status st = dev_use(device, "nb_cuda_memory_stats");
  if (st) return st;
  pthread_mutex_lock(&g_lock);
  *out = g_dev[device].stats;
  pthread_mutex_unlock(&g_lock);
  return NB_OK;
}

/* Dense FLOPs per SM per clock: tensor-core bf16/f16 products with f32
 * accumulation, and f32 FMA (2 per lane). From NVIDIA's architecture
 * documents (e.g. sm_80: 312 TFLOP/s = 108 SMs x 2048 x 1.41 GHz; sm_90:
 * 4096 per SM); GeForce parts of sm_86/89 accumulate f32 at the lower rate
 * given here. 0: not in the table. */
static void peak_rates(int major, int minor, double *low, double *f32) {
  int cc = 10 * major + minor;
  *low = cc == 70 ? 1024 : cc == 75 ? 512 : cc == 80 ? 2048 : cc == 86 || cc == 89 ? 512
       : cc == 90 ? 4096 : cc == 100 ? 8192 : 0;
  *f32 = cc == 70 || cc == 75 || cc == 80 ? 128 : cc == 86 || cc == 89 || cc == 90 || cc == 100 ? 256 : 0;
}

extern "C" nb_status nb_cuda_device_info(int device, nb_cuda_info *out) {
  if (!out) return nb_error_null("nb_cuda_device_info", "out");
  memset(out, 0, sizeof *out);
  nb_status st = dev_use(device, "nb_cuda_device_info");
  if (st) return st;
  cudaDeviceProp p;
  int clock_khz = 0;
  NB_CUDA_TRY(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  NB_CUDA_TRY(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device),
              "cudaDeviceGetAttribute(clock)");
  snprintf(out->name, sizeof out->name, "%s", p.name);
  out->cc_major = p.major;
  out->cc_minor = p.minor;
  out->n_sm = p.multiProcessorCount;
  out->clock_mhz = clock_khz / 1000;
  out->memory_bytes = (int64_t)p.totalGlobalMem;
  double low, f32;
  peak_rates(p.major, p.minor, &low, &f32);
  out->peak_flops_low = low * out->n_sm * clock_khz * 1e3;
  out->peak_flops_f32 = f32 * out->n_sm * clock_khz * 1e3;
  return NB_OK;
}

extern "C" nb_status nb_cuda_empty_cache(int device) {
  nb_status st = dev_use(device, "nb_cuda_empty_cache");
  if (st) return st;
  pthread_mutex_lock(&g_lock);
  cache_release_all(device);
  pthread_mutex_unlock(&g_lock);
  return NB_OK;
}

/* ---- backend memory entries ---------------------------------------------- */
static void *cuda_alloc(nb_device dev, size_t nbytes) {
  if (dev_use(dev.index, "cuda alloc")) return NULL;
  return dev_alloc(dev.index, nbytes);
}

static void cuda_free(nb_device dev, void *p, size_t nbytes) {
  if (!p || dev.index < 0 || dev.index >= g_ndev) return;
  dev_free(dev.index, p, nbytes);
}

/* Reads the index flag after the stream is idle (lazy mode). */
static nb_status flag_check_idle(int d, const char *op) {
  nb_cuda_dev *s = &g_dev[d];
  NB_CUDA_TRY(cudaMemcpyAsync(s->flag_host, s->flag, 2 * sizeof(int64_t), cudaMemcpyDeviceToHost,
                              s->stream), "cudaMemcpyAsync(flag)");
  NB_CUDA_TRY(cudaStreamSynchronize(s->stream), op);
  if (!s->flag_host[0]) return NB_OK;
  long long bad = (long long)s->flag_host[1];
  NB_CUDA_TRY(cudaMemsetAsync(s->flag, 0, 2 * sizeof(int64_t), s->stream), "cudaMemsetAsync(flag)");
  return nb_error_set(NB_ERR_INDEX, "%s: an earlier index kernel on cuda:%d found index %lld out "
                      "of range", op, d, bad);
}

static nb_status cuda_upload(nb_device dev, void *dst, const void *src, size_t nbytes) {
  nb_status st = dev_use(dev.index, "cuda upload");
  if (st || !nbytes) return st;
  cudaStream_t sm = g_dev[dev.index].stream;
  NB_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, sm), "upload (cudaMemcpyAsync)");
  /* From pageable memory the call returns once src was staged; from pinned
   * memory it is truly asynchronous, so wait before the caller reuses src. */
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, src) == cudaSuccess && a.type == cudaMemoryTypeHost)
    NB_CUDA_TRY(cudaStreamSynchronize(sm), "upload (cudaStreamSynchronize)");
  cudaGetLastError();
  return NB_OK;
}

static nb_status cuda_download(nb_device dev, void *dst, const void *src, size_t nbytes) {
  nb_status st = dev_use(dev.index, "cuda download");
  if (st || !nbytes) return st;
  cudaStream_t sm = g_dev[dev.index].stream;
  NB_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, sm), "download (cudaMemcpyAsync)");
  NB_CUDA_TRY(cudaStreamSynchronize(sm), "download (cudaStreamSynchronize)");
  return g_index_eager ? NB_OK : flag_check_idle(dev.index, "download");
}

static nb_status cuda_synchronize(nb_device dev) {
  nb_status st = dev_use(dev.index, "cuda synchronize");
  if (st) return st;
  NB_CUDA_TRY(cudaStreamSynchronize(g_dev[dev.index].stream), "cudaStreamSynchronize");
  return g_index_eager ? NB_OK : flag_check_idle(dev.index, "synchronize");
}

/* ---- index flag ----------------------------------------------------------- */
int64_t *nb_cuda_flag(const nb_cuda_ctx *ctx) { return g_dev[ctx->dev].flag; }

unsigned *nb_cuda_work_counters(const nb_cuda_ctx *ctx) { return g_dev[ctx->dev].work; }

nb_status nb_cuda_flag_check(const nb_cuda_ctx *ctx, const char *op, int64_t limit) {
  if (!g_index_eager) return NB_OK;
  nb_cuda_dev *s = &g_dev[ctx->dev];
  NB_CUDA_TRY(cudaMemcpyAsync(s->flag_host, s->flag, 2 * sizeof(int64_t), cudaMemcpyDeviceToHost,
                              ctx->stream), "cudaMemcpyAsync(flag)");
  NB_CUDA_TRY(cudaStreamSynchronize(ctx->stream), op);
  if (!s->flag_host[0]) return NB_OK;
  long long bad = (long long)s->flag_host[1];
  NB_CUDA_TRY(cudaMemsetAsync(s->flag, 0, 2 * sizeof(int64_t), ctx->stream), "cudaMemsetAsync(flag)");
  return nb_error_set(NB_ERR_INDEX, "%s: index %lld is out of range [0, %lld) (cuda:%d)", op, bad,
                      (long long)limit, ctx->dev);
}

/* ---- cuBLASLt handle ----------------------------------------------------- */
void *nb_cuda_lt_handle(const nb_cuda_ctx *ctx, void **workspace, size_t *ws_bytes) {
  nb_cuda_dev *s = &g_dev[ctx->dev];
  pthread_mutex_lock(&g_lock);
  if (!s->lt) {
    const nb_blaslt_api *lt = nb_blaslt();
    if (!lt) {
      pthread_mutex_unlock(&g_lock);
      return NULL;
    }
    cublasLtHandle_t h;
    cublasStatus_t cs = lt->Create(&h);
    if (cs != CUBLAS_STATUS_SUCCESS) {
      pthread_mutex_unlock(&g_lock);
      nb_error_set(NB_ERR_BACKEND, "cuda: cublasLtCreate failed (status %d)", (int)cs);
      return NULL;
    }
    if (cudaMalloc(&s->lt_ws, NB_LT_WORKSPACE) != cudaSuccess) {
      cudaGetLastError();
      s->lt_ws = NULL; /* cuBLASLt still works without a workspace */
    }
    s->lt = h;
  }
  pthread_mutex_unlock(&g_lock);
  *workspace = s->lt_ws;
  *ws_bytes = s->lt_ws ? NB_LT_WORKSPACE : 0;
  return (void *)s->lt;
}

/* ---- events --------------------------------------------------------------- */
extern "C" void *nb_cuda_event_record(int device) {
  if (dev_use(device, "nb_event_record")) return NULL;
  cudaEvent_t e;
  if (nb_cuda_status(cudaEventCreate(&e), "cudaEventCreate")) return NULL;
  if (nb_cuda_status(cudaEventRecord(e, g_dev[device].stream), "cudaEventRecord")) {
    cudaEventDestroy(e);
    return NULL;
  }
  return (void *)e;
}

extern "C" double nb_cuda_event_elapsed_ms(void *start, void *end) {
  float ms = 0;
  if (nb_cuda_status(cudaEventSynchronize((cudaEvent_t)end), "cudaEventSynchronize")) return -1;
  if (nb_cuda_status(cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end),
                     "cudaEventElapsedTime")) return -1;
  return ms;
}

extern "C" void nb_cuda_event_free(void *e) {
  if (e) cudaEventDestroy((cudaEvent_t)e);
}

/* ---- iteration spaces ----------------------------------------------------- */
void nb_iter_make(nb_iter *it, int ndim, const int64_t *shape, int nops,
                  const int64_t *const *strides) {
  int n = 0;
  int64_t total = 1;
  memset(it, 0, sizeof *it);
  for (int d = 0; d < ndim; d++) {
    total *= shape[d];
    if (shape[d] == 1) continue;
    int merge = n > 0;
    for (int k = 0; k < nops && merge; k++)
      merge = it->stride[k][n - 1] == strides[k][d] * shape[d];
    if (merge) { /* the previous axis steps exactly over this one */
      it->size[n - 1] *= shape[d];
      for (int k = 0; k < nops; k++) it->stride[k][n - 1] = strides[k][d];
    } else {
      it->size[n] = shape[d];
      for (int k = 0; k < nops; k++) it->stride[k][n] = strides[k][d];
      n++;
    }
  }
  if (n == 0) it->size[n++] = 1;
  it->ndim = n;
  it->small = total < ((int64_t)1 << 32);
  for (int d = 0; d < n; d++)
    it->div[d] = nb_fastdiv_make(it->small ? (uint32_t)it->size[d] : 1u);
}

void nb_iter_views(nb_iter *it, int nops, const nb_kview *const *views) {
  const int64_t *st[NB_CUDA_MAX_OPS];
  for (int k = 0; k < nops; k++) st[k] = views[k]->strides;
  nb_iter_make(it, views[0]->ndim, views[0]->shape, nops, st);
}

int nb_iter_contiguous(const nb_iter *it, int nops) {
  if (it->ndim != 1) return 0;
  for (int k = 0; k < nops; k++)
    if (it->stride[k][0] != 1 && it->size[0] != 1) return 0;
  return 1;
}

/* ---- the table's memory entries, used by cuda_backend.cu ----------------- */
extern "C" {
void *nb_cuda_alloc_entry(nb_device dev, size_t nbytes) { return cuda_alloc(dev, nbytes); }
void nb_cuda_free_entry(nb_device dev, void *p, size_t nbytes) { cuda_free(dev, p, nbytes); }
nb_status nb_cuda_upload_entry(nb_device dev, void *dst, const void *src, size_t nbytes) {
  return cuda_upload(dev, dst, src, nbytes);
}
nb_status nb_cuda_download_entry(nb_device dev, void *dst, const void *src, size_t nbytes) {
  return cuda_download(dev, dst, src, nbytes);
}
nb_status nb_cuda_sync_entry(nb_device dev) { return cuda_synchronize(dev); }

/* Pinned host memory for nb_empty_pinned: portable across devices, so any
 * device's stream can copy from it asynchronously. */
void *nb_cuda_host_alloc_entry(size_t nbytes) {
  void *p = NULL;
  cudaError_t e = cudaHostAlloc(&p, nbytes ? nbytes : 1, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    nb_error_set(NB_ERR_OOM, "cuda: cannot allocate %zu bytes of pinned host memory: %s", nbytes,
                 cudaGetErrorString(e));
    return NULL;
  }
  return p;
}
void nb_cuda_host_free_entry(void *p) {
  if (p && cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
}
nb_status nb_cuda_upload_async_entry(nb_device dev, void *dst, const void *src, size_t nbytes) {
  nb_status st = dev_use(dev.index, "cuda upload_async");
  if (st || !nbytes) return st;
  NB_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, g_dev[dev.index].stream),
              "upload_async (cudaMemcpyAsync)");
  return NB_OK;
}
}
