// safetensors: exact F32/F64 round trips, BF16 round-to-nearest-even from float and double, the
// file layout (aligned header, metadata), and errors that name the file for corrupt inputs.
#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>
#include <unistd.h>

#include "base/check.h"
#include "base/files.h"

namespace tt::model {
namespace {

std::string temp_path(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "safetensors_test";
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A file with the given JSON header text and `data_bytes` zero bytes of data.
std::string file_with_header(const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) s[i] = (char)(n >> (8 * i));
  return s + header + std::string(data_bytes, '\0');
}

// The error message, which must name the file.
std::string error_of(const std::string& path) {
  try {
    read_safetensors(path);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << "expected tt::Error for " << path;
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Safetensors, F32RoundTripIsExactAndLayoutIsAligned) {
  const std::string path = temp_path("f32.safetensors");
  const std::vector<float> a = {1.0f, -2.5f, 3.14159f, 1e-30f, -0.0f, 65504.f};
  const std::vector<float> b = {0.1f, 0.2f, 0.3f};
  write_safetensors(path, {{"a", {2, 3}, a.data(), nullptr}, {"b.weight", {3}, b.data(), nullptr}}, "F32",
                    {{"format", "pt"}});
  EXPECT_FALSE(std::filesystem::exists(tt::atomic_temp_path(path, (long)::getpid())));
  const auto st = read_safetensors(path);
  ASSERT_EQ(st.size(), 2u);
  const StTensor& ta = st.at("a");
  EXPECT_EQ(ta.dtype, "F32");
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(ta.values.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(ta.values[i], (double)a[i]) << i;
  EXPECT_TRUE(std::signbit(ta.values[4]));
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(st.at("b.weight").values[i], (double)b[i]);

  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | (unsigned char)bytes[i];
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 4 * (a.size() + b.size()));
  const std::string header = bytes.substr(8, n);
  EXPECT_TRUE(contains(header, "\"__metadata__\":{\"format\":\"pt\"}")) << header;
}

TEST(Safetensors, F64RoundTripIsExact) {
  const std::string path = temp_path("f64.safetensors");
  const std::vector<double> a = {M_PI, -1e-300, 1.0 / 3.0, 12345.678901234567};
  write_safetensors(path, {{"x", {4}, nullptr, a.data()}}, "F64");
  const auto st = read_safetensors(path);
  EXPECT_EQ(st.at("x").dtype, "F64");
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(st.at("x").values[i], a[i]);
}

TEST(Safetensors, F32FromDoubleRoundsToFloat) {
  const std::string path = temp_path("f32_from_f64.safetensors");
  const std::vector<double> a = {M_PI, 1.0 / 3.0};
  write_safetensors(path, {{"x", {2}, nullptr, a.data()}}, "F32");
  const auto st = read_safetensors(path);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(st.at("x").values[i], (double)(float)a[i]);
}

// BF16 keeps 8 significant bits: ties between two neighbours go to the even one.
TEST(Safetensors, Bf16RoundsToNearestEven) {
  const std::string path = temp_path("bf16.safetensors");
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {1.0f,
                                 3.14159f,
                                 -2.5f,
                                 1.0f + 0x1p-8f,      // tie between 1 and 1 + 2^-7: even is 1
                                 1.0f + 3 * 0x1p-8f,  // tie between 1 + 2^-7 and 1 + 2^-6: even is the latter
                                 1.0f + 0x1p-8f + 0x1p-20f,  // just above the tie: up
                                 0.0f,
                                 inf,
                                 -inf,
                                 std::numeric_limits<float>::quiet_NaN(),
                                 3.4e38f};  // rounds past the largest bf16: inf
  const std::vector<double> want = {1.0, 3.140625, -2.5, 1.0, 1.0 + 0x1p-6, 1.0 + 0x1p-7, 0.0,
                                    (double)inf, -(double)inf, 0.0, (double)inf};
  write_safetensors(path, {{"x", {(int64_t)in.size()}, in.data(), nullptr}}, "BF16");
  const auto st = read_safetensors(path);
  EXPECT_EQ(st.at("x").dtype, "BF16");
  EXPECT_EQ(read_bytes(path).size() % 2, 0u);
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::isnan(in[i])) {
      EXPECT_TRUE(std::isnan(st.at("x").values[i]));
    } else {
      EXPECT_EQ(st.at("x").values[i], want[i]) << "input " << in[i];
    }
  }
}

// From double the rounding is a single rounding: a value just above a bf16 tie by less than a
// float ulp still rounds up (rounding through float first would make it a tie and round down).
TEST(Safetensors, Bf16FromDoubleRoundsOnce) {
  const std::string path = temp_path("bf16_from_f64.safetensors");
  const std::vector<double> in = {1.0 + 0x1p-8 + 0x1p-40, 1.0 + 0x1p-8, 1.0 + 0x1p-8 - 0x1p-40, 3.14159, -1e-3};
  write_safetensors(path, {{"x", {(int64_t)in.size()}, nullptr, in.data()}}, "BF16");
  const auto st = read_safetensors(path);
  const std::vector<double> want = {1.0 + 0x1p-7, 1.0, 1.0, 3.140625, -0.00099945068359375};
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(st.at("x").values[i], want[i]) << i;
}

TEST(Safetensors, MissingFileNamesIt) {
  const std::string path = temp_path("does_not_exist.safetensors");
  EXPECT_TRUE(contains(error_of(path), "cannot open"));
}

TEST(Safetensors, TruncatedFilesNameTheFile) {
  const std::string good = temp_path("good.safetensors");
  const std::vector<float> a(16, 1.5f);
  write_safetensors(good, {{"a", {16}, a.data(), nullptr}}, "F32");
  const std::string bytes = read_bytes(good);

  const std::string p1 = temp_path("trunc_len.safetensors");
  write_bytes(p1, bytes.substr(0, 5));
  EXPECT_TRUE(contains(error_of(p1), "truncated"));

  const std::string p2 = temp_path("trunc_header.safetensors");
  write_bytes(p2, bytes.substr(0, 20));
  EXPECT_TRUE(contains(error_of(p2), "truncated"));

  const std::string p3 = temp_path("trunc_data.safetensors");
  write_bytes(p3, bytes.substr(0, bytes.size() - 4));
  const std::string m3 = error_of(p3);
  EXPECT_TRUE(contains(m3, "out of range")) << m3;
  EXPECT_TRUE(contains(m3, "\"a\"")) << m3;
}

TEST(Safetensors, BadHeadersNameTheFile) {
  const std::string p = temp_path("bad.safetensors");
  write_bytes(p, file_with_header("{not json", 0));
  EXPECT_TRUE(contains(error_of(p), "invalid safetensors JSON header"));

  std::string huge(8, '\0');
  huge[5] = 1;  // 2^40 bytes
  write_bytes(p, huge + "{}");
  EXPECT_TRUE(contains(error_of(p), "too large"));

  write_bytes(p, file_with_header("[1, 2]", 0));
  EXPECT_TRUE(contains(error_of(p), "not a JSON object"));

  write_bytes(p, file_with_header(R"({"x":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 8));
  EXPECT_TRUE(contains(error_of(p), "unsupported dtype \"I32\""));

  write_bytes(p, file_with_header(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  EXPECT_TRUE(contains(error_of(p), "needs 12"));

  write_bytes(p, file_with_header(
                     R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                     12));
  EXPECT_TRUE(contains(error_of(p), "overlapping"));

  write_bytes(p, file_with_header(R"({"x":{"dtype":"F32","shape":[2]}})", 8));
  EXPECT_TRUE(contains(error_of(p), "data_offsets"));

  // A tensor named twice: corrupt, not the second entry silently.
  write_bytes(p, file_with_header(
                     R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                     8));
  EXPECT_TRUE(contains(error_of(p), "invalid safetensors JSON header: duplicate key \"x\"")) << error_of(p);

  // A description nested 100k levels deep: an error, not a stack overflow quoting it.
  write_bytes(p, file_with_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":)" +
                                      std::string(100000, '[') + std::string(100000, ']') + "}",
                                  8));
  EXPECT_TRUE(contains(error_of(p), "invalid safetensors JSON header: arrays and objects nested deeper than 256 levels"))
      << error_of(p);
}

// read_line: std::getline with a bound, so a file without newlines (/dev/zero) stops with an error
// naming the line instead of filling memory.
TEST(Files, ReadLineIsBounded) {
  std::istringstream in("ab\n\ncdef\nlast");
  std::string line;
  std::vector<std::string> got;
  for (int64_t n = 1; tt::read_line(in, line, "f.jsonl", n, "one record", 4); ++n) got.push_back(line);
  EXPECT_EQ(got, (std::vector<std::string>{"ab", "", "cdef", "last"}));
  std::istringstream long_line("abc\nabcdefgh\n");
  EXPECT_TRUE(tt::read_line(long_line, line, "f.jsonl", 1, "one record", 4));
  try {
    tt::read_line(long_line, line, "f.jsonl", 2, "one record", 4);
    ADD_FAILURE() << "expected tt::Error";
  } catch (const tt::Error& e) {
    EXPECT_EQ(std::string(e.what()), "f.jsonl:2: a line longer than 4 bytes; expected one record a line (is this a "
                                     "JSONL file?)");
  }
}

TEST(Safetensors, ReadsForeignLayoutWithMetadataAndPadding) {
  // As written by the Python library: metadata first, header padded with spaces.
  const std::string p = temp_path("foreign.safetensors");
  std::string header = R"({"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string f = file_with_header(header, 0);
  const unsigned char data[4] = {0x80, 0x3f, 0x49, 0x40};  // bf16 1.0 and 3.140625
  f.append((const char*)data, 4);
  write_bytes(p, f);
  const auto st = read_safetensors(p);
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st.at("w").values, (std::vector<double>{1.0, 3.140625}));
}

// Found by tests/fuzz/safetensors_fuzz (UBSan: memcpy from a null pointer for an empty F64
// tensor); the sanitizer run of this test guards the fix.
TEST(Safetensors, EmptyTensorsOfEveryDtypeRead) {
  const std::string path = temp_path("empty.safetensors");
  write_bytes(path, file_with_header(R"({"a": {"dtype": "F64", "shape": [0, 3], "data_offsets": [0, 0]},)"
                                     R"( "b": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},)"
                                     R"( "c": {"dtype": "BF16", "shape": [2, 0], "data_offsets": [0, 0]}})",
                                     0));
  const auto t = read_safetensors(path);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t.at("a").shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(t.at("c").shape, (std::vector<int64_t>{2, 0}));
  for (const auto& [name, tensor] : t) EXPECT_TRUE(tensor.values.empty()) << name;
}

// SafetensorsReader: every dtype into float and double through pieces smaller than a tensor (12
// bytes: three F32 values, six BF16, one F64, the last piece short), the values read_safetensors
// gives (exactly; F64 into float rounded to nearest), each tensor on its own.
TEST(SafetensorsReader, ReadsEveryDtypeInPiecesAsReadSafetensors) {
  std::vector<double> a(37), b(5);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::ldexp(1.0 + 1.0 / (3.0 + (double)i), (int)i % 40 - 20) * (i % 3 ? 1 : -1);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.1 * (double)i;
  for (const char* dtype : {"F32", "BF16", "F64"}) {
    SCOPED_TRACE(dtype);
    const std::string path = temp_path(str("reader_", dtype, ".safetensors"));
    write_safetensors(path, {{"a", {37}, nullptr, a.data()}, {"b", {5, 1}, nullptr, b.data()}, {"e", {0, 3}, nullptr, b.data()}},
                      dtype);
    const auto whole = read_safetensors(path);
    SafetensorsReader r(path, 12);
    EXPECT_EQ(r.path(), path);
    ASSERT_EQ(r.tensors().size(), 3u);
    r.read("e", static_cast<float*>(nullptr));  // no values: nothing read or written
    EXPECT_EQ(r.tensors().at("b").shape, (std::vector<int64_t>{5, 1}));
    EXPECT_EQ(r.tensors().at("a").dtype, dtype);
    EXPECT_TRUE(r.tensors().at("a").values.empty());
    for (const char* name : {"b", "a", "b"}) {  // any order, again
      const std::vector<double>& want = whole.at(name).values;
      std::vector<double> d(want.size() + 1, -7.0);
      std::vector<float> f(want.size() + 1, -7.0f);
      r.read(name, d.data());
      r.read(name, f.data());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(d[i], want[i]) << name << " " << i;
        EXPECT_EQ(f[i], (float)want[i]) << name << " " << i;
      }
      EXPECT_EQ(d.back(), -7.0) << "nothing past the tensor is written";
      EXPECT_EQ(f.back(), -7.0f);
    }
  }
}

TEST(SafetensorsReader, ErrorsNameTheFileAndTensor) {
  const std::string path = temp_path("reader_errors.safetensors");
  const std::vector<float> a(64, 2.0f);
  write_safetensors(path, {{"w", {64}, a.data(), nullptr}}, "F32");
  SafetensorsReader r(path);
  float x[64];
  try {
    r.read("v", x);
    ADD_FAILURE() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": no tensor \"v\"");
  }
  // Shortened after the header was read: the read fails, named, instead of returning zeros.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 8);
  try {
    r.read("w", x);
    ADD_FAILURE() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": read error in data of tensor \"w\"");
  }
  // Opened so, the header's check names it (read_safetensors's error).
  try {
    SafetensorsReader again(path);
    ADD_FAILURE() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), path + ": tensor \"w\": data_offsets [0, 256] out of range")) << e.what();
  }
  // A folder opens as a stream but reads nothing: an error naming it, not a header of stray bytes.
  const std::string folder = temp_path("a_folder.safetensors");
  std::filesystem::create_directories(folder);
  for (int way = 0; way < 2; ++way)
    try {
      if (way == 0) SafetensorsReader f(folder);
      else read_safetensors(folder);
      ADD_FAILURE() << "expected tt::Error";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), folder + ": ")) << e.what();
    }
  try {
    SafetensorsReader missing(path + ".none");
    ADD_FAILURE() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), path + ".none: cannot open safetensors file")) << e.what();
  }
}

// A tensor given by fill (the optimizer state from the device a piece at a time): the same file as
// from a pointer to its values, in every dtype, the pieces asked for in order; a fill that throws
// leaves no file, temporary or final, behind.
TEST(Safetensors, FilledTensorsWriteAsFromPointers) {
  std::vector<float> a((size_t{1} << 20) + 37);  // past one piece
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::ldexp(1.0f + (float)(i % 97) / 97.0f, (int)(i % 50) - 25);
  for (const char* dtype : {"F32", "BF16", "F64"}) {
    SCOPED_TRACE(dtype);
    const std::string from_ptr = temp_path(str("ptr_", dtype, ".safetensors")),
                      from_fill = temp_path(str("fill_", dtype, ".safetensors"));
    write_safetensors(from_ptr, {{"a", {(int64_t)a.size()}, a.data(), nullptr}}, dtype);
    int64_t next = 0;
    StWriteTensor t{"a", {(int64_t)a.size()}, nullptr, nullptr, {}};
    t.fill = [&](int64_t first, int64_t n, float* dst) {
      EXPECT_EQ(first, next) << "pieces in order";
      EXPECT_LE(n, int64_t{1} << 20);
      std::copy(a.begin() + first, a.begin() + first + n, dst);
      next = first + n;
    };
    write_safetensors(from_fill, {t}, dtype);
    EXPECT_EQ(next, (int64_t)a.size());
    EXPECT_EQ(read_bytes(from_fill), read_bytes(from_ptr));
  }
  const std::string failed = temp_path("fill_throws.safetensors");
  StWriteTensor bad{"a", {(int64_t)a.size()}, nullptr, nullptr, {}};
  bad.fill = [](int64_t first, int64_t, float*) {
    if (first > 0) throw Error("the device is gone");
  };
  try {
    write_safetensors(failed, {bad}, "F32");
    ADD_FAILURE() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "the device is gone");
  }
  EXPECT_FALSE(std::filesystem::exists(failed));
  EXPECT_FALSE(std::filesystem::exists(tt::atomic_temp_path(failed, (long)::getpid())));
}

TEST(Safetensors, WriterRejectsBadInput) {
  const std::string p = temp_path("reject.safetensors");
  const float x = 1;
  EXPECT_THROW(write_safetensors(p, {{"a", {1}, &x, nullptr}}, "F16"), Error);
  EXPECT_THROW(write_safetensors(p, {{"a", {1}, &x, nullptr}, {"a", {1}, &x, nullptr}}, "F32"), Error);
  EXPECT_THROW(write_safetensors(p, {{"a", {1}, nullptr, nullptr}}, "F32"), Error);
  EXPECT_THROW(write_safetensors(temp_path("no_such_dir/x.safetensors"), {{"a", {1}, &x, nullptr}}, "F32"),
               Error);
}

}  // namespace
}  // namespace tt::model
