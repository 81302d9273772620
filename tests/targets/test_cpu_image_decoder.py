"""ImageDecoder's native kernel (libjpeg, libpng, and its own BMP/PNM/TIFF readers) on
target="cpu": images encoded here by hand are compared with the interpreter's reference
in every pixel format; JPEG with the Pillow-decoded pixels ONNX ships."""

import struct
import zlib

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from kiln.codegen.build import require_c_library

FORMATS = ("RGB", "BGR", "Grayscale")
RNG = np.random.default_rng(5)


def _decoder(fmt, n):
    node = helper.make_node("ImageDecoder", ["x"], ["y"], pixel_format=fmt)
    g = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [n])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])


def _decode(data: bytes, fmt: str, target: str) -> np.ndarray:
    x = np.frombuffer(data, np.uint8)
    return kiln.compile(_decoder(fmt, x.size), target=target).run({"x": x})["y"]


def _png(img, color):  # filter 0 rows, one IDAT
    h, w, c = img.shape
    rows = b"".join(b"\0" + img[y].tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _bmp24(img, top_down=False):
    h, w, _ = img.shape
    stride = (w * 3 + 3) & ~3
    rows = [np.pad(img[y, :, ::-1].reshape(-1), (0, stride - w * 3)).tobytes() for y in range(h)]
    pixels = b"".join(rows if top_down else rows[::-1])
    info = struct.pack("<IiiHHIIiiII", 40, w, -h if top_down else h, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 54 + len(pixels), 0, 0, 54) + info + pixels


def _bmp8(idx, palette):
    h, w = idx.shape
    stride = (w + 3) & ~3
    pixels = b"".join(np.pad(idx[y], (0, stride - w)).astype(np.uint8).tobytes() for y in range(h))[::1]
    pal = np.concatenate([palette[:, ::-1], np.zeros((256, 1), np.uint8)], axis=1).tobytes()
    info = struct.pack("<IiiHHIIiiII", 40, w, -h, 1, 8, 0, len(pixels), 0, 0, 256, 0)
    off = 54 + len(pal)
    return b"BM" + struct.pack("<IHHI", off + len(pixels), 0, 0, off) + info + pal + pixels


def _pnm(img, maxval=255):
    h, w, c = img.shape
    return f"P{6 if c == 3 else 5}\n# made by a test\n{w} {h}\n{maxval}\n".encode() + img.tobytes()


def _tiff(img, big_endian=False):
    h, w, c = img.shape
    e = ">" if big_endian else "<"
    half = h // 2 * w * c
    data = img.tobytes()
    strips = [(8, half), (8 + half, len(data) - half)]
    entries = [(256, 3, 1, w), (257, 3, 1, h), (258, 3, 1, 8), (259, 3, 1, 1), (277, 3, 1, c), (284, 3, 1, 1)]
    ifd = 8 + len(data)
    arrays = ifd + 2 + 12 * 8 + 4
    body = b"".join(struct.pack(e + "HHIHH", t, ty, n, v, 0) if ty == 3 else b"" for t, ty, n, v in entries)
    body += struct.pack(e + "HHII", 273, 4, 2, arrays) + struct.pack(e + "HHII", 279, 4, 2, arrays + 8)
    tail = struct.pack(e + "II", *[o for o, _ in strips]) + struct.pack(e + "II", *[n for _, n in strips])
    head = (b"MM\0*" if big_endian else b"II*\0") + struct.pack(e + "I", ifd)
    return head + data + struct.pack(e + "H", 8) + body + struct.pack(e + "I", 0) + tail


def _img(h, w, c):
    return RNG.integers(0, 256, (h, w, c), dtype=np.uint8)


CASES = {
    "png-rgba": _png(_img(9, 7, 4), 6),
    "png-gray": _png(_img(5, 11, 1), 0),
    "bmp-24-bottom-up": _bmp24(_img(6, 5, 3)),
    "bmp-24-top-down": _bmp24(_img(3, 9, 3), top_down=True),
    "bmp-8-palette": _bmp8(RNG.integers(0, 256, (4, 6)), _img(256, 1, 3)[:, 0]),
    "pnm-p6": _pnm(_img(4, 5, 3)),
    "pnm-p5-maxval": _pnm(RNG.integers(0, 101, (6, 3, 1), dtype=np.uint8), maxval=100),
    "tiff-le-rgb": _tiff(_img(6, 4, 3)),
    "tiff-be-gray": _tiff(_img(5, 3, 1), big_endian=True),
}


# every reader in RGB; the pixel-format conversion (shared) from colour and grey sources
PAIRS = [(name, "RGB") for name in CASES] + [("png-rgba", "BGR"), ("png-rgba", "Grayscale"),
                                             ("png-gray", "Grayscale"), ("tiff-le-rgb", "BGR")]


@pytest.mark.parametrize("name, fmt", PAIRS)
def test_decoded_like_the_reference(name, fmt):
    got, want = _decode(CASES[name], fmt, "cpu"), _decode(CASES[name], fmt, "interpreter")
    assert got.shape == want.shape and got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_jpeg_decoded_with_libjpeg_as_pillow_does(fmt):
    from onnx.backend.test.case.node import _image_decoder_data as frozen
    case = getattr(frozen, f"image_decoder_decode_jpeg_{fmt.lower()}")
    got = _decode(case.data.tobytes(), fmt, "cpu")
    assert got.shape == case.output.shape
    np.testing.assert_allclose(got, case.output, atol=0)


@pytest.mark.parametrize("data, message", [
    (b"RIFF\x10\0\0\0WEBPVP8 ", "does not read"),                       # WebP: no library here
    (_pnm(_img(4, 4, 3))[:-5], "corrupt"),                              # truncated pixels
    (_png(_img(4, 4, 3), 2)[:40], "corrupt"),                           # truncated PNG
    (b"\xff\xd8\xff\xe0" + bytes(30), "corrupt"),                       # not really a JPEG
])
def test_undecodable_input_is_a_clear_error(data, message):
    with pytest.raises(kiln.KilnError, match=message):
        _decode(data, "RGB", "cpu")


def test_a_missing_c_library_names_the_package_to_install():
    with pytest.raises(kiln.KilnError, match="apt-get install libkiln-nonexistent-dev"):
        require_c_library("kilnnonexistent", "kiln_nonexistent.h", "libkiln-nonexistent-dev")
