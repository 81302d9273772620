"""Detection and image-input operators: NonMaxSuppression and ImageDecoder.

ImageDecoder's reference decodes with the standard library only (zlib for PNG): PNG,
BMP, PNM and uncompressed TIFF. Lossy codecs (JPEG, WebP, JPEG 2000) would need an
image library, which kiln's Python side does not depend on; they fail with a clear
error. Its native kernel (kiln/codegen/c_src/image_decoder.c) reads those formats too, and JPEG
through libjpeg and PNG through libpng, the two C libraries it links (kiln.lower.detection).
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.registry import OPAQUE, op


# ---- NonMaxSuppression ----

def _infer_nms(ctx):
    boxes, scores = ctx.tensor(0), ctx.tensor(1)
    if ctx.attr("center_point_box", 0) not in (0, 1):
        ctx.fail(f"center_point_box must be 0 or 1, got {ctx.attr('center_point_box')}")
    if boxes.rank not in (None, 3) or scores.rank not in (None, 3):
        ctx.fail(f"boxes must be [batch, boxes, 4] and scores [batch, classes, boxes], got {boxes}, {scores}")
    if boxes.shape is not None and isinstance(boxes.shape[2], int) and boxes.shape[2] != 4:
        ctx.fail(f"boxes' last dim must be 4, got {boxes.shape[2]}")
    if boxes.shape and scores.shape:
        for what, a, b in (("batch", boxes.shape[0], scores.shape[0]), ("box count", boxes.shape[1], scores.shape[2])):
            if isinstance(a, int) and isinstance(b, int) and a != b:
                ctx.fail(f"boxes and scores disagree on the {what}: {a} vs {b}")
    return [TensorType(DType.int64, (ctx.new_dim(), 3))]


def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """[..., 4] boxes as (ymin, xmin, ymax, xmax), whatever corner order or center form they use."""
    if center:
        xc, yc, w, h = np.moveaxis(boxes, -1, 0)
        return np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)
    y1, x1, y2, x2 = np.moveaxis(boxes, -1, 0)
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)], axis=-1)


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one corner box with many; degenerate (zero-area) boxes overlap nothing."""
    lo, hi = np.maximum(box[:2], others[:, :2]), np.minimum(box[2:], others[:, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])  # noqa: E731
    a, b = area(box), area(others)
    union = a + b - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((a > 0) & (b > 0) & (union > 0), inter / union, 0)


@op("NonMaxSuppression", infer=_infer_nms, fusion=OPAQUE)
def non_max_suppression(ctx, boxes, scores, max_output=None, iou_threshold=None, score_threshold=None):
    """Greedy per-(batch, class) NMS: highest score first (ties keep box order);
    a box is dropped when its IoU with a kept one exceeds the threshold."""
    limit = 0 if max_output is None else int(np.ravel(max_output)[0])
    iou_t = 0.0 if iou_threshold is None else np.ravel(iou_threshold)[0]
    if not 0 <= iou_t <= 1:
        ctx.fail(f"iou_threshold must be in [0, 1], got {iou_t}")
    if boxes.shape[0] != scores.shape[0] or boxes.shape[1] != scores.shape[2] or boxes.shape[2] != 4:
        ctx.fail(f"boxes {boxes.shape} and scores {scores.shape} do not match [B, N, 4] / [B, C, N]")
    corners = _corners(boxes, bool(ctx.attr("center_point_box", 0)))
    picked = []
    for b, c in np.ndindex(scores.shape[:2]) if limit > 0 else ():
        s = scores[b, c]
        order = np.argsort(-s, kind="stable")
        if score_threshold is not None:
            order = order[s[order] > np.ravel(score_threshold)[0]]
        kept: list[int] = []
        for i in order:
            if len(kept) == limit:
                break
            if not kept or not (_iou(corners[b, i], corners[b, kept]) > iou_t).any():
                kept.append(int(i))
        picked += [(b, c, i) for i in kept]
    return np.array(picked, dtype=np.int64).reshape(-1, 3)


# ---- ImageDecoder ----

_FORMATS = ("RGB", "BGR", "Grayscale")


def _infer_image_decoder(ctx):
    t = ctx.tensor(0)
    if t.dtype != DType.uint8 or t.rank not in (None, 1):
        ctx.fail(f"encoded_stream must be a 1-D uint8 tensor, got {t}")
    fmt = ctx.attr("pixel_format", "RGB")
    if fmt not in _FORMATS:
        ctx.fail(f"pixel_format must be one of {', '.join(_FORMATS)}, got {fmt!r}")
    return [TensorType(DType.uint8, (ctx.new_dim(), ctx.new_dim(), 1 if fmt == "Grayscale" else 3))]


@op("ImageDecoder", infer=_infer_image_decoder, fusion=OPAQUE)
def image_decoder(ctx, stream):
    data = stream.tobytes()
    for magic, decode in _DECODERS:
        if data.startswith(magic):
            try:
                img = decode(data)
            except (ValueError, IndexError, KeyError, struct.error, zlib.error) as e:
                ctx.fail(f"corrupt or unsupported image data: {e}")
            break
    else:
        kind = next((name for magic, name in _LOSSY if data.startswith(magic)), "an unknown format")
        ctx.fail(f"cannot decode {kind}: kiln has no image-codec dependency; only PNG, BMP, "
                 f"PNM and uncompressed TIFF are decoded")
    return _to_pixel_format(img, ctx.attr("pixel_format", "RGB"))


def _to_pixel_format(img: np.ndarray, fmt: str) -> np.ndarray:
    """[H, W, 1|3|4] uint8 -> the requested layout (alpha is dropped)."""
    rgb = np.repeat(img, 3, axis=2) if img.shape[2] == 1 else img[..., :3]
    if fmt == "BGR":
        return np.ascontiguousarray(rgb[..., ::-1])
    if fmt == "Grayscale":
        if img.shape[2] == 1:
            return img
        # ITU-R 601-2 luma in 16-bit fixed point, rounded (what Pillow's convert("L") does)
        w = np.array([19595, 38470, 7471], dtype=np.uint32)
        return ((rgb.astype(np.uint32) @ w + 0x8000) >> 16).astype(np.uint8)[..., None]
    return np.ascontiguousarray(rgb)


def _png(data: bytes) -> np.ndarray:
    pos, chunks = 8, {}
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunks.setdefault(kind, []).append(data[pos + 8:pos + 8 + n])
        pos += 12 + n
    w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"][0])
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color]
    if interlace or depth not in (8, 16):
        raise ValueError(f"PNG with bit depth {depth} / interlace {interlace} is not supported")
    bpp = channels * depth // 8
    raw = np.frombuffer(zlib.decompress(b"".join(chunks[b"IDAT"])), np.uint8).reshape(h, 1 + w * bpp)
    out = np.zeros((h, w * bpp), np.int32)
    prev = np.zeros(w * bpp, np.int32)
    for y in range(h):  # undo the per-row filters
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f in (0, 2):
            cur = line + (prev if f == 2 else 0)
        else:
            cur = np.zeros_like(line)
            for x in range(len(line)):
                a = cur[x - bpp] if x >= bpp else 0
                c = prev[x - bpp] if x >= bpp else 0
                pred = a if f == 1 else (a + prev[x]) // 2 if f == 3 else _paeth(a, prev[x], c)
                cur[x] = (line[x] + pred) & 255
        out[y] = prev = cur & 255
    px = out.astype(np.uint8)
    if depth == 16:
        px = px.reshape(h, -1, 2)[..., 0]  # keep the high byte
    px = px.reshape(h, w, channels)
    if color == 3:
        pal = np.frombuffer(chunks[b"PLTE"][0], np.uint8).reshape(-1, 3)
        px = pal[px[..., 0]]
    elif color == 4:
        px = px[..., :1]
    return px


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def _bmp(data: bytes) -> np.ndarray:
    offset, = struct.unpack("<I", data[10:14])
    w, h, _, bits, compression = struct.unpack("<iiHHI", data[18:34])
    if compression not in (0, 3) or bits not in (8, 24, 32):
        raise ValueError(f"BMP with {bits} bits and compression {compression} is not supported")
    stride = (w * bits // 8 + 3) & ~3
    rows = np.frombuffer(data, np.uint8, stride * abs(h), offset).reshape(abs(h), stride)
    if bits == 8:
        pal = np.frombuffer(data, np.uint8, 1024, 14 + struct.unpack("<I", data[14:18])[0])
        px = pal.reshape(-1, 4)[rows[:, :w], 2::-1]
    else:
        px = rows[:, :w * bits // 8].reshape(abs(h), w, bits // 8)[..., 2::-1]  # BGR(A) -> RGB
    return px[::-1] if h > 0 else px  # positive height: rows are stored bottom-up


def _pnm(data: bytes) -> np.ndarray:
    tokens, pos = [], 2
    while len(tokens) < 3:  # width, height, maxval, skipping whitespace and comments
        while data[pos:pos + 1].isspace() or data[pos:pos + 1] == b"#":
            pos = data.index(b"\n", pos) + 1 if data[pos:pos + 1] == b"#" else pos + 1
        end = pos
        while not data[end:end + 1].isspace():
            end += 1
        tokens.append(int(data[pos:end]))
        pos = end
    w, h, maxval = tokens
    channels = 3 if data[1:2] == b"6" else 1
    if maxval > 255:
        raise ValueError("16-bit PNM is not supported")
    px = np.frombuffer(data, np.uint8, w * h * channels, pos + 1).reshape(h, w, channels)
    return px if maxval == 255 else (px.astype(np.uint32) * 255 // maxval).astype(np.uint8)


def _tiff(data: bytes) -> np.ndarray:
    e = "<" if data[:2] == b"II" else ">"
    ifd, = struct.unpack(e + "I", data[4:8])
    count, = struct.unpack(e + "H", data[ifd:ifd + 2])
    tags = {}
    for k in range(count):
        tag, typ, n, raw = struct.unpack(e + "HHI4s", data[ifd + 2 + 12 * k:ifd + 14 + 12 * k])
        fmt = {3: "H", 4: "I"}.get(typ)
        if fmt is None:
            continue
        size = struct.calcsize(fmt) * n
        blob = raw[:size] if size <= 4 else data[struct.unpack(e + "I", raw)[0]:][:size]
        tags[tag] = struct.unpack(e + fmt * n, blob)
    w, h = tags[256][0], tags[257][0]
    spp, bits = tags.get(277, (1,))[0], tags.get(258, (8,))[0]
    if tags.get(259, (1,))[0] != 1 or bits != 8 or tags.get(284, (1,))[0] != 1:
        raise ValueError("only uncompressed, 8-bit, chunky TIFF is supported")
    strips = b"".join(data[o:o + n] for o, n in zip(tags[273], tags[279]))
    return np.frombuffer(strips, np.uint8, w * h * spp).reshape(h, w, spp)


_DECODERS = ((b"\x89PNG\r\n\x1a\n", _png), (b"BM", _bmp), (b"P5", _pnm), (b"P6", _pnm),
             (b"II*\x00", _tiff), (b"MM\x00*", _tiff))
_LOSSY = ((b"\xff\xd8", "JPEG"), (b"RIFF", "WebP"), (b"\x00\x00\x00\x0cjP", "JPEG 2000"),
          (b"\xff\x4f\xff\x51", "JPEG 2000"))
