// TensorBoard event files: run_dir/tb/events.out.tfevents.<unix time>.<host>, written by rank 0
// (`tensorboard --logdir run_dir/tb`).
//
// A file is a sequence of TFRecords, each
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked
//   CRC-32C of the data,
// masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, CRC-32C being the Castagnoli CRC; each data
// is one serialised Event (trainer/tensorboard_event.proto, TensorBoard's field numbers). The
// first event of a file is file_version "brain.Event:2", the second a SessionLog START at the
// first step the run takes (TensorBoard then drops what earlier files logged at that step and
// later: the steps a killed run took after the checkpoint this run resumed from, which
// metrics.jsonl drops too); then one event per step with its scalars (float32 summary values).
//
// Every run opens a new file (when the name is taken, ".1", ".2", ... is appended), so a file is
// never written again once its run ends, and a record torn by a kill stays at the end of its own
// file, where readers stop. Each event is one write(2) of its whole record: once write_scalars
// returns, the step is in the file (a later kill loses nothing logged).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tt::trainer {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) of n bytes, continuing from `crc`
// (0 to start): crc32c("123456789") = 0xe3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's masked CRC-32C.
uint32_t masked_crc32c(const void* data, size_t n);
// One TFRecord around `data`.
std::string tfrecord_frame(const std::string& data);

class EventWriter {
 public:
  struct Scalar {
    std::string tag;
    double value;  // written as float32
  };

  // Creates `dir` and a new events file in it, and writes the file version and a SessionLog
  // START at first_step. Throws tt::Error naming the folder or file when either cannot be made.
  EventWriter(const std::string& dir, int64_t first_step);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  const std::string& path() const { return path_; }
  // One event with these scalars at `step`, in the file when it returns (tt::Error naming the
  // file otherwise).
  void write_scalars(int64_t step, const std::vector<Scalar>& scalars);

 private:
  void write_record(const std::string& data);

  std::string path_;
  int fd_ = -1;
};

}  // namespace tt::trainer
