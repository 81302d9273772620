/* RoiAlign (ONNX), the kernel behind kiln.lower.image's lowering. Instantiated once per
   type combination: define KILN_ROI_X (the image's and output's C type), KILN_ROI_R (the
   rois'), KILN_ROI_I (batch_indices') and KILN_ROI_FN (the function's name) before this
   file. Always inlined: each call site's literal sizes become constants again.

   x [nb, c, h, w], rois [nr, 4] (x0, y0, x1, y1), out [nr, c, ph, pw]. Each bin averages
   (avg) or takes the largest (max) of bilinear samples on a grid of `ratio` per side, or
   ceil(roi side / bins) when ratio is 0, computed in double. Returns 0, or KILN_FAIL
   1 (a batch index out of range, reporting it) or 2 (a roi too large or not finite for a
   grid of at most grid_max samples per side, reporting the roi). */
__attribute__((always_inline)) static inline int32_t KILN_ROI_FN(
    const KILN_ROI_X* x, const KILN_ROI_R* rois, const KILN_ROI_I* batch, KILN_ROI_X* out,
    int64_t nr, int64_t nb, int64_t c, int64_t h, int64_t w, int64_t ph, int64_t pw,
    int64_t ratio, int64_t grid_max, double scale, double off, int avg) {
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t b = (int64_t)batch[r];
    if (b < 0 || b >= nb) KILN_FAIL(1, b);
    const double x0 = (double)rois[r * 4 + 0] * scale - off, y0 = (double)rois[r * 4 + 1] * scale - off;
    const double x1 = (double)rois[r * 4 + 2] * scale - off, y1 = (double)rois[r * 4 + 3] * scale - off;
    double rw = x1 - x0, rh = y1 - y0;
    if (off == 0.0) { if (rw < 1.0) rw = 1.0; if (rh < 1.0) rh = 1.0; }  /* output_half_pixel */
    /* the sampling grid per bin, from run-time coordinates: bounded before any cast (a NaN
       or huge roi would cast to garbage, or loop for ever) */
    const double ghd = ratio > 0 ? ratio : ceil(rh / ph), gwd = ratio > 0 ? ratio : ceil(rw / pw);
    if (!(ghd <= grid_max && gwd <= grid_max)) KILN_FAIL(2, r);
    const int64_t gh = ghd > 0 ? (int64_t)ghd : 0, gw = gwd > 0 ? (int64_t)gwd : 0;
    const double cnt = gh * gw > 1 ? (double)(gh * gw) : 1.0;
    for (int64_t ch = 0; ch < c; ++ch) {
      const KILN_ROI_X* img = x + (b * c + ch) * (h * w);
      for (int64_t i = 0; i < ph; ++i) for (int64_t j = 0; j < pw; ++j) {
        double acc = avg ? 0.0 : -INFINITY;
        for (int64_t iy = 0; iy < gh; ++iy) {
          double py = y0 + (i + (iy + 0.5) / gh) * (rh / ph);
          const double vy = (py >= -1.0 && py <= h) ? 1.0 : 0.0;
          if (!(py >= 0)) py = 0; else if (py > h) py = h;  /* NaN too: no cast overflow */
          int64_t ylo = (int64_t)floor(py), yhi; double fy;
          if (ylo >= h - 1) { ylo = yhi = h - 1; fy = 0.0; } else { yhi = ylo + 1; fy = py - ylo; }
          const double wyl = (1 - fy) * vy, wyh = fy * vy;
          for (int64_t ix = 0; ix < gw; ++ix) {
            double px = x0 + (j + (ix + 0.5) / gw) * (rw / pw);
            const double vx = (px >= -1.0 && px <= w) ? 1.0 : 0.0;
            if (!(px >= 0)) px = 0; else if (px > w) px = w;
            int64_t xlo = (int64_t)floor(px), xhi; double fx;
            if (xlo >= w - 1) { xlo = xhi = w - 1; fx = 0.0; } else { xhi = xlo + 1; fx = px - xlo; }
            const double wxl = (1 - fx) * vx, wxh = fx * vx;
            const double t00 = (double)img[ylo * w + xlo] * (wyl * wxl);
            const double t01 = (double)img[ylo * w + xhi] * (wyl * wxh);
            const double t10 = (double)img[yhi * w + xlo] * (wyh * wxl);
            const double t11 = (double)img[yhi * w + xhi] * (wyh * wxh);
            if (avg) {
              acc += ((t00 + t01) + t10) + t11;
            } else {
              double m = fmax(fmax(t00, t01), fmax(t10, t11)); if (m > acc) acc = m;
            }
          }
        }
        out[((r * c + ch) * ph + i) * pw + j] = (KILN_ROI_X)(avg ? acc / cnt : (gh * gw > 0 ? acc : 0.0));
      }
    }
  }
  return 0;
}
