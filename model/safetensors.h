// safetensors files: an 8-byte little-endian header size, a JSON header, then raw tensor data.
// treetrain reads F32, BF16 and F64 tensors and writes F32 or BF16 (round to nearest even).
// Writes are atomic (a temporary file renamed into place).
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <functional>
#include <istream>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tt::model {

struct StTensor {
  std::string dtype;           // "F32" | "BF16" | "F64" as stored
  std::vector<int64_t> shape;
  std::vector<double> values;  // converted to double on read
};

// name -> tensor. Throws tt::Error naming the file and what is wrong (truncated, bad header,
// unsupported dtype, offsets out of range).
std::map<std::string, StTensor> read_safetensors(const std::string& path);
// The same from a seekable stream; `name` stands for the file in messages (the fuzz target reads
// bytes in memory). values = false: the header alone, checked as above (values stay empty).
std::map<std::string, StTensor> read_safetensors(std::istream& in, const std::string& name, bool values = true);

// The header alone: every tensor's dtype and shape, the offsets checked, no values read (a
// model's shapes compared before anything of its size is allocated).
std::map<std::string, StTensor> read_safetensors_shapes(const std::string& path);

// A safetensors file read a tensor at a time, straight into the caller's memory: the header is
// read and checked when it opens (read_safetensors's checks and errors), and read() converts one
// tensor's values through a buffer of at most piece_bytes. Loading a model or an optimizer state
// so holds its own arrays only, not the file as doubles (read_safetensors: 8 bytes a value, all
// tensors at once).
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path, size_t piece_bytes = size_t{16} << 20);
  const std::string& path() const { return path_; }
  // name -> dtype and shape (values empty), as read_safetensors_shapes gives them.
  const std::map<std::string, StTensor>& tensors() const { return tensors_; }
  // Tensor `name`'s values (its shape's element count of them) into dst: F32 and BF16 exactly,
  // F64 into float rounded to nearest. Throws tt::Error naming the file and the tensor for a name
  // the file lacks or a read that fails.
  void read(const std::string& name, float* dst);
  void read(const std::string& name, double* dst);

 private:
  template <class T>
  void read_into(const std::string& name, T* dst);
  std::string path_;
  std::ifstream in_;
  size_t piece_bytes_;
  uint64_t data_start_ = 0;
  std::map<std::string, StTensor> tensors_;
  std::map<std::string, std::pair<uint64_t, uint64_t>> at_;  // name -> [begin, end) in the data buffer
  std::vector<char> buf_;
};

struct StWriteTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* f32 = nullptr;   // exactly one of f32 / f64 / fill is set
  const double* f64 = nullptr;
  // fill(first, n, dst): values [first, first + n) into dst as floats, asked for in order, a
  // piece of at most 2^20 at a time (a device's state written without a host copy of it whole).
  std::function<void(int64_t first, int64_t n, float* dst)> fill;
};

// dtype: "F32" | "BF16" | "F64". metadata goes into "__metadata__".
void write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::string& dtype, const std::map<std::string, std::string>& metadata = {});

}  // namespace tt::model
