// safetensors reader and writer (https://github.com/huggingface/safetensors, "Format").
//
// Layout: u64 little-endian N, then N bytes of JSON header, then the data buffer. The header maps
// tensor names to {"dtype", "shape", "data_offsets": [begin, end)} with offsets relative to the
// data buffer, plus an optional "__metadata__" string map. We pad the header with spaces so the
// data buffer starts 8-byte aligned. Multi-byte values are little-endian; treetrain only runs on
// little-endian hosts (x86-64, aarch64), so values are copied byte for byte.
#include "model/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "base/check.h"
#include "base/files.h"
#include "base/json.h"

namespace tt::model {

namespace {

// The reference implementation's limit; a larger header means a corrupt or hostile file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

int64_t dtype_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16") return 2;
  if (dtype == "F64") return 8;
  return 0;
}

double bf16_to_double(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float -> bf16, round to nearest even; NaN stays NaN (quiet).
uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// double -> bf16 without double rounding: round to odd into float (24 significant bits, more
// than 8 + 2), then round to nearest even into bf16.
uint16_t double_to_bf16(double d) {
  if (std::isnan(d)) return float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  float f = (float)d;
  if (std::fabs((double)f) > std::fabs(d)) f = std::nextafter(f, 0.0f);  // truncate toward zero
  if ((double)f != d) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= 1u;  // inexact: the odd neighbour
    std::memcpy(&f, &u, 4);
  }
  return float_to_bf16(f);
}

std::string errno_text() { return std::strerror(errno); }

// The header, checked: every tensor's dtype and shape (values empty) and its bytes in the file,
// sorted by offset, none overlapping another, all inside the file.
struct Entry {
  std::string name;
  uint64_t begin, end;  // relative to the data buffer
};
struct Header {
  std::map<std::string, StTensor> tensors;
  std::vector<Entry> entries;  // by begin
  uint64_t data_start = 0;     // the data buffer's offset in the file
};

Header read_header(std::istream& in, const std::string& path) {
  in.seekg(0, std::ios::end);
  const uint64_t file_size = (uint64_t)in.tellg();
  in.seekg(0, std::ios::beg);
  if (file_size < 8)
    throw Error(str(path, ": truncated safetensors file (", file_size, " bytes, expected at least 8)"));
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  if (!in) throw Error(str(path, ": read error in safetensors header"));  // a folder, say: not uninitialised bytes
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes)
    throw Error(str(path, ": safetensors header too large (", header_len, " bytes, limit ",
                    kMaxHeaderBytes, "); not a safetensors file?"));
  if (8 + header_len > file_size)
    throw Error(str(path, ": truncated safetensors file (header of ", header_len, " bytes, file of ",
                    file_size, " bytes)"));
  std::string header_text(header_len, '\0');
  in.read(header_text.data(), (std::streamsize)header_len);
  if (!in) throw Error(str(path, ": read error in safetensors header"));

  nlohmann::json header;
  try {
    header = parse_json_strict(header_text);
  } catch (const std::exception& e) {  // invalid JSON, or a tensor named twice
    throw Error(str(path, ": invalid safetensors JSON header: ", e.what()));
  }
  if (!header.is_object()) throw Error(str(path, ": safetensors header is not a JSON object"));

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;
  Header h;
  h.data_start = data_start;
  std::vector<Entry>& entries = h.entries;
  std::map<std::string, StTensor>& out = h.tensors;
  for (const auto& [name, desc] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = str(path, ": tensor \"", name, "\"");
    if (!desc.is_object() || !desc.contains("dtype") || !desc.contains("shape") ||
        !desc.contains("data_offsets"))
      throw Error(str(where, ": expected an object with dtype, shape and data_offsets, got ", desc.dump()));
    const auto& jd = desc.at("dtype");
    const auto& js = desc.at("shape");
    const auto& jo = desc.at("data_offsets");
    if (!jd.is_string()) throw Error(str(where, ": dtype must be a string"));
    StTensor t;
    t.dtype = jd.get<std::string>();
    const int64_t esize = dtype_size(t.dtype);
    if (esize == 0)
      throw Error(str(where, ": unsupported dtype \"", t.dtype, "\" (expected F32, BF16 or F64)"));
    if (!js.is_array()) throw Error(str(where, ": shape must be an array"));
    uint64_t numel = 1;
    for (const auto& d : js) {
      if (!d.is_number_unsigned()) throw Error(str(where, ": shape ", js.dump(), " has a non-integer or negative dimension"));
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > (uint64_t(1) << 62) / dim) throw Error(str(where, ": shape ", js.dump(), " is too large"));
      numel *= dim;
      t.shape.push_back((int64_t)dim);
    }
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
      throw Error(str(where, ": data_offsets must be [begin, end], got ", jo.dump()));
    const uint64_t begin = jo[0].get<uint64_t>(), end = jo[1].get<uint64_t>();
    if (begin > end || end > data_size)
      throw Error(str(where, ": data_offsets [", begin, ", ", end, "] out of range (data buffer of ",
                      data_size, " bytes)"));
    if (end - begin != numel * (uint64_t)esize)
      throw Error(str(where, ": data_offsets span ", end - begin, " bytes but shape ", js.dump(), " of ",
                      t.dtype, " needs ", numel * (uint64_t)esize));
    entries.push_back({name, begin, end});
    out.emplace(name, std::move(t));
  }

  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].begin < entries[i - 1].end)
      throw Error(str(path, ": tensors \"", entries[i - 1].name, "\" and \"", entries[i].name,
                      "\" have overlapping data_offsets"));
  }

  return h;
}

// n values of `dtype` at raw (little-endian, any alignment) into dst, converted to T: F32 and
// BF16 exactly, F64 into float rounded to nearest.
template <class T>
void convert(const std::string& dtype, const char* raw, size_t n, T* dst) {
  if (dtype == "F32") {
    for (size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, raw + 4 * i, 4);
      dst[i] = (T)f;
    }
  } else if (dtype == "BF16") {
    for (size_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, raw + 2 * i, 2);
      dst[i] = (T)bf16_to_double(b);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, raw + 8 * i, 8);
      dst[i] = (T)d;
    }
  }
}

// Bytes [at, at + n) of the file into buf; throws naming the file and tensor on a short read.
void read_at(std::istream& in, uint64_t at, char* buf, uint64_t n, const std::string& path, const std::string& name) {
  in.clear();
  in.seekg((std::streamoff)at, std::ios::beg);
  in.read(buf, (std::streamsize)n);
  if (!in) throw Error(str(path, ": read error in data of tensor \"", name, "\""));
}

}  // namespace

std::map<std::string, StTensor> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str(path, ": cannot open safetensors file (", errno_text(), ")"));
  return read_safetensors(in, path);
}

std::map<std::string, StTensor> read_safetensors_shapes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str(path, ": cannot open safetensors file (", errno_text(), ")"));
  return read_safetensors(in, path, /*values=*/false);
}

std::map<std::string, StTensor> read_safetensors(std::istream& in, const std::string& path, bool values) {
  Header h = read_header(in, path);
  if (!values) return std::move(h.tensors);
  std::vector<char> raw;
  for (const Entry& e : h.entries) {
    StTensor& t = h.tensors.at(e.name);
    const uint64_t nbytes = e.end - e.begin;
    if (nbytes == 0) continue;  // an empty tensor's buffers may be null, which memcpy may not take
    raw.resize(nbytes);
    read_at(in, h.data_start + e.begin, raw.data(), nbytes, path, e.name);
    t.values.resize(nbytes / dtype_size(t.dtype));
    convert(t.dtype, raw.data(), t.values.size(), t.values.data());
  }
  return std::move(h.tensors);
}

SafetensorsReader::SafetensorsReader(const std::string& path, size_t piece_bytes)
    : path_(path), in_(path, std::ios::binary), piece_bytes_(std::max<size_t>(piece_bytes, 8)) {
  if (!in_) throw Error(str(path, ": cannot open safetensors file (", errno_text(), ")"));
  Header h = read_header(in_, path);
  data_start_ = h.data_start;
  tensors_ = std::move(h.tensors);
  for (const Entry& e : h.entries) at_.emplace(e.name, std::make_pair(e.begin, e.end));
}

template <class T>
void SafetensorsReader::read_into(const std::string& name, T* dst) {
  const auto it = at_.find(name);
  if (it == at_.end()) throw Error(str(path_, ": no tensor \"", name, "\""));
  const std::string& dtype = tensors_.at(name).dtype;
  const uint64_t esize = (uint64_t)dtype_size(dtype), piece = piece_bytes_ / esize * esize;
  const auto [begin, end] = it->second;
  buf_.resize((size_t)std::min<uint64_t>(piece, end - begin));
  for (uint64_t done = 0; done < end - begin;) {
    const uint64_t n = std::min<uint64_t>(piece, end - begin - done);
    read_at(in_, data_start_ + begin + done, buf_.data(), n, path_, name);
    convert(dtype, buf_.data(), n / esize, dst + done / esize);
    done += n;
  }
}

void SafetensorsReader::read(const std::string& name, float* dst) { read_into(name, dst); }
void SafetensorsReader::read(const std::string& name, double* dst) { read_into(name, dst); }

void write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::string& dtype, const std::map<std::string, std::string>& metadata) {
  const int64_t esize = dtype_size(dtype);
  if (esize == 0) throw Error(str(path, ": unsupported safetensors dtype \"", dtype, "\" (expected F32, BF16 or F64)"));

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  std::vector<int64_t> numels;
  for (const StWriteTensor& t : tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second)
      throw Error(str(path, ": duplicate or reserved tensor name \"", t.name, "\""));
    if ((t.f32 != nullptr) + (t.f64 != nullptr) + (t.fill != nullptr) != 1)
      throw Error(str(path, ": tensor \"", t.name, "\": exactly one of f32 / f64 / fill must be set"));
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) throw Error(str(path, ": tensor \"", t.name, "\" has a negative dimension"));
      numel *= d;
    }
    numels.push_back(numel);
    const uint64_t nbytes = (uint64_t)numel * (uint64_t)esize;
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  const std::string target = atomic_write_target(path, Links::kReplace);  // a checkpoint's own files
  const std::string tmp = atomic_temp_path(target, (long)::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error(str(path, ": cannot create ", tmp, " (", errno_text(), ")"));
  bool removed = false;  // the temporary file closed and removed (after an error)
  auto write_all = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const std::string why = errno_text();
        ::close(fd);
        ::unlink(tmp.c_str());
        removed = true;
        throw Error(str(path, ": write failed (", why, ")"));
      }
      c += w;
      n -= (size_t)w;
    }
  };
  unsigned char len_bytes[8];
  uint64_t hl = header_text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = (unsigned char)(hl >> (8 * i));
  write_all(len_bytes, 8);
  write_all(header_text.data(), header_text.size());

  // Converted in chunks so a large tensor does not need a second full copy (nor, with fill, a
  // first one).
  constexpr int64_t kChunk = 1 << 20;  // StWriteTensor::fill's pieces (safetensors.h says 2^20)
  try {
    std::vector<char> buf(kChunk * 8);
    std::vector<float> filled;
    for (size_t k = 0; k < tensors.size(); ++k) {
      const StWriteTensor& t = tensors[k];
      for (int64_t s = 0; s < numels[k]; s += kChunk) {
        const int64_t n = std::min(kChunk, numels[k] - s);
        const float* f32 = t.f32 ? t.f32 + s : nullptr;  // the chunk's values, f32 or f64
        const double* f64 = t.f64 ? t.f64 + s : nullptr;
        if (t.fill) {
          filled.resize((size_t)n);
          t.fill(s, n, filled.data());
          f32 = filled.data();
        }
        char* o = buf.data();
        for (int64_t i = 0; i < n; ++i) {
          if (dtype == "F32") {
            const float f = f32 ? f32[i] : (float)f64[i];
            std::memcpy(o + 4 * i, &f, 4);
          } else if (dtype == "F64") {
            const double d = f32 ? (double)f32[i] : f64[i];
            std::memcpy(o + 8 * i, &d, 8);
          } else {
            const uint16_t b = f32 ? float_to_bf16(f32[i]) : double_to_bf16(f64[i]);
            std::memcpy(o + 2 * i, &b, 2);
          }
        }
        write_all(o, (size_t)(n * esize));
      }
    }
  } catch (...) {  // a fill that throws (a device error), or no memory for the buffers: nothing left behind
    if (!removed) {
      ::close(fd);
      ::unlink(tmp.c_str());
    }
    throw;
  }
  const bool synced = ::fsync(fd) == 0;
  const std::string sync_err = synced ? "" : errno_text();
  if (::close(fd) != 0 || !synced) {
    const std::string why = synced ? errno_text() : sync_err;
    ::unlink(tmp.c_str());
    throw Error(str(path, ": fsync/close failed (", why, ")"));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw Error(str(path, ": rename from ", tmp, " failed (", why, ")"));
  }
}

}  // namespace tt::model
