/* Grouped-query attention as plain batch axes, for the attention kernels of
 * every backend (attn_fwd, attn_bwd in backend_entries.h).
 *
 * q (.., Hq, Lq, D) with Hq = G Hkv and k, v (.., Hkv, Lk, D): q's head
 * axis splits into (Hkv, G) (a view: strides (G s, s)), and k and v gain a
 * G axis of stride 0 after their head axis, so query head h = kh G + g reads
 * kv head kh and every view has the batch shape (.., Hkv, G). The flat batch
 * index over (.., Hkv, G) is the one over (.., Hq): lse, the mask's and the
 * dropout's numbering are unchanged. The kernels then run unchanged but for
 * dk and dv, whose G axis has stride 0 too: they are computed per kv batch
 * index bk, summing over b = bk G + g for g = 0 .. G - 1 in that order. */
#ifndef NB_ATTN_GROUP_H
#define NB_ATTN_GROUP_H

#include "backend/backend.h"

/* G = Hq / Hkv when k's head axis (rank - 3) differs from q's, else 1; 0
 * when the split views would not fit NB_MAX_DIMS. */
static inline int64_t nb_attn_group_of(const nb_kview *q, const nb_kview *k) {
  int nd = q->ndim;
  if (nd < 3 || k->shape[nd - 3] == q->shape[nd - 3]) return 1;
  if (nd + 1 > NB_MAX_DIMS || k->shape[nd - 3] <= 0) return 0;
  return q->shape[nd - 3] / k->shape[nd - 3];
}

/* Splits view v's head axis (rank - 3) for group size G: kv = 0 for a
 * q-like view (Hq heads), 1 for a k-like view (Hkv heads, stride 0 on G). */
static inline void nb_attn_group_split(nb_kview *v, int64_t G, int kv) {
  if (G == 1) return;
  int nd = v->ndim, h = nd - 3;
  for (int d = nd - 1; d > h; d--) v->shape[d + 1] = v->shape[d], v->strides[d + 1] = v->strides[d];
  int64_t s = v->strides[h];
  if (kv) {
    v->shape[h + 1] = G, v->strides[h + 1] = 0;
  } else {
    v->shape[h] = v->shape[h] / G, v->strides[h] = s * G;
    v->shape[h + 1] = G, v->strides[h + 1] = s;
  }
  v->ndim = nd + 1;
}

/* Splits the q-like views qv[0..nq) and k-like views kv[0..nk) for q and
 * k's group size; returns G, or 0 (views left alone) when the split does
 * not fit. */
static inline int64_t nb_attn_group_views(const nb_kview *q, const nb_kview *k, nb_kview *qv,
                                          int nq, nb_kview *kv, int nk) {
  int64_t G = nb_attn_group_of(q, k);
  for (int i = 0; i < nq && G; i++) nb_attn_group_split(&qv[i], G, 0);
  for (int i = 0; i < nk && G; i++) nb_attn_group_split(&kv[i], G, 1);
  return G;
}

#endif /* NB_ATTN_GROUP_H */
