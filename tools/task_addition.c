/* The built-in task: multi-digit addition written as text, generated in code.
 * The operand pairs are split once and for all by a hash into training pairs
 * and held-out pairs, so held-out accuracy measures generalisation, not
 * memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "task.h"
#include "tool.h"

void task_add_init(task_add *t, int digits) {
  t->digits = digits;
  t->prompt_len = 2 * digits + 2;
  t->answer_len = digits + 1;
  t->context = t->prompt_len + t->answer_len - 1;
}

static uint64_t task_add_pow10(int n) {
  uint64_t p = 1;
  while (n-- > 0) p *= 10;
  return p;
}

/* One in ten pairs is held out, by a mixing hash of (a, b). */
static int task_add_is_held_out(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z % 10 == 0;
}

/* Draws a pair from the requested side of the split. */
static void task_add_pair(const task_add *t, nb_rng *rng, int held_out, uint64_t *a,
                          uint64_t *b) {
  uint64_t n = task_add_pow10(t->digits);
  do {
    *a = tool_rand_below(rng, n);
    *b = tool_rand_below(rng, n);
  } while (task_add_is_held_out(*a, *b) != held_out);
}

/* Writes the full token sequence (prompt and reversed answer) of a + b. */
static void task_add_tokens(const task_add *t, uint64_t a, uint64_t b, int64_t *seq) {
  int d = t->digits;
  uint64_t s = a + b;
  for (int i = d - 1; i >= 0; i--, a /= 10) seq[i] = (int64_t)(a % 10);
  seq[d] = TASK_ADD_PLUS;
  for (int i = 2 * d; i > d; i--, b /= 10) seq[i] = (int64_t)(b % 10);
  seq[2 * d + 1] = TASK_ADD_EQ;
  for (int i = 0; i < t->answer_len; i++, s /= 10) seq[t->prompt_len + i] = (int64_t)(s % 10);
}

void task_add_batch(const task_add *t, nb_rng *rng, int B, int held_out, int64_t *x,
                    int64_t *y) {
  int T = t->context;
  int64_t seq[64];
  for (int r = 0; r < B; r++) {
    uint64_t a, b;
    task_add_pair(t, rng, held_out, &a, &b);
    task_add_tokens(t, a, b, seq);
    for (int i = 0; i < T; i++) {
      x[(int64_t)r * T + i] = seq[i];
      /* Position i predicts token i+1; only answer tokens are scored. */
      y[(int64_t)r * T + i] = i + 1 >= t->prompt_len ? seq[i + 1] : -1;
    }
  }
}

/* Extends each of the B rows of seq (stride row) from length len by one
 * greedy token. Returns 0, or -1 on a library error. */
static int task_add_greedy_step(const gpt_model *m, int64_t *seq, int B, int row, int len,
                                int64_t *tmp, int64_t *next) {
  for (int r = 0; r < B; r++) memcpy(tmp + (int64_t)r * len, seq + (int64_t)r * row,
                                     (size_t)len * sizeof *tmp);
  nb_scope_begin();
  nb_tensor *idx = nb_from_buffer(tmp, 2, (int64_t[]){B, len}, NB_I64, m->device);
  nb_tensor *logits = gpt_forward(m, idx);                 /* (B,len,V) */
  nb_tensor *best = nb_argmax(nb_select(logits, 1, len - 1), 1, 0); /* (B) */
  nb_status st = best ? nb_to_host(best, next, (size_t)B * sizeof *next) : NB_ERR_NULL;
  nb_scope_end();
  if (st != NB_OK) return -1;
  for (int r = 0; r < B; r++) seq[(int64_t)r * row + len] = next[r];
  return 0;
}

static void task_add_print(const task_add *t, const int64_t *seq, const int64_t *want) {
  static const char sym[] = "0123456789+=";
  char buf[80];
  int k = 0, ok = 1;
  for (int i = 0; i < t->prompt_len; i++) buf[k++] = sym[seq[i]];
  /* Print the model's answer most significant digit first, as people read. */
  for (int i = t->answer_len - 1; i >= 0; i--) {
    int64_t tok = seq[t->prompt_len + i];
    buf[k++] = tok >= 0 && tok < TASK_ADD_VOCAB ? sym[tok] : '?';
    ok = ok && tok == want[t->prompt_len + i];
  }
  buf[k] = 0;
  printf("  %s  %s\n", buf, ok ? "correct" : "wrong");
}

double task_add_accuracy(const task_add *t, const gpt_model *m, nb_rng *rng, int n, int show) {
  enum { CHUNK = 500 };
  int row = t->prompt_len + t->answer_len;
  int64_t *want = malloc(sizeof *want * CHUNK * row), *seq = malloc(sizeof *seq * CHUNK * row);
  int64_t *tmp = malloc(sizeof *tmp * CHUNK * row), *next = malloc(sizeof *next * CHUNK);
  int correct = 0, failed = !want || !seq || !tmp || !next;
  nb_no_grad_begin();
  for (int done = 0; done < n && !failed; done += CHUNK) {
    int B = n - done < CHUNK ? n - done : CHUNK;
    for (int r = 0; r < B; r++) {
      uint64_t a, b;
      task_add_pair(t, rng, 1, &a, &b);
      task_add_tokens(t, a, b, want + (int64_t)r * row);
    }
    memcpy(seq, want, sizeof *seq * (size_t)B * row);
    for (int i = 0; i < t->answer_len && !failed; i++)
      failed = task_add_greedy_step(m, seq, B, row, t->prompt_len + i, tmp, next) != 0;
    for (int r = 0; r < B && !failed; r++) {
      const int64_t *got = seq + (int64_t)r * row, *ref = want + (int64_t)r * row;
      correct += !memcmp(got + t->prompt_len, ref + t->prompt_len,
                         sizeof *got * t->answer_len);
      if (done == 0 && r < show) task_add_print(t, got, ref);
    }
  }
  nb_no_grad_end();
  free(want);
  free(seq);
  free(tmp);
  free(next);
  return failed ? -1.0 : (double)correct / n;
}
