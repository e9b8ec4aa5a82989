// Shared helpers of the CUDA op tests: bf16-rounded random inputs, device round trips, NaN
// poison, and per-element bound checks against the fp64 CPU reference (//ops/cpu).
//
// Tolerance rule. Inputs are rounded to bf16 once on the host; the CPU reference runs in fp64 on
// exactly those values, so the only differences are the GPU's own roundings. Each test bounds every
// element by |got - ref| <= rel * |ref| + abs_i, where rel = 2^-8 (u, the unit roundoff of bf16,
// for a result rounded once to bf16; 2^-24 for fp32 results) and abs_i is twice a first-order bound
// on the fp32 arithmetic before that rounding (a sum of n terms adds at most n u32 times the sum of
// their magnitudes), written out in each test. NaN never passes (unless the reference is NaN).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ops/cuda/bf16.h"
#include "ops/cuda/memory.h"

namespace tt::cuda_test {

using tt::cuda::bf16;
using tt::cuda::DeviceBuffer;

constexpr double kBf16U = 1.0 / 256;        // 2^-8
constexpr double kF32U = 1.0 / 16777216.0;  // 2^-24
constexpr double kF64U = 1.0 / 9007199254740992.0;  // 2^-53

// Test fixture base: fails (not skips) without a device, since these tests only run on the GPU
// machine (tags = ["gpu"]).
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess) << "no CUDA driver/device";
    ASSERT_GT(n, 0) << "no CUDA device";
  }
};

// Normal(0, scale) values rounded to bf16 (as doubles, exactly representable in bf16).
inline std::vector<double> randn_bf16(std::mt19937_64& rng, size_t n, double scale = 1.0) {
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> x(n);
  for (auto& v : x) v = tt::cuda::round_to_bf16((float)dist(rng));
  return x;
}

// Normal(0, scale) values rounded to fp32.
inline std::vector<double> randn_f32(std::mt19937_64& rng, size_t n, double scale = 1.0) {
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> x(n);
  for (auto& v : x) v = (float)dist(rng);
  return x;
}

inline std::vector<double> randint(std::mt19937_64& rng, size_t n, int r) {
  std::uniform_int_distribution<int> dist(-r, r);
  std::vector<double> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

inline DeviceBuffer<bf16> to_device_bf16(const std::vector<double>& x) {
  std::vector<bf16> h(x.size());
  for (size_t i = 0; i < x.size(); i++) h[i] = tt::cuda::host_float_to_bf16((float)x[i]);
  DeviceBuffer<bf16> d(x.size());
  d.copy_from_host(h);
  return d;
}

inline DeviceBuffer<float> to_device_f32(const std::vector<double>& x) {
  std::vector<float> h(x.begin(), x.end());
  DeviceBuffer<float> d(x.size());
  d.copy_from_host(h);
  return d;
}

template <class T>
DeviceBuffer<T> to_device(const std::vector<T>& x) {
  DeviceBuffer<T> d(x.size());
  d.copy_from_host(x);
  return d;
}

inline std::vector<double> to_host(const DeviceBuffer<bf16>& d) {
  const std::vector<bf16> h = d.to_host();
  std::vector<double> x(h.size());
  for (size_t i = 0; i < h.size(); i++) x[i] = tt::cuda::host_bf16_to_float(h[i]);
  return x;
}

inline std::vector<double> to_host(const DeviceBuffer<float>& d) {
  const std::vector<float> h = d.to_host();
  return std::vector<double>(h.begin(), h.end());
}

inline std::vector<double> to_host(const DeviceBuffer<double>& d) { return d.to_host(); }

// NaN in every element (0xFF bytes), so an element a kernel fails to write shows up.
template <class T>
void poison(DeviceBuffer<T>& d) {
  d.fill_bytes(0xFF);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

inline void sync_and_check() {
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const cudaError_t err = cudaDeviceSynchronize();
  ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
}

// Every element within rel * |ref| + abs[i] (abs empty: 0; abs of size 1: the same for all).
inline ::testing::AssertionResult all_within(const std::string& name, const std::vector<double>& got,
                                             const std::vector<double>& ref, double rel,
                                             const std::vector<double>& abs) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << name << ": size " << got.size() << " vs reference " << ref.size();
  size_t bad = 0;
  std::ostringstream os;
  double worst = 0;  // largest |got - ref| / bound
  for (size_t i = 0; i < got.size(); i++) {
    const double a = abs.empty() ? 0.0 : abs.size() == 1 ? abs[0] : abs[i];
    const double bound = rel * std::fabs(ref[i]) + a;
    const double err = std::fabs(got[i] - ref[i]);
    const bool ok = std::isnan(ref[i]) ? std::isnan(got[i]) : (!std::isnan(got[i]) && err <= bound);
    if (!std::isnan(ref[i]) && !std::isnan(got[i]) && bound > 0) worst = std::max(worst, err / bound);
    if (!ok) {
      if (bad < 8)
        os << "\n  [" << i << "] got " << got[i] << " ref " << ref[i] << " |err| " << err << " bound " << bound;
      bad++;
    }
  }
  if (bad)
    return ::testing::AssertionFailure() << name << ": " << bad << " of " << got.size()
                                         << " elements out of bounds" << os.str();
  return ::testing::AssertionSuccess() << name << ": worst err/bound " << worst;
}

inline ::testing::AssertionResult all_equal(const std::string& name, const std::vector<double>& got,
                                            const std::vector<double>& ref) {
  return all_within(name, got, ref, 0.0, {});
}

// Normwise relative L2 error, for reporting.
inline double rel_l2(const std::vector<double>& got, const std::vector<double>& ref) {
  double e = 0, r = 0;
  for (size_t i = 0; i < got.size(); i++) {
    e += (got[i] - ref[i]) * (got[i] - ref[i]);
    r += ref[i] * ref[i];
  }
  return r > 0 ? std::sqrt(e / r) : std::sqrt(e);
}

inline std::vector<double> round_bf16(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = tt::cuda::round_to_bf16((float)x[i]);
  return y;
}

}  // namespace tt::cuda_test
