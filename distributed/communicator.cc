// The CPU communicator: a star all-reduce with fp64 accumulation in rank order (communicator.h).
#include "distributed/communicator.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/check.h"

namespace tt::distributed {
namespace {

// 2^16 values per chunk: 256 KiB of floats, small enough for the sockets' buffers, large enough
// that the per-chunk round trip is not the cost.
constexpr int64_t kChunk = int64_t(1) << 16;

class CpuCommunicator : public Communicator {
 public:
  explicit CpuCommunicator(std::unique_ptr<Rendezvous> rv) : rv_(std::move(rv)) {}

  std::string name() const override { return "cpu"; }
  int rank() const override { return rv_->rank(); }
  int world_size() const override { return rv_->world_size(); }
  std::string tag() const override { return rv_->tag(); }
  bool device_buffers() const override { return false; }

  void all_reduce_sum(float* data, int64_t n) override { reduce(data, n); }
  void all_reduce_sum(double* data, int64_t n) override { reduce(data, n); }
  void all_reduce_host(double* values, int64_t n) override { reduce(values, n); }

  void broadcast(void* data, int64_t bytes, int root) override {
    TT_CHECK(bytes >= 0, tag(), ": broadcast of ", bytes, " bytes");
    if (world_size() == 1) return;
    const std::string blob =
        rv_->broadcast(rank() == root ? std::string(static_cast<const char*>(data), (size_t)bytes) : std::string(), root);
    if (rank() == root) return;
    if ((int64_t)blob.size() != bytes)
      throw Error(str(tag(), ": broadcast from rank ", root, " carried ", blob.size(), " bytes, expected ", bytes,
                      " (buffers of different sizes on different ranks?)"));
    std::memcpy(data, blob.data(), blob.size());
  }
  void wait() override {}
  void barrier() override { rv_->barrier(); }
  std::vector<std::string> all_gather_host(const std::string& blob) override { return rv_->all_gather(blob); }

 private:
  template <class T>
  void reduce(T* data, int64_t n) {
    TT_CHECK(n >= 0, tag(), ": all_reduce of ", n, " values");
    if (world_size() == 1) return;
    rv_->begin(Op::kAllReduce);
    const int world = world_size();
    if (rank() != 0) {
      for (int64_t at = 0; at < n || at == 0; at += kChunk) {
        const int64_t len = std::min(kChunk, n - at);
        rv_->send(0, data + at, (size_t)len * sizeof(T));
        rv_->recv(0, data + at, (size_t)len * sizeof(T));
        if (n == 0) break;
      }
      return;
    }
    std::vector<T> peer((size_t)std::min(kChunk, n) * (world - 1));  // (world - 1, chunk)
    std::vector<double> acc((size_t)std::min(kChunk, n));
    for (int64_t at = 0; at < n || at == 0; at += kChunk) {
      const int64_t len = std::min(kChunk, n - at);
      for (int r = 1; r < world; ++r) rv_->recv(r, peer.data() + (size_t)(r - 1) * len, (size_t)len * sizeof(T));
      for (int64_t i = 0; i < len; ++i) acc[i] = (double)data[at + i];
      for (int r = 1; r < world; ++r) {
        const T* p = peer.data() + (size_t)(r - 1) * len;
        for (int64_t i = 0; i < len; ++i) acc[i] += (double)p[i];
      }
      for (int64_t i = 0; i < len; ++i) data[at + i] = (T)acc[i];
      for (int r = 1; r < world; ++r) rv_->send(r, data + at, (size_t)len * sizeof(T));
      if (n == 0) break;
    }
  }

  std::unique_ptr<Rendezvous> rv_;
};

}  // namespace

std::unique_ptr<Communicator> make_cpu_communicator(std::unique_ptr<Rendezvous> rendezvous) {
  TT_CHECK(rendezvous != nullptr, "make_cpu_communicator: no rendezvous");
  return std::make_unique<CpuCommunicator>(std::move(rendezvous));
}

}  // namespace tt::distributed
