/* The sm_90a flash attention forward (cuda_attention_sm90.cu) on a Hopper
 * GPU: each case runs forward and backward (the mma.sync backward reads the
 * sm_90a forward's o and f32 log-sum-exp) with the kernel on, twice (the
 * same bits), then with NABLA_ATTENTION_SM90=0 (the mma.sync forward), and
 * compares both, in norm, with the CPU's fused attention in float64 from
 * the same rounded inputs, and with each other. On a compute capability
 * 9.0 device the launch counter must show that the kernel ran where it
 * applies (bf16, f16; D 64 and 128; views TMA can describe) and not where
 * it does not (D 96, rows of stride D + 1). Cases: T in {1, 7, 64, 129,
 * 1000, 4097}, Lq != Lk both ways (causal aligned top-left), causal and
 * not, several (batch, head) pairs, q, k, v as (B, H, T, D) views of a
 * packed (B, T, 3, H, D) projection, more query blocks than SMs (a
 * persistent CTA takes several). NABLA_TEST_QUICK=1 (the sanitizers)
 * keeps the cases under 1000 rows. The kernel's variants run every case
 * too, each against float64: NABLA_ATTENTION_SM90_PINGPONG=0 (the
 * consumer warpgroups do not take turns), NABLA_ATTENTION_SM90_TMA_STORE=0
 * (o by each thread's pair stores instead of through shared memory and
 * TMA), both off: these change when and how values are stored, never a
 * value, and must give the default's bits; NABLA_ATTENTION_SM90_PERSISTENT
 * =0 (a CTA or cluster per item), NABLA_ATTENTION_SM90_SECTION=3 (the work
 * order in sections of 3 batch indices, the last one shorter where the
 * batch is not a multiple of 3), NABLA_ATTENTION_SM90_CLUSTER=0 (no
 * clusters of two CTAs sharing K and V where not causal; also with
 * PERSISTENT=0), NABLA_ATTENTION_SM90_STREAMK=0 (whole items only; also
 * with SECTION=3): where not causal and there are more items than
 * clusters (B H 140 here), the default cuts the last items' key tiles
 * between clusters and joins the parts, so these sum some rows in another
 * order and are compared with the default in norm there (the library
 * counts the launches that cut), bit for bit everywhere else; on a 9.0
 * device some case must have been cut (140 items are more than any has
 * clusters). Every variant runs with
 * NABLA_ATTENTION_SM90_TAIL=0.05 (a causal order's last section of a few
 * batch indices where the default makes it one of all). Without a CUDA
 * device: skipped (77). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention_sm90_testutil.h"
#include "testutil.h"
#ifdef NABLA_HAVE_CUDA
#include "backend/cuda/cuda_attention_sm90.h"
#endif

static int64_t launches(void) { return SM90_COUNT(nb_cuda_attn_sm90_launches); }

/* The sm_90a kernel's variants besides the default: the switches' values
 * (NULL: unset), and whether the variant sums every element in the same
 * order as the default (1: the same bits; 0: another cut of the items'
 * key tiles between clusters, where the stream-K tail applies). */
static const struct {
  const char *v[6];
  int same;
} variants[] = {{{"0"}, 1},
                {{NULL, "0"}, 1},
                {{"0", "0"}, 1},
                {{NULL, NULL, "0"}, 0},
                {{NULL, NULL, NULL, "3"}, 0},
                {{NULL, NULL, NULL, NULL, "0"}, 0},
                {{NULL, NULL, "0", NULL, "0"}, 0},
                {{NULL, NULL, NULL, NULL, NULL, "0"}, 0},
                {{NULL, NULL, NULL, "3", NULL, "0"}, 0}};
static const char *const switches[] = {"NABLA_ATTENTION_SM90_PINGPONG", "NABLA_ATTENTION_SM90_TMA_STORE",
                                       "NABLA_ATTENTION_SM90_PERSISTENT", "NABLA_ATTENTION_SM90_SECTION",
                                       "NABLA_ATTENTION_SM90_CLUSTER", "NABLA_ATTENTION_SM90_STREAMK",
                                       "NABLA_ATTENTION_SM90_TAIL"};
enum { NSWITCH = sizeof switches / sizeof *switches };

static int64_t cuts(void) { return SM90_COUNT(nb_cuda_attn_sm90_cut_launches); }

static void set_switch(const char *name, const char *value) {
  if (value) setenv(name, value, 1);
  else unsetenv(name);
}

static void check_case(const scase *c, int causal, nb_dtype dt, uint64_t seed) {
  sinputs s;
  sm90_inputs(&s, "sm90", c, causal, dt, seed);
  const char *name = s.name;
  nb_tensor **in = s.in, **rounded = s.rounded;
  const int n = s.n;
  const int64_t l0 = launches();
  unsetenv("NABLA_ATTENTION_SM90");
  for (int i = 0; i < NSWITCH; i++) unsetenv(switches[i]);
  const int64_t k0 = cuts();
  sresult got = run(c, causal, in, n, dt, GPU), again = run(c, causal, in, n, dt, GPU);
  const int64_t l1 = launches(), cut = cuts() > k0; /* the default cut items between clusters */
  setenv("NABLA_ATTENTION_SM90", "0", 1);
  sresult mma = run(c, causal, in, n, dt, GPU);
  const int64_t l2 = launches();
  unsetenv("NABLA_ATTENTION_SM90");
  sresult ref = run(c, causal, rounded, n, NB_F64, CPU);
  if (l0 >= 0) {
    NBT_CHECK(c->runs ? l1 == l0 + 2 : l1 == l0, "%s: the sm_90a kernel ran %lld times in two calls (%d "
              "expected)", name, (long long)(l1 - l0), c->runs ? 2 : 0);
    NBT_CHECK(l2 == l1, "%s: NABLA_ATTENTION_SM90=0 still ran it", name);
  }
  const double tol = s.tol;
  compare(name, "float64", &got, &ref, &ref, n, tol);
  compare(name, "the mma.sync forward", &got, &mma, &ref, n, tol);
  NBT_CHECK(same_bits(&got, &again, n), "%s: two runs differ", name);
  for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
    char vname[260];
    int len = snprintf(vname, sizeof vname, "%s (TAIL=0.05", name);
    for (int k = 0; k < NSWITCH - 1; k++) {
      set_switch(switches[k], variants[i].v[k]);
      if (variants[i].v[k] && len < (int)sizeof vname)
        len += snprintf(vname + len, sizeof vname - len, " %s=%s", switches[k] + 21, variants[i].v[k]);
    }
    if (len < (int)sizeof vname) snprintf(vname + len, sizeof vname - len, ")");
    setenv(switches[NSWITCH - 1], "0.05", 1); /* causal: a last section of a few batch indices */
    const int64_t v0 = launches();
    sresult var = run(c, causal, in, n, dt, GPU);
    const int64_t v1 = launches();
    for (int k = 0; k < NSWITCH; k++) unsetenv(switches[k]);
    if (l0 >= 0)
      NBT_CHECK(v1 == v0 + (c->runs ? 1 : 0), "%s: the sm_90a kernel ran %lld times (%d expected)", vname,
                (long long)(v1 - v0), c->runs ? 1 : 0);
    compare(vname, "float64", &var, &ref, &ref, n, tol);
    if (variants[i].same || !cut)
      NBT_CHECK(same_bits(&var, &got, n), "%s: differs from the default variant's bits", vname);
    else compare(vname, "the default variant", &var, &got, &ref, n, tol);
    atest_free(&var);
  }
  atest_free(&got);
  atest_free(&again);
  atest_free(&mma);
  atest_free(&ref);
  sm90_inputs_free(&s);
}

/* On a 9.0 device some case must have had items cut (140 items are more
 * than any has clusters of two). */
static void some_cut(void) {
  if (launches() >= 0) NBT_CHECK(cuts() > 0, "the forward's stream-K tail cut no item in any case");
}

int main(void) {
  return sm90_run_cases("test_attention_sm90", launches, check_case, some_cut);
}
