// Camera frames (data/image.h): PNG and JPEG files written here with libpng and libjpeg decode
// to their pixels (PNG exactly; JPEG within its quantisation); bad files get errors naming the
// file; an image's size is read from its header alone; the tower's resize and normalisation on
// images whose answer is known.
#include "data/image.h"

#include <gtest/gtest.h>
#include <png.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <jpeglib.h>

#include "base/check.h"

namespace tt::data {
namespace {

namespace fs = std::filesystem;

std::string tmp(const std::string& name) {
  const char* d = std::getenv("TEST_TMPDIR");
  return ((d ? fs::path(d) : fs::temp_directory_path()) / name).string();
}

void write_png(const std::string& path, int w, int h, const std::vector<uint8_t>& px, png_uint_32 format) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = w;
  img.height = h;
  img.format = format;
  ASSERT_TRUE(png_image_write_to_file(&img, path.c_str(), 0, px.data(), 0, nullptr)) << img.message;
}

void write_jpeg(const std::string& path, int w, int h, const std::vector<uint8_t>& rgb, int quality) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  jpeg_stdio_dest(&c, f);
  c.image_width = w;
  c.image_height = h;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(rgb.data()) + (size_t)c.next_scanline * w * 3;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::fclose(f);
}

std::string error_of(const std::string& path) {
  try {
    decode_image(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void truncate_to(const std::string& path, double fraction) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, (size_t)(bytes.size() * fraction));
}

TEST(Image, PngDecodesExactlyAndGreyExpands) {
  std::mt19937 rng(1);
  std::vector<uint8_t> px(5 * 3 * 3);
  for (auto& v : px) v = (uint8_t)(rng() & 0xff);
  const std::string rgb = tmp("rgb.png");
  write_png(rgb, 5, 3, px, PNG_FORMAT_RGB);
  const Image a = decode_image(rgb);
  EXPECT_EQ(a.width, 5);
  EXPECT_EQ(a.height, 3);
  EXPECT_EQ(a.rgb, px);
  std::vector<uint8_t> grey = {0, 100, 255, 7};
  const std::string g = tmp("grey.png");
  write_png(g, 2, 2, grey, PNG_FORMAT_GRAY);
  const Image b = decode_image(g);
  ASSERT_EQ(b.rgb.size(), 12u);
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(b.rgb[i * 3 + c], grey[i]) << "pixel " << i;
}

// A palette PNG (libpng's simplified writer: 2-bit indices for three entries) decodes to its
// palette's colours; an index past the palette's end, which libpng would paint black without a
// word, is an error naming the file, the pixel and both counts.
TEST(Image, PalettePngDecodesAndAnIndexPastThePaletteIsAnError) {
  // Three palette entries (RGB, or RGBA: a tRNS chunk), `index` one a pixel, rows of 3 pixels.
  auto write = [](const std::string& path, const std::vector<uint8_t>& index, bool alpha = false) {
    png_image img;
    std::memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = 3;
    img.height = (png_uint_32)index.size() / 3;
    img.format = alpha ? PNG_FORMAT_RGBA_COLORMAP : PNG_FORMAT_RGB_COLORMAP;
    img.colormap_entries = 3;
    const uint8_t rgb[9] = {255, 0, 0, 0, 0, 255, 0, 255, 0};
    const uint8_t rgba[12] = {255, 0, 0, 255, 0, 0, 255, 255, 0, 255, 0, 0};  // entry 2 transparent
    ASSERT_TRUE(png_image_write_to_file(&img, path.c_str(), 0, index.data(), 0, alpha ? rgba : rgb)) << img.message;
  };
  const std::string good = tmp("palette.png");
  write(good, {0, 1, 2, 2, 1, 0});
  const Image a = decode_image(good);
  EXPECT_EQ(a.rgb, (std::vector<uint8_t>{255, 0, 0, 0, 0, 255, 0, 255, 0, 0, 255, 0, 0, 0, 255, 255, 0, 0}));
  // With transparency (a tRNS chunk: the writer's RGBA colormap), alpha composited onto black as
  // for every PNG; opaque entries keep their colours.
  const std::string clear = tmp("palette_trns.png");
  write(clear, {0, 1, 2}, /*alpha=*/true);
  const Image c = decode_image(clear);
  EXPECT_EQ(c.rgb, (std::vector<uint8_t>{255, 0, 0, 0, 0, 255, 0, 0, 0}));
  const std::string bad = tmp("palette_bad.png");
  write(bad, {0, 1, 2, 0, 3, 1});  // pixel (1, 1): index 3 of a three-entry palette
  EXPECT_EQ(error_of(bad), bad + ": palette PNG: pixel (1, 1) has colour index 3, but the palette has 3 entries (a "
                                 "corrupt file)");
  std::ifstream in(bad, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    decode_image_bytes(bytes, "frame 7");
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("frame 7: palette PNG: pixel (1, 1) has colour index 3", 0), 0u) << e.what();
  }
}

TEST(Image, JpegDecodesWithinItsQuantisation) {
  const int w = 32, h = 16;
  std::vector<uint8_t> px((size_t)w * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) px[((size_t)y * w + x) * 3 + c] = (uint8_t)(40 + 4 * x + 3 * y + 20 * c);  // <= 249
  const std::string path = tmp("smooth.jpg");
  write_jpeg(path, w, h, px, 95);
  const Image img = decode_image(path);
  ASSERT_EQ(img.width, w);
  ASSERT_EQ(img.height, h);
  int worst = 0;
  for (size_t i = 0; i < px.size(); ++i) worst = std::max(worst, std::abs((int)img.rgb[i] - (int)px[i]));
  EXPECT_LE(worst, 8) << "a smooth image at quality 95 (chroma subsampled)";
}

TEST(Image, BadFilesAreErrorsNamingTheFile) {
  const std::string missing = tmp("missing.png");
  EXPECT_EQ(error_of(missing), missing + ": cannot open the image file");
  const std::string text = tmp("frame.png");
  std::ofstream(text) << "not an image";
  EXPECT_EQ(error_of(text), text + ": not a PNG or JPEG file (8 bytes read: no PNG or JPEG signature)");
  std::vector<uint8_t> px(64 * 64 * 3, 77);
  for (size_t i = 0; i < px.size(); ++i) px[i] = (uint8_t)(i * 31);
  const std::string png = tmp("cut.png");
  write_png(png, 64, 64, px, PNG_FORMAT_RGB);
  truncate_to(png, 0.5);
  EXPECT_EQ(error_of(png).rfind(png + ": corrupt or truncated PNG (", 0), 0u) << error_of(png);
  const std::string jpg = tmp("cut.jpg");
  write_jpeg(jpg, 64, 64, px, 90);
  truncate_to(jpg, 0.5);
  EXPECT_EQ(error_of(jpg).rfind(jpg + ": corrupt or truncated JPEG (", 0), 0u) << error_of(jpg);
}

// PNG's chunk checksum (CRC-32, ISO 3309), to forge a header that libpng accepts.
uint32_t crc32(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void put_be(std::string& s, size_t at, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s[at + i] = (char)(v >> (8 * (bytes - 1 - i)));
}

// A small PNG whose header (IHDR, checksum fixed) claims w x h pixels.
std::string png_claiming(uint32_t w, uint32_t h) {
  Image img;
  img.width = 3;
  img.height = 2;
  img.rgb.assign(3 * 2 * 3, 9);
  std::string png = encode_png(img);
  put_be(png, 16, w, 4);  // the signature (8), IHDR's length (4) and type (4), then width and height
  put_be(png, 20, h, 4);
  put_be(png, 29, crc32(reinterpret_cast<const uint8_t*>(png.data()) + 12, 17), 4);
  return png;
}

std::string size_error_of(const std::string& bytes) {
  try {
    image_size_bytes(bytes, "images[0]");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A server checks an image's size before paying for its pixels: image_size_bytes reads the
// header only, so a 100-byte PNG claiming 16384 x 16384 (800 MB decoded) answers at once.
TEST(Image, HeaderSizeIsReadWithoutDecodingThePixels) {
  Image img;
  img.width = 5;
  img.height = 3;
  img.rgb.assign(5 * 3 * 3, 50);
  const ImageSize png = image_size_bytes(encode_png(img), "png");
  EXPECT_EQ(png.width, 5);
  EXPECT_EQ(png.height, 3);
  const std::string jpg_path = tmp("size.jpg");
  write_jpeg(jpg_path, 7, 5, std::vector<uint8_t>(7 * 5 * 3, 80), 90);
  std::ifstream in(jpg_path, std::ios::binary);
  std::string jpg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const ImageSize j = image_size_bytes(jpg, "jpg");
  EXPECT_EQ(j.width, 7);
  EXPECT_EQ(j.height, 5);

  const std::string huge = png_claiming(16384, 16384);
  ASSERT_LT(huge.size(), 200u);
  const ImageSize h = image_size_bytes(huge, "images[0]");
  EXPECT_EQ(h.width, 16384);
  EXPECT_EQ(h.height, 16384);
  EXPECT_EQ(size_error_of(png_claiming(16385, 2)),
            "images[0]: PNG of 16385 x 2 pixels, expected sides in [1, 16384]");
  // A baseline JPEG's frame header (SOF0: FF C0, length, precision, height, width) claiming 16384 x 16384.
  const size_t sof = jpg.find("\xFF\xC0");
  ASSERT_NE(sof, std::string::npos);
  put_be(jpg, sof + 5, 16384, 2);
  put_be(jpg, sof + 7, 16384, 2);
  const ImageSize hj = image_size_bytes(jpg, "images[0]");
  EXPECT_EQ(hj.width, 16384);
  EXPECT_EQ(hj.height, 16384);

  EXPECT_EQ(size_error_of("AAAA"), "images[0]: not a PNG or JPEG image (4 bytes: no PNG or JPEG signature)");
  EXPECT_EQ(size_error_of(huge.substr(0, 20)).rfind("images[0]: not a readable PNG (", 0), 0u)
      << size_error_of(huge.substr(0, 20));
  EXPECT_EQ(size_error_of(jpg.substr(0, 4)).rfind("images[0]: corrupt or truncated JPEG (", 0), 0u)
      << size_error_of(jpg.substr(0, 4));
}

TEST(Image, TowerPixelsResizeAndNormalise) {
  Image img;
  img.width = 4;
  img.height = 4;
  img.rgb.resize(4 * 4 * 3);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x)
      for (int c = 0; c < 3; ++c) img.rgb[((size_t)y * 4 + x) * 3 + c] = (uint8_t)(16 * (y * 4 + x) + c);
  const std::array<float, 3> half = {0.5f, 0.5f, 0.5f};
  // Same size: every pixel as it is, (v / 255 - 0.5) / 0.5, channel first.
  const std::vector<float> same = tower_pixels(img, 4, half, half);
  ASSERT_EQ(same.size(), 3u * 16);
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(same[c * 16 + i], (float)(((16 * i + c) / 255.0 - 0.5) / 0.5));
  // Half size: half-pixel centres fall midway, so each output is its 2 x 2 block's mean.
  const std::vector<float> half_size = tower_pixels(img, 2, {0, 0, 0}, {1, 1, 1});
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 2; ++x) {
      double mean = 0;
      for (int dy = 0; dy < 2; ++dy)
        for (int dx = 0; dx < 2; ++dx) mean += img.rgb[((size_t)(2 * y + dy) * 4 + 2 * x + dx) * 3] / 4.0;
      EXPECT_NEAR(half_size[(size_t)y * 2 + x], mean / 255.0, 1e-6) << y << "," << x;
    }
  EXPECT_THROW(tower_pixels(img, 0, half, half), Error);
  EXPECT_THROW(tower_pixels(img, 4, half, {0.5f, 0.0f, 0.5f}), Error);
}

}  // namespace
}  // namespace tt::data
