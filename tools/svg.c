/* The loss curve as a standalone SVG: raw per-step training loss (faint),
 * its exponential moving average (solid) and held-out losses (dots). The y
 * axis is logarithmic when the loss spans more than a decade, which is the
 * usual case for cross-entropy. */
#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "tool.h"

#define SVG_W 720.0
#define SVG_H 420.0
#define SVG_L 70.0 /* plot margins */
#define SVG_R 20.0
#define SVG_T 40.0
#define SVG_B 50.0

typedef struct {
  double x0, x1, y0, y1; /* data ranges (y in plotted units) */
  int logy;
} svg_axes;

static double svg_yval(const svg_axes *a, double v) { return a->logy ? log10(v) : v; }

static double svg_px(const svg_axes *a, double x) {
  return SVG_L + (x - a->x0) / (a->x1 - a->x0) * (SVG_W - SVG_L - SVG_R);
}

static double svg_py(const svg_axes *a, double v) {
  double y = svg_yval(a, v);
  return SVG_H - SVG_B - (y - a->y0) / (a->y1 - a->y0) * (SVG_H - SVG_T - SVG_B);
}

static int svg_finite_pos(double v) { return isfinite(v) && v > 0; }

/* Data ranges over every finite value shown. */
static svg_axes svg_fit(const float *loss, int64_t n, const float *ev, int n_eval) {
  double lo = INFINITY, hi = -INFINITY;
  int all_pos = 1;
  for (int64_t i = 0; i < n + n_eval; i++) {
    double v = i < n ? loss[i] : ev[i - n];
    if (!isfinite(v)) continue;
    lo = fmin(lo, v);
    hi = fmax(hi, v);
    all_pos = all_pos && v > 0;
  }
  if (!isfinite(lo)) lo = 0, hi = 1;
  svg_axes a = {0, n > 0 ? (double)n : 1, 0, 1, all_pos && hi / lo > 10};
  a.y0 = a.logy ? floor(log10(lo)) : lo;
  a.y1 = a.logy ? ceil(log10(hi)) : hi;
  if (a.y1 - a.y0 < 1e-12) a.y0 -= 0.5, a.y1 += 0.5;
  return a;
}

/* Horizontal grid lines with labels: one per decade on a log axis (when
 * that gives at most ten), else five even steps. */
static void svg_grid_y(FILE *f, const svg_axes *a) {
  int decades = (int)(a->y1 - a->y0), per_decade = a->logy && decades <= 10;
  int n = per_decade ? decades : 5;
  for (int i = 0; i <= n; i++) {
    double y = a->y0 + (a->y1 - a->y0) * i / n, v = a->logy ? pow(10, y) : y;
    double py = svg_py(a, v);
    fprintf(f, "<line x1='%g' y1='%.1f' x2='%g' y2='%.1f' stroke='#eee'/>\n", SVG_L, py,
            SVG_W - SVG_R, py);
    fprintf(f, "<text x='%g' y='%.1f' text-anchor='end' font-size='11'>%.3g</text>\n",
            SVG_L - 6, py + 4, v);
  }
}

static void svg_grid(FILE *f, const svg_axes *a) {
  fprintf(f, "<rect x='%g' y='%g' width='%g' height='%g' fill='none' stroke='#888'/>\n", SVG_L,
          SVG_T, SVG_W - SVG_L - SVG_R, SVG_H - SVG_T - SVG_B);
  svg_grid_y(f, a);
  for (int i = 0; i <= 5; i++) {
    double x = a->x0 + (a->x1 - a->x0) * i / 5.0;
    fprintf(f, "<text x='%.1f' y='%g' text-anchor='middle' font-size='11'>%.0f</text>\n",
            svg_px(a, x), SVG_H - SVG_B + 16, x);
  }
  fprintf(f, "<text x='%g' y='%g' text-anchor='middle' font-size='12'>step</text>\n",
          (SVG_L + SVG_W - SVG_R) / 2, SVG_H - 12);
  fprintf(f, "<text x='16' y='%g' font-size='12' transform='rotate(-90 16 %g)' "
             "text-anchor='middle'>loss%s</text>\n",
          (SVG_T + SVG_H - SVG_B) / 2, (SVG_T + SVG_H - SVG_B) / 2, a->logy ? " (log)" : "");
}

/* A polyline through the finite points of v (smoothed when alpha < 1). */
static void svg_line(FILE *f, const svg_axes *a, const float *v, int64_t n, double alpha,
                     const char *style) {
  fprintf(f, "<polyline fill='none' %s points='", style);
  double ema = NAN;
  for (int64_t i = 0; i < n; i++) {
    if (!svg_finite_pos(v[i]) && (a->logy || !isfinite(v[i]))) continue;
    ema = isnan(ema) ? v[i] : alpha * v[i] + (1 - alpha) * ema;
    fprintf(f, "%.1f,%.1f ", svg_px(a, (double)(i + 1)), svg_py(a, ema)); /* after step i+1 */
  }
  fprintf(f, "'/>\n");
}

int tool_svg_loss(const char *path, const char *title, const float *train_loss,
                  int64_t n_steps, const int64_t *eval_step, const float *eval_loss,
                  int n_eval) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  svg_axes a = svg_fit(train_loss, n_steps, eval_loss, n_eval);
  fprintf(f, "<?xml version='1.0' encoding='UTF-8'?>\n"
             "<svg xmlns='http://www.w3.org/2000/svg' width='%g' height='%g' "
             "font-family='sans-serif'>\n<rect width='100%%' height='100%%' fill='white'/>\n",
          SVG_W, SVG_H);
  fprintf(f, "<text x='%g' y='24' text-anchor='middle' font-size='14'>", SVG_W / 2);
  for (const char *c = title; *c; c++) { /* escape the title for XML */
    if (*c == '<') fputs("&lt;", f);
    else if (*c == '>') fputs("&gt;", f);
    else if (*c == '&') fputs("&amp;", f);
    else fputc(*c, f);
  }
  fprintf(f, "</text>\n");
  svg_grid(f, &a);
  svg_line(f, &a, train_loss, n_steps, 1.0, "stroke='#9ecae1' stroke-width='1'");
  svg_line(f, &a, train_loss, n_steps, n_steps > 50 ? 20.0 / n_steps : 1.0,
           "stroke='#08519c' stroke-width='2'");
  for (int i = 0; i < n_eval; i++)
    if (isfinite(eval_loss[i]) && (!a.logy || eval_loss[i] > 0))
      fprintf(f, "<circle cx='%.1f' cy='%.1f' r='3.5' fill='#e6550d'/>\n",
              svg_px(&a, (double)eval_step[i]), svg_py(&a, eval_loss[i]));
  fprintf(f, "<text x='%g' y='%g' font-size='11' fill='#08519c'>train (smoothed)</text>\n",
          SVG_W - SVG_R - 200, SVG_T + 16);
  if (n_eval > 0)
    fprintf(f, "<text x='%g' y='%g' font-size='11' fill='#e6550d'>held-out</text>\n",
            SVG_W - SVG_R - 80, SVG_T + 16);
  fprintf(f, "</svg>\n");
  int err = ferror(f);
  if (fclose(f) != 0 || err) {
    if (!errno) errno = EIO;
    return -1;
  }
  return 0;
}
