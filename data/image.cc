// PNG and JPEG decoding (libpng's simplified API, libjpeg-turbo) and the tower's resize and
// normalisation (see image.h).
#include "data/image.h"

#include <png.h>
#include <setjmp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include <jpeglib.h>

#include "base/check.h"

namespace tt::data {
namespace {

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};

// A palette PNG's pixels index its palette, and libpng's simplified API paints an index past the
// palette's end black without a warning (a corrupt or hand-made file). This decodes the indices
// themselves (PNG_FORMAT_RGBA_COLORMAP: the file's palette as the colormap; with alpha, so that a
// palette with transparency (tRNS) needs no background colour) and names the first pixel whose
// index has no entry.
void check_palette_indexes(const std::string& path, const std::string* bytes) {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  const bool begun = bytes ? png_image_begin_read_from_memory(&png, bytes->data(), bytes->size())
                           : png_image_begin_read_from_file(&png, path.c_str());
  if (!begun) throw Error(str(path, ": not a readable PNG (", png.message, ")"));
  png.format = PNG_FORMAT_RGBA_COLORMAP;
  std::vector<uint8_t> index, colormap;
  try {
    index.resize(PNG_IMAGE_SIZE(png));
    colormap.resize(PNG_IMAGE_COLORMAP_SIZE(png));
  } catch (const std::bad_alloc&) {
    png_image_free(&png);
    throw Error(str(path, ": PNG of ", png.width, " x ", png.height, " pixels: out of memory for its ",
                    (int64_t)png.width * png.height, " palette indices"));
  }
  if (!png_image_finish_read(&png, nullptr, index.data(), 0, colormap.data())) {
    const std::string why = png.message;
    png_image_free(&png);
    throw Error(str(path, ": corrupt or truncated PNG (", why, ")"));
  }
  const size_t entries = png.colormap_entries;
  for (size_t i = 0; i < index.size(); ++i)
    if (index[i] >= entries)
      throw Error(str(path, ": palette PNG: pixel (", i % png.width, ", ", i / png.width, ") has colour index ",
                      (int)index[i], ", but the palette has ", entries, " entries (a corrupt file)"));
}

// From the file `path`, or (bytes non-null) from memory, `path` naming it in messages. header_only:
// the size from the header (IHDR), no pixels decoded.
Image decode_png(const std::string& path, const std::string* bytes = nullptr, bool header_only = false) {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  const bool begun = bytes ? png_image_begin_read_from_memory(&png, bytes->data(), bytes->size())
                           : png_image_begin_read_from_file(&png, path.c_str());
  if (!begun)
    throw Error(str(path, ": not a readable PNG (", png.message, ")"));
  if ((int64_t)png.width > kMaxImageSide || (int64_t)png.height > kMaxImageSide || png.width == 0 || png.height == 0) {
    png_image_free(&png);
    throw Error(str(path, ": PNG of ", png.width, " x ", png.height, " pixels, expected sides in [1, ", kMaxImageSide,
                    "]"));
  }
  const bool palette = png.format & PNG_FORMAT_FLAG_COLORMAP;
  png.format = PNG_FORMAT_RGB;  // grey and palette expanded; alpha composited onto black
  Image img;
  img.width = (int)png.width;
  img.height = (int)png.height;
  if (header_only) {
    png_image_free(&png);
    return img;
  }
  if (palette) {
    try {
      check_palette_indexes(path, bytes);
    } catch (...) {
      png_image_free(&png);
      throw;
    }
  }
  try {
    img.rgb.resize(PNG_IMAGE_SIZE(png));
  } catch (const std::bad_alloc&) {
    png_image_free(&png);
    throw Error(str(path, ": PNG of ", img.width, " x ", img.height, " pixels: out of memory for its ",
                    (int64_t)img.width * img.height * 3, " bytes of pixels"));
  }
  if (!png_image_finish_read(&png, nullptr, img.rgb.data(), 0, nullptr)) {
    const std::string why = png.message;
    png_image_free(&png);
    throw Error(str(path, ": corrupt or truncated PNG (", why, ")"));
  }
  return img;
}

struct JpegError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr cinfo) {
  JpegError* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  longjmp(e->jump, 1);
}

// Decodes into *out (owned by the caller: no automatic object of this frame that setjmp's
// longjmp could leave indeterminate is touched after an error). header_only: out's size from the
// header (up to the first scan), no pixels decoded.
void decode_jpeg(const std::string& path, FILE* f, const std::string* bytes, Image* out, bool header_only = false) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit;
  err.mgr.output_message = [](j_common_ptr) {};  // warnings (a truncated tail) are not printed
  Image& img = *out;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw Error(str(path, ": corrupt or truncated JPEG (", err.message, ")"));
  }
  jpeg_create_decompress(&cinfo);
  if (bytes) {
    jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes->data()), (unsigned long)bytes->size());
  } else {
    jpeg_stdio_src(&cinfo, f);
  }
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.image_width == 0 || cinfo.image_height == 0 || (int64_t)cinfo.image_width > kMaxImageSide ||
      (int64_t)cinfo.image_height > kMaxImageSide) {
    const unsigned w = cinfo.image_width, h = cinfo.image_height;
    jpeg_destroy_decompress(&cinfo);
    throw Error(str(path, ": JPEG of ", w, " x ", h, " pixels, expected sides in [1, ", kMaxImageSide, "]"));
  }
  if (header_only) {  // the decoder's output size at its default scale (1/1) is the header's
    img.width = (int)cinfo.image_width;
    img.height = (int)cinfo.image_height;
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  img.width = (int)cinfo.output_width;
  img.height = (int)cinfo.output_height;
  try {
    img.rgb.resize((size_t)img.width * img.height * 3);
  } catch (const std::bad_alloc&) {
    jpeg_destroy_decompress(&cinfo);
    throw Error(str(path, ": JPEG of ", img.width, " x ", img.height, " pixels: out of memory for its ",
                    (int64_t)img.width * img.height * 3, " bytes of pixels"));
  }
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = img.rgb.data() + (size_t)cinfo.output_scanline * img.width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  // libjpeg fills a truncated file's missing rows with grey and only warns: that is an error here.
  const bool truncated = err.mgr.num_warnings > 0;
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  if (truncated) throw Error(str(path, ": corrupt or truncated JPEG (libjpeg warned while decoding)"));
}

}  // namespace

namespace {

// libpng's simplified-API description of an 8-bit RGB image (checked; `what` names it).
png_image rgb_png(const Image& img, const std::string& what) {
  TT_CHECK(img.width > 0 && img.height > 0 && img.rgb.size() == (size_t)img.width * img.height * 3, what,
           ": an image of ", img.width, " x ", img.height, " with ", img.rgb.size(), " bytes to write");
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = (png_uint_32)img.width;
  png.height = (png_uint_32)img.height;
  png.format = PNG_FORMAT_RGB;
  return png;
}

}  // namespace

namespace {

enum class Kind { kPng, kJpeg, kOther };

// The format by its signature: PNG's 8 bytes, JPEG's SOI marker and the next marker's 0xFF.
Kind sniff(const unsigned char* b, size_t n) {
  static const unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (n >= 8 && std::memcmp(b, kPng, 8) == 0) return Kind::kPng;
  if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return Kind::kJpeg;
  return Kind::kOther;
}

// An image in memory: its header only (width and height) when header_only.
Image decode_memory(const std::string& bytes, const std::string& what, bool header_only) {
  Image img;
  switch (sniff(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size())) {
    case Kind::kPng:
      return decode_png(what, &bytes, header_only);
    case Kind::kJpeg:
      decode_jpeg(what, nullptr, &bytes, &img, header_only);
      return img;
    case Kind::kOther:
      break;
  }
  throw Error(str(what, ": not a PNG or JPEG image (", bytes.size(), " bytes: no PNG or JPEG signature)"));
}

}  // namespace

Image decode_image(const std::string& path) {
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) throw Error(str(path, ": cannot open the image file"));
  unsigned char sig[8] = {};
  const size_t n = std::fread(sig, 1, sizeof sig, f.get());
  switch (sniff(sig, n)) {
    case Kind::kPng:
      return decode_png(path);
    case Kind::kJpeg: {
      std::rewind(f.get());
      Image img;
      decode_jpeg(path, f.get(), nullptr, &img);
      return img;
    }
    case Kind::kOther:
      break;
  }
  throw Error(str(path, ": not a PNG or JPEG file (", n, " bytes read: no PNG or JPEG signature)"));
}

Image decode_image_bytes(const std::string& bytes, const std::string& what) {
  return decode_memory(bytes, what, false);
}

ImageSize image_size_bytes(const std::string& bytes, const std::string& what) {
  const Image img = decode_memory(bytes, what, true);
  return ImageSize{img.width, img.height};
}

std::string encode_png(const Image& img) {
  png_image png = rgb_png(img, "encode_png");
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&png, nullptr, &size, 0, img.rgb.data(), 0, nullptr))
    throw Error(str("encode_png: ", png.message));
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&png, out.data(), &size, 0, img.rgb.data(), 0, nullptr))
    throw Error(str("encode_png: ", png.message));
  out.resize(size);
  return out;
}


void write_png(const std::string& path, const Image& img) {
  png_image png = rgb_png(img, path);
  if (!png_image_write_to_file(&png, path.c_str(), 0, img.rgb.data(), 0, nullptr))
    throw Error(str(path, ": cannot write the PNG (", png.message, ")"));
}

std::vector<float> tower_pixels(const Image& img, int size, const std::array<float, 3>& mean,
                                const std::array<float, 3>& std) {
  TT_CHECK(size > 0 && size <= kMaxImageSide, "tower_pixels: size ", size, ", expected in [1, ", kMaxImageSide, "]");
  TT_CHECK(img.width > 0 && img.height > 0 && img.rgb.size() == (size_t)img.width * img.height * 3,
           "tower_pixels: an image of ", img.width, " x ", img.height, " with ", img.rgb.size(), " bytes");
  for (int c = 0; c < 3; ++c) TT_CHECK(std[c] > 0, "tower_pixels: std[", c, "] = ", std[c], ", expected > 0");
  std::vector<float> out((size_t)3 * size * size);
  const double sx = (double)img.width / size, sy = (double)img.height / size;
  for (int y = 0; y < size; ++y) {
    const double fy = std::clamp((y + 0.5) * sy - 0.5, 0.0, (double)img.height - 1);
    const int y0 = (int)fy, y1 = std::min(y0 + 1, img.height - 1);
    const double wy = fy - y0;
    for (int x = 0; x < size; ++x) {
      const double fx = std::clamp((x + 0.5) * sx - 0.5, 0.0, (double)img.width - 1);
      const int x0 = (int)fx, x1 = std::min(x0 + 1, img.width - 1);
      const double wx = fx - x0;
      for (int c = 0; c < 3; ++c) {
        auto at = [&](int yy, int xx) { return (double)img.rgb[((size_t)yy * img.width + xx) * 3 + c]; };
        const double v = (1 - wy) * ((1 - wx) * at(y0, x0) + wx * at(y0, x1)) + wy * ((1 - wx) * at(y1, x0) + wx * at(y1, x1));
        out[((size_t)c * size + y) * size + x] = (float)((v / 255.0 - mean[c]) / std[c]);
      }
    }
  }
  return out;
}

}  // namespace tt::data
