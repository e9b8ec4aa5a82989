// NCCL communicator with its own stream, event ordering and a watchdog (nccl_communicator.h).
#include "distributed/nccl_communicator.h"

#include <nccl.h>

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/check.h"
#include "ops/cuda/check.h"

namespace tt::distributed {
namespace {

using Clock = std::chrono::steady_clock;

// A started collective: its completion event and when it was enqueued.
struct Pending {
  cudaEvent_t done;
  Clock::time_point start;
  std::string what;  // "all_reduce #12 (4194304 values)"
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Rendezvous> rv, int device, cudaStream_t compute)
      : tag_(rv->tag()),
        rank_(rv->rank()),
        world_(rv->world_size()),
        device_(device),
        compute_(compute),
        timeout_s_(rv->options().timeout_s),
        collective_timeout_s_(rv->options().collective_timeout_s) {
    tagged([&] { TT_CUDA_CHECK(cudaSetDevice(device_)); });
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (rank_ == 0) tagged([&] { TT_NCCL_CHECK(ncclGetUniqueId(&id)); });
    const std::string blob = rv->broadcast(rank_ == 0 ? std::string(reinterpret_cast<const char*>(&id), sizeof(id)) : "");
    if (blob.size() != sizeof(id))
      throw Error(str(tag_, ": the NCCL unique id from rank 0 has ", blob.size(), " bytes, expected ", sizeof(id)));
    std::memcpy(&id, blob.data(), sizeof(id));

    // NVLink SHARP multicast stays off unless asked for: a program using it can put a host's
    // GPUs, which others share, out of service (scripts/slurm/train.sbatch).
    ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // init and collectives return at once; progress is polled with a timeout
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, world_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      throw Error(str(tag_, ": ncclCommInitRankConfig: ", ncclGetErrorString(r), " (", ncclGetLastError(nullptr), ")"));
    settle("ncclCommInitRankConfig", timeout_s_, "distributed.timeout_s; did every rank reach NCCL setup?");

    tagged([&] {
      TT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      TT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      TT_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    });
    host_ = make_cpu_communicator(std::move(rv));
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    stop_ = true;
    if (watchdog_.joinable()) watchdog_.join();
    if (comm_ != nullptr) {
      bool clean = !aborted_;
      if (clean) {
        // Flush what was issued; a peer that is gone makes this time out, and then abort.
        clean = ncclCommFinalize(comm_) == ncclSuccess || poll_async(timeout_s_) == ncclSuccess;
      }
      if (clean && !aborted_) {
        ncclCommDestroy(comm_);
      } else if (!aborted_) {
        ncclCommAbort(comm_);
      }
    }
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    for (const Pending& p : pending_) cudaEventDestroy(p.done);
    if (ready_) cudaEventDestroy(ready_);
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string tag() const override { return tag_; }
  bool device_buffers() const override { return true; }

  void all_reduce_sum(float* data, int64_t n) override {
    enqueue(str("all_reduce of ", n, " floats"), [&] {
      return ncclAllReduce(data, data, (size_t)n, ncclFloat32, ncclSum, comm_, stream_);
    });
  }
  void all_reduce_sum(double* data, int64_t n) override {
    enqueue(str("all_reduce of ", n, " doubles"), [&] {
      return ncclAllReduce(data, data, (size_t)n, ncclFloat64, ncclSum, comm_, stream_);
    });
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    enqueue(str("broadcast of ", bytes, " bytes from rank ", root), [&] {
      return ncclBroadcast(data, data, (size_t)bytes, ncclUint8, root, comm_, stream_);
    });
  }
  void wait() override {
    throw_if_failed();
    tagged([&] {
      TT_CUDA_CHECK(cudaEventRecord(done_, stream_));
      TT_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    });
  }

  void all_reduce_host(double* values, int64_t n) override {
    throw_if_failed();
    host_->all_reduce_host(values, n);
  }
  void barrier() override {
    throw_if_failed();
    host_->barrier();
  }
  std::vector<std::string> all_gather_host(const std::string& blob) override {
    throw_if_failed();
    return host_->all_gather_host(blob);
  }

 private:
  // Runs f; a tt::Error from it (TT_CUDA_CHECK, TT_NCCL_CHECK) gets this rank's tag.
  template <class F>
  void tagged(F f) const {
    try {
      f();
    } catch (const Error& e) {
      throw Error(str(tag_, ": ", e.what()));
    }
  }

  void throw_if_failed() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) throw Error(error_);
  }

  // Polls the communicator's state until it leaves ncclInProgress or `seconds` pass.
  ncclResult_t poll_async(double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    ncclResult_t st = ncclInProgress;
    while (Clock::now() < deadline) {
      if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) return ncclInternalError;
      if (st != ncclInProgress) return st;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return ncclInProgress;
  }

  // After a non-blocking call: waits for the communicator to be ready again; aborts it and
  // throws on an error or after `seconds`. Called before the watchdog starts or under mu_.
  void settle(const char* call, double seconds, const char* hint) {
    const ncclResult_t st = poll_async(seconds);
    if (st == ncclSuccess) return;
    const std::string why = st == ncclInProgress ? str("not done within ", seconds, " s (", hint, ")")
                                                 : str(ncclGetErrorString(st), " (", ncclGetLastError(comm_), ")");
    ncclCommAbort(comm_);
    aborted_ = true;
    comm_ = nullptr;
    throw Error(str(tag_, ": ", call, ": ", why));
  }

  template <class Call>
  void enqueue(const std::string& what, Call call) {
    throw_if_failed();
    tagged([&] {
      TT_CUDA_CHECK(cudaEventRecord(ready_, compute_));
      TT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    });
    // Under the lock: the watchdog never aborts the communicator in the middle of an enqueue.
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) throw Error(error_);
    ++seq_;
    const ncclResult_t r = call();
    if (r != ncclSuccess && r != ncclInProgress)
      throw Error(str(tag_, ": NCCL ", what, " #", seq_, ": ", ncclGetErrorString(r), " (", ncclGetLastError(comm_), ")"));
    if (r == ncclInProgress) settle("NCCL enqueue", collective_timeout_s_, "distributed.collective_timeout_s");
    cudaEvent_t ev = nullptr;
    if (!free_events_.empty()) {
      ev = free_events_.back();
      free_events_.pop_back();
    } else {
      tagged([&] { TT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)); });
    }
    tagged([&] { TT_CUDA_CHECK(cudaEventRecord(ev, stream_)); });
    pending_.push_back(Pending{ev, Clock::now(), str(what, " #", seq_)});
  }

  // The watchdog: retires completed collectives; aborts on an NCCL error or a timed-out one.
  void watch() {
    cudaSetDevice(device_);
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_ || comm_ == nullptr) continue;
      std::string failure;
      ncclResult_t st = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress)
        failure = str("NCCL reported ", ncclGetErrorString(st), " (", ncclGetLastError(comm_), ")");
      while (failure.empty() && !pending_.empty()) {
        const Pending& p = pending_.front();
        const cudaError_t q = cudaEventQuery(p.done);
        if (q == cudaSuccess) {
          free_events_.push_back(p.done);
          pending_.pop_front();
          continue;
        }
        if (q != cudaErrorNotReady) {
          failure = str("CUDA error while ", p.what, " ran: ", cudaGetErrorString(q));
        } else if (std::chrono::duration<double>(Clock::now() - p.start).count() > collective_timeout_s_) {
          failure = str(p.what, " has not completed after ", collective_timeout_s_,
                        " s (distributed.collective_timeout_s): a peer died or hung");
        }
        break;
      }
      if (failure.empty()) continue;
      error_ = str(tag_, ": ", failure, "; the NCCL communicator was aborted");
      ncclCommAbort(comm_);
      aborted_ = true;
    }
  }

  const std::string tag_;
  const int rank_;
  const int world_;
  const int device_;
  cudaStream_t compute_;
  const double timeout_s_;
  const double collective_timeout_s_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;  // collectives run here
  cudaEvent_t ready_ = nullptr;    // compute -> communication ordering
  cudaEvent_t done_ = nullptr;     // communication -> compute ordering (wait())
  std::unique_ptr<Communicator> host_;
  uint64_t seq_ = 0;

  std::mutex mu_;  // guards pending_, free_events_, error_, aborted_ against the watchdog
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  std::string error_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Rendezvous> rendezvous, int device,
                                                     cudaStream_t compute_stream) {
  TT_CHECK(rendezvous != nullptr, "make_nccl_communicator: no rendezvous");
  return std::make_unique<NcclCommunicator>(std::move(rendezvous), device, compute_stream);
}

}  // namespace tt::distributed
