// safetensors files: an 8-byte little-endian header size, a JSON header, then raw tensor data.
// treetrain reads F32, BF16 and F64 tensors and writes F32 or BF16 (round to nearest even).
// Writes are atomic (a temporary file renamed into place).
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <string>
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

struct StWriteTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* f32 = nullptr;   // exactly one of f32 / f64 is set
  const double* f64 = nullptr;
};

// dtype: "F32" | "BF16" | "F64". metadata goes into "__metadata__".
void write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::string& dtype, const std::map<std::string, std::string>& metadata = {});

}  // namespace tt::model
