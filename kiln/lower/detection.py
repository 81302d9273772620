"""Native lowerings of NonMaxSuppression and ImageDecoder (kiln.ops.detection): hand-written
C kernels; ImageDecoder's is kiln/codegen/c_src/image_decoder.c, linked against libjpeg and libpng.
"""

from __future__ import annotations

import numpy as np

from kiln.codegen.csource import c_source
from kiln.dtypes import DType
from kiln.ops.detection import _FORMATS
from kiln.ops.registry import lowering


# ---- native lowering ----

@lowering("NonMaxSuppression")
def _nms_lower(ctx, boxes, scores, *rest):
    """Per (batch, class): candidates over the score threshold, merge-sorted by descending
    score (ties keep box order, NaN last), then the reference's greedy loop. The float
    products that the reference rounds (areas, intersection) go through volatiles, so
    the C compiler cannot fuse them into FMAs and move an IoU across the threshold."""
    bt, st = ctx.input_types[0], ctx.input_types[1]
    t = bt.dtype.c
    if t is None or not bt.dtype.is_float or st.dtype != bt.dtype:
        ctx.fail(f"boxes/scores of type {bt.dtype}/{st.dtype} have no native kernel", stage="lower")
    nb, n, _ = bt.shape
    nc = st.shape[1]
    if tuple(st.shape) != (nb, nc, n) or bt.shape[2] != 4:
        ctx.fail(f"boxes {bt.shape} and scores {st.shape} do not match [B, N, 4] / [B, C, N]")
    names = ["boxes", "scores", "max_output", "iou", "score"]
    p, k = {}, 0
    for i, name in enumerate(names):
        if ctx.has_input(i):
            p[name], k = f"in{k}", k + 1
    limit_known = None
    if "max_output" in p:
        v = ctx.value(2)
        limit_known = None if v is None else int(np.ravel(v)[0])
    else:
        limit_known = 0
    per = n if limit_known is None else max(0, min(limit_known, n))
    dynamic = ctx.dynamic()
    cap = (max(nb * nc * per, 1), 3) if dynamic else tuple(ctx.out_shape())
    center = bool(ctx.attr("center_point_box", 0))
    if center:
        corners = ["yc - h / (T)2", "xc - w / (T)2", "yc + h / (T)2", "xc + w / (T)2"]
        load = "const T xc = bx[0], yc = bx[1], w = bx[2], h = bx[3];"
    else:
        corners = ["KMIN(bx[0], bx[2])", "KMIN(bx[1], bx[3])", "KMAX(bx[0], bx[2])", "KMAX(bx[1], bx[3])"]
        load = ""
    body = f"""#define T {t}
#define KMIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define KMAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define BEFORE(p, q) (s[p] > s[q] || (s[q] != s[q] && s[p] == s[p]))
  const int64_t limit = {f"(int64_t){p['max_output']}[0]" if "max_output" in p else "0"};
  const T iou_t = {f"{p['iou']}[0]" if "iou" in p else "(T)0"};
  if (!(iou_t >= (T)0 && iou_t <= (T)1)) return 1;
  int64_t count = 0;
  if (limit > 0 && {nb * nc * n} > 0) {{
    T* cor = (T*)malloc(sizeof(T) * {nb * n * 4} + sizeof(T) * {nb * n});
    int64_t* idx = (int64_t*)malloc(sizeof(int64_t) * {3 * n});
    if (!cor || !idx) {{ free(cor); free(idx); return -1; }}
    T* area = cor + {nb * n * 4};
    for (int64_t q = 0; q < {nb * n}; ++q) {{
      const T* bx = in0 + q * 4;
      {load}
      volatile T c0 = {corners[0]}, c1 = {corners[1]}, c2 = {corners[2]}, c3 = {corners[3]};
      cor[4 * q] = c0; cor[4 * q + 1] = c1; cor[4 * q + 2] = c2; cor[4 * q + 3] = c3;
      volatile T a = (T)(cor[4 * q + 2] - cor[4 * q]) * (T)(cor[4 * q + 3] - cor[4 * q + 1]);
      area[q] = a;
    }}
    int64_t *cur = idx, *nxt = idx + {n}, *kept = idx + {2 * n};
    for (int64_t bc = 0; bc < {nb * nc}; ++bc) {{
      const int64_t b = bc / {nc};
      const T* s = in1 + bc * {n};
      int64_t m = 0;
      for (int64_t i = 0; i < {n}; ++i)
        if ({f"s[i] > {p['score']}[0]" if "score" in p else "1"}) cur[m++] = i;
      for (int64_t span = 1; span < m; span *= 2) {{
        for (int64_t lo = 0; lo < m; lo += 2 * span) {{
          const int64_t mid = lo + span < m ? lo + span : m, hi = lo + 2 * span < m ? lo + 2 * span : m;
          int64_t i = lo, j = mid, o = lo;
          while (i < mid && j < hi) nxt[o++] = BEFORE(cur[j], cur[i]) ? cur[j++] : cur[i++];
          while (i < mid) nxt[o++] = cur[i++];
          while (j < hi) nxt[o++] = cur[j++];
        }}
        int64_t* tmp = cur; cur = nxt; nxt = tmp;
      }}
      int64_t nk = 0;
      for (int64_t r = 0; r < m && nk < limit; ++r) {{
        const int64_t i = cur[r];
        const T* bi = cor + (b * {n} + i) * 4;
        const T ai = area[b * {n} + i];
        int keep = 1;
        for (int64_t e = 0; e < nk && keep; ++e) {{
          const T* bk = cor + (b * {n} + kept[e]) * 4;
          const T ak = area[b * {n} + kept[e]];
          T d0 = (T)(KMIN(bi[2], bk[2]) - KMAX(bi[0], bk[0])), d1 = (T)(KMIN(bi[3], bk[3]) - KMAX(bi[1], bk[1]));
          d0 = d0 < (T)0 ? (T)0 : d0;
          d1 = d1 < (T)0 ? (T)0 : d1;
          volatile T inter = d0 * d1;
          volatile T uni = (T)(ai + ak) - inter;
          const T iou = (ai > (T)0 && ak > (T)0 && uni > (T)0) ? (T)(inter / uni) : (T)0;
          if (iou > iou_t) keep = 0;
        }}
        if (!keep) continue;
        if (count >= {cap[0]}) {{ free(cor); free(idx); KILN_FAIL(2, count + 1); }}  /* capacity */
        kept[nk++] = i;
        out0[3 * count] = b; out0[3 * count + 1] = bc % {nc}; out0[3 * count + 2] = i;
        ++count;
      }}
    }}
    free(cor); free(idx);
  }}
{"  out1[0] = count; out1[1] = 3;" if dynamic else f"  if (count != {cap[0]}) KILN_FAIL(2, count);"}
  return 0;
#undef T
#undef KMIN
#undef KMAX
#undef BEFORE"""
    errors = {1: "iou_threshold must be in [0, 1]",
              2: f"{{value}} boxes selected, the output was planned for {cap[0]}"}
    return ctx.extern(body, [boxes, scores, *rest], [(cap, DType.int64)], dynamic=dynamic, errors=errors)


# ImageDecoder's capacity: the decoded size is known only once the header is read, so the
# kernel gets a buffer this large (untouched pages cost nothing) and fails beyond it.
IMAGE_DECODER_MAX_BYTES = 1 << 28
_IMAGE_LIBS = (("jpeg", "jpeglib.h", "libjpeg62-turbo-dev (or libjpeg-dev)"), ("png", "png.h", "libpng-dev"))


@lowering("ImageDecoder")
def _image_decoder_lower(ctx, stream):
    """An explicit C kernel on well-kept decoding libraries: JPEG with libjpeg(-turbo), PNG
    with libpng; BMP, PNM and uncompressed TIFF by small readers of its own. WebP, JPEG 2000
    and compressed TIFF fail at run time (status 2). Only modules holding it link the two
    libraries; a machine without them gets an error naming the package to install."""
    fmt = _FORMATS.index(ctx.attr("pixel_format", "RGB"))
    channels = 1 if fmt == 2 else 3
    preamble = c_source("image_decoder.c")
    n = int(stream.shape[0])
    body = f"  return kiln_image_decode(in0, {n}, {fmt}, out0, {IMAGE_DECODER_MAX_BYTES}, out1);"
    errors = {2: "the encoded image is in a format the native ImageDecoder does not read (it reads "
                 "JPEG with libjpeg, PNG with libpng, BMP, PNM (P5/P6) and uncompressed TIFF; not "
                 "WebP, JPEG 2000 or compressed TIFF)",
              3: "the encoded image is corrupt or a variant the native ImageDecoder does not read",
              4: f"the decoded image is larger than the native ImageDecoder's {IMAGE_DECODER_MAX_BYTES} "
                 "bytes"}
    cap = (IMAGE_DECODER_MAX_BYTES // channels, 1, channels)
    return ctx.extern(body, [stream], [(cap, DType.uint8)], dynamic=True, preamble=preamble,
                      libs=_IMAGE_LIBS, errors=errors)
