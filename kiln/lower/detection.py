"""Native lowerings of NonMaxSuppression and ImageDecoder (kiln.ops.detection): hand-written
C kernels in kiln/codegen/c_src, nms.c (instantiated per element type) and image_decoder.c
(linked against libjpeg and libpng), called with the node's sizes baked in.
"""

from __future__ import annotations

import numpy as np

from kiln.codegen.csource import c_instance, c_source
from kiln.dtypes import DType
from kiln.ops.detection import _FORMATS
from kiln.lower.context import lowering


# ---- native lowering ----

@lowering("NonMaxSuppression")
def _nms_lower(ctx, boxes, scores, *rest):
    """The kernel kiln/codegen/c_src/nms.c (its comment says how), instantiated for the
    boxes' type and called with this node's sizes and thresholds."""
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
    fn = f"kiln_nms_{bt.dtype.name}"
    preamble = c_instance("nms.c", {"KILN_NMS_T": t, "KILN_NMS_FN": fn}, fn.upper())
    limit = f"(int64_t){p['max_output']}[0]" if "max_output" in p else "0"
    iou = f"{p['iou']}[0]" if "iou" in p else "0"
    score = f"(double){p['score']}[0]" if "score" in p else "0.0"
    center = int(bool(ctx.attr("center_point_box", 0)))
    body = f"""  int64_t count = 0;
  const int32_t rc = {fn}(in0, in1, {nb}, {nc}, {n}, {limit}, {iou}, {int("score" in p)}, {score}, {center},
                          {cap[0]}, out0, &count);
  if (rc) return rc;
{"  out1[0] = count; out1[1] = 3;" if dynamic else f"  if (count != {cap[0]}) KILN_FAIL(2, count);"}
  return 0;"""
    errors = {1: "iou_threshold must be in [0, 1]",
              2: f"{{value}} boxes selected, the output was planned for {cap[0]}"}
    return ctx.extern(body, [boxes, scores, *rest], [(cap, DType.int64)], dynamic=dynamic, errors=errors,
                      preamble=preamble)


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
