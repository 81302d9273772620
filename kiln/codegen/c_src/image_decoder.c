/* ImageDecoder's native kernel (kiln/ops/detection.py): JPEG through libjpeg(-turbo), PNG
 * through libpng, BMP, PNM (P5/P6) and uncompressed TIFF by the small readers below, which
 * read exactly what the NumPy reference reads. Then the pixel format: RGB, BGR, or
 * Grayscale by ITU-R 601-2 luma in 16-bit fixed point (what Pillow's convert("L") does).
 *
 * kiln_image_decode returns 0, or a status the lowering's `errors` explains:
 *   -1 out of memory, 2 a format not read here, 3 corrupt data or an unsupported variant,
 *   4 larger than the output buffer. Every read of the input is bounds-checked. */
#include <setjmp.h>
#include <stdio.h>
#include <jpeglib.h>
#include <png.h>

typedef struct { uint8_t* px; int64_t h, w; int c; } kiln_img;

static int kiln_img_alloc(kiln_img* im, int64_t h, int64_t w, int c) {
  if (h <= 0 || w <= 0 || h > (1 << 24) || w > (1 << 24) || h * w > ((int64_t)1 << 31)) return 3;
  im->h = h; im->w = w; im->c = c;
  im->px = (uint8_t*)malloc((size_t)(h * w * c));
  return im->px ? 0 : -1;
}

/* ---- JPEG (libjpeg) ---- */
struct kiln_jpeg_err { struct jpeg_error_mgr pub; jmp_buf jb; };
static void kiln_jpeg_exit(j_common_ptr c) { longjmp(((struct kiln_jpeg_err*)c->err)->jb, 1); }
static void kiln_jpeg_quiet(j_common_ptr c, int level) { (void)c; (void)level; }

static int kiln_decode_jpeg(const uint8_t* data, int64_t n, kiln_img* im) {
  struct jpeg_decompress_struct cinfo;
  struct kiln_jpeg_err err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = kiln_jpeg_exit;
  err.pub.emit_message = kiln_jpeg_quiet;
  if (setjmp(err.jb)) {
    jpeg_destroy_decompress(&cinfo);
    return 3;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, (const unsigned char*)data, (unsigned long)n);
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return 3;
  }
  cinfo.out_color_space = cinfo.jpeg_color_space == JCS_GRAYSCALE ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  int rc = kiln_img_alloc(im, cinfo.output_height, cinfo.output_width, cinfo.output_components);
  if (rc) {
    jpeg_destroy_decompress(&cinfo);
    return rc;
  }
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = im->px + (int64_t)cinfo.output_scanline * im->w * im->c;
    jpeg_read_scanlines(&cinfo, &row, 1);  /* errors longjmp; im->px is freed by the caller */
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return 0;
}

/* ---- PNG (libpng) ---- */
typedef struct { const uint8_t* p; size_t n, pos; } kiln_png_src;

static void kiln_png_read(png_structp png, png_bytep dst, png_size_t len) {
  kiln_png_src* s = (kiln_png_src*)png_get_io_ptr(png);
  if (len > s->n - s->pos) png_error(png, "truncated");
  memcpy(dst, s->p + s->pos, len);
  s->pos += len;
}
static void kiln_png_quiet(png_structp png, png_const_charp msg) { (void)png; (void)msg; }

static int kiln_decode_png(const uint8_t* data, int64_t n, kiln_img* im) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, kiln_png_quiet);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!info) {
    png_destroy_read_struct(&png, NULL, NULL);
    return -1;
  }
  png_bytep* volatile rows = NULL;
  if (setjmp(png_jmpbuf(png))) {
    free(rows);
    png_destroy_read_struct(&png, &info, NULL);
    return 3;
  }
  kiln_png_src src = {data, (size_t)n, 0};
  png_set_read_fn(png, &src, kiln_png_read);
  png_read_info(png, info);
  const int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
  if (depth == 16) png_set_strip_16(png);  /* the high byte, as the reference */
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  int rc = kiln_img_alloc(im, png_get_image_height(png, info), png_get_image_width(png, info),
                          png_get_channels(png, info));
  if (!rc && png_get_rowbytes(png, info) != (size_t)(im->w * im->c)) rc = 3;
  if (!rc && !(rows = (png_bytep*)malloc(sizeof(png_bytep) * (size_t)im->h))) rc = -1;
  if (rc) {
    png_destroy_read_struct(&png, &info, NULL);
    return rc;
  }
  for (int64_t y = 0; y < im->h; ++y) rows[y] = im->px + y * im->w * im->c;
  png_read_image(png, rows);
  free(rows);
  png_destroy_read_struct(&png, &info, NULL);
  return 0;
}

/* ---- BMP, PNM, TIFF: the reference's subsets ---- */
static uint32_t kiln_le(const uint8_t* p, int k) {
  uint32_t v = 0;
  for (int i = k - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
static uint32_t kiln_be(const uint8_t* p, int k) {
  uint32_t v = 0;
  for (int i = 0; i < k; ++i) v = v << 8 | p[i];
  return v;
}

static int kiln_decode_bmp(const uint8_t* d, int64_t n, kiln_img* im) {
  if (n < 54) return 3;
  const int64_t offset = kiln_le(d + 10, 4), w = (int32_t)kiln_le(d + 18, 4), h0 = (int32_t)kiln_le(d + 22, 4);
  const int bits = (int)kiln_le(d + 28, 2), comp = (int)kiln_le(d + 30, 4);
  if ((comp != 0 && comp != 3) || (bits != 8 && bits != 24 && bits != 32) || w <= 0 || h0 == 0) return 3;
  const int64_t h = h0 < 0 ? -h0 : h0, stride = (w * bits / 8 + 3) & ~(int64_t)3;
  if (offset < 0 || offset + stride * h > n) return 3;
  const uint8_t* pal = NULL;
  if (bits == 8) {
    const int64_t at = 14 + (int64_t)kiln_le(d + 14, 4);
    if (at + 1024 > n) return 3;
    pal = d + at;
  }
  int rc = kiln_img_alloc(im, h, w, 3);
  if (rc) return rc;
  for (int64_t y = 0; y < h; ++y) {
    const uint8_t* row = d + offset + stride * (h0 > 0 ? h - 1 - y : y);  /* bottom-up if h > 0 */
    for (int64_t x = 0; x < w; ++x) {
      const uint8_t* s = bits == 8 ? pal + 4 * row[x] : row + x * (bits / 8);
      uint8_t* o = im->px + (y * w + x) * 3;
      o[0] = s[2]; o[1] = s[1]; o[2] = s[0];  /* BGR(A) -> RGB */
    }
  }
  return 0;
}

static int kiln_decode_pnm(const uint8_t* d, int64_t n, kiln_img* im) {
  int64_t tok[3], pos = 2;
  for (int k = 0; k < 3; ++k) {  /* width, height, maxval, skipping whitespace and comments */
    for (;;) {
      if (pos >= n) return 3;
      if (d[pos] == '#') { while (pos < n && d[pos] != '\n') ++pos; }
      else if (d[pos] == ' ' || (d[pos] >= '\t' && d[pos] <= '\r')) ++pos;
      else break;
    }
    int64_t v = 0, digits = 0;
    while (pos < n && d[pos] >= '0' && d[pos] <= '9' && digits < 10) { v = v * 10 + (d[pos++] - '0'); ++digits; }
    if (!digits) return 3;
    tok[k] = v;
  }
  const int c = d[1] == '6' ? 3 : 1;
  const int64_t w = tok[0], h = tok[1], maxval = tok[2];
  if (maxval <= 0 || maxval > 255) return 3;
  int rc = kiln_img_alloc(im, h, w, c);
  if (rc) return rc;
  if (pos + 1 + h * w * c > n) return 3;
  for (int64_t i = 0; i < h * w * c; ++i) {
    const uint32_t v = d[pos + 1 + i];
    im->px[i] = (uint8_t)(maxval == 255 ? v : v * 255 / (uint32_t)maxval);
  }
  return 0;
}

typedef struct { const uint8_t* d; int64_t n; int big; } kiln_tiff;

static uint32_t kiln_tiff_u(const kiln_tiff* t, int64_t at, int k) {
  if (at < 0 || at + k > t->n) return 0;
  return t->big ? kiln_be(t->d + at, k) : kiln_le(t->d + at, k);
}

/* element `i` of a SHORT or LONG tag's values; `found` is cleared if absent or malformed */
static int64_t kiln_tiff_tag(const kiln_tiff* t, int64_t ifd, int tag, int64_t i, int64_t dflt, int* found) {
  const int64_t count = kiln_tiff_u(t, ifd, 2);
  for (int64_t e = 0; e < count; ++e) {
    const int64_t at = ifd + 2 + 12 * e;
    if ((int)kiln_tiff_u(t, at, 2) != tag) continue;
    const int type = (int)kiln_tiff_u(t, at + 2, 2), size = type == 3 ? 2 : type == 4 ? 4 : 0;
    const int64_t nvals = kiln_tiff_u(t, at + 4, 4);
    if (!size || i >= nvals) break;
    const int64_t base = size * nvals <= 4 ? at + 8 : (int64_t)kiln_tiff_u(t, at + 8, 4);
    if (base + size * (i + 1) > t->n) break;
    return kiln_tiff_u(t, base + size * i, size);
  }
  if (found) *found = 0;
  return dflt;
}

static int kiln_decode_tiff(const uint8_t* d, int64_t n, kiln_img* im) {
  kiln_tiff t = {d, n, d[0] == 'M'};
  const int64_t ifd = kiln_tiff_u(&t, 4, 4);
  if (ifd < 8 || ifd + 2 > n) return 3;
  int ok = 1;
  const int64_t w = kiln_tiff_tag(&t, ifd, 256, 0, 0, &ok), h = kiln_tiff_tag(&t, ifd, 257, 0, 0, &ok);
  const int64_t spp = kiln_tiff_tag(&t, ifd, 277, 0, 1, NULL), bits = kiln_tiff_tag(&t, ifd, 258, 0, 8, NULL);
  if (!ok) return 3;
  if (kiln_tiff_tag(&t, ifd, 259, 0, 1, NULL) != 1) return 2;  /* compressed: needs libtiff */
  if (bits != 8 || kiln_tiff_tag(&t, ifd, 284, 0, 1, NULL) != 1 || (spp != 1 && spp != 3 && spp != 4)) return 3;
  int rc = kiln_img_alloc(im, h, w, (int)spp);
  if (rc) return rc;
  int64_t got = 0;
  for (int64_t s = 0; got < h * w * spp; ++s) {  /* the strips, concatenated */
    int more = 1;
    const int64_t off = kiln_tiff_tag(&t, ifd, 273, s, 0, &more), len = kiln_tiff_tag(&t, ifd, 279, s, 0, &more);
    if (!more || off < 0 || len < 0 || off + len > n) return 3;
    const int64_t take = len < h * w * spp - got ? len : h * w * spp - got;
    memcpy(im->px + got, d + off, (size_t)take);
    got += take;
  }
  return 0;
}

static int kiln_starts(const uint8_t* d, int64_t n, const char* magic, int k) {
  return n >= k && memcmp(d, magic, (size_t)k) == 0;
}

/* format: 0 RGB, 1 BGR, 2 Grayscale. out: capacity `cap` bytes; dims: H, W, channels. */
static int32_t kiln_image_decode(const uint8_t* d, int64_t n, int format, uint8_t* out, int64_t cap,
                                 int64_t* dims) {
  kiln_img im = {NULL, 0, 0, 0};
  int rc;
  if (kiln_starts(d, n, "\xff\xd8", 2)) rc = kiln_decode_jpeg(d, n, &im);
  else if (kiln_starts(d, n, "\x89PNG\r\n\x1a\n", 8)) rc = kiln_decode_png(d, n, &im);
  else if (kiln_starts(d, n, "BM", 2)) rc = kiln_decode_bmp(d, n, &im);
  else if (kiln_starts(d, n, "P5", 2) || kiln_starts(d, n, "P6", 2)) rc = kiln_decode_pnm(d, n, &im);
  else if (kiln_starts(d, n, "II*\0", 4) || kiln_starts(d, n, "MM\0*", 4)) rc = kiln_decode_tiff(d, n, &im);
  else rc = 2;  /* WebP, JPEG 2000, GIF, ...: not read here */
  if (rc) {
    free(im.px);
    return rc;
  }
  const int oc = format == 2 ? 1 : 3, gray = im.c < 3;
  const int64_t px = im.h * im.w;
  if (px * oc > cap) {
    free(im.px);
    return 4;
  }
  for (int64_t i = 0; i < px; ++i) {
    const uint8_t* s = im.px + i * im.c;  /* colour channels first; a trailing alpha is dropped */
    uint8_t* o = out + i * oc;
    if (format == 2) {
      o[0] = gray ? s[0] : (uint8_t)((s[0] * 19595u + s[1] * 38470u + s[2] * 7471u + 0x8000u) >> 16);
    } else {
      const uint8_t r = s[0], g = gray ? s[0] : s[1], b = gray ? s[0] : s[2];
      o[0] = format == 1 ? b : r; o[1] = g; o[2] = format == 1 ? r : b;
    }
  }
  free(im.px);
  dims[0] = im.h; dims[1] = im.w; dims[2] = oc;
  return 0;
}
