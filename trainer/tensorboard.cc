// TensorBoard event files (see tensorboard.h).
#include "trainer/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "base/check.h"
#include "distributed/env.h"
#include "trainer/tensorboard_event.pb.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;
namespace pb = tt::tensorboard_proto;

// Byte-at-a-time table of the reflected Castagnoli polynomial.
constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (c & 1 ? 0x82f63b78u : 0u);
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = crc32c_table();

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The host name as a file name part.
std::string file_safe(std::string s) {
  for (char& c : s)
    if (c == '/' || c == '\0') c = '_';
  return s;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(const std::string& data) {
  // Little-endian fields (treetrain runs on little-endian hosts only, see model/safetensors.cc).
  const uint64_t len = data.size();
  std::string r(reinterpret_cast<const char*>(&len), 8);
  const uint32_t len_crc = masked_crc32c(r.data(), 8);
  r.append(reinterpret_cast<const char*>(&len_crc), 4);
  r += data;
  const uint32_t data_crc = masked_crc32c(data.data(), data.size());
  r.append(reinterpret_cast<const char*>(&data_crc), 4);
  return r;
}

EventWriter::EventWriter(const std::string& dir, int64_t first_step) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw Error(str(dir, ": cannot create the TensorBoard folder (a file of that name is in the way)"));
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw Error(str(dir, ": cannot create the TensorBoard folder (", ec ? ec.message() : "it is not a folder", ")"));
  const long long t = (long long)std::time(nullptr);
  const std::string base = (fs::path(dir) / str("events.out.tfevents.", t, ".", file_safe(distributed::hostname()))).string();
  for (int n = 0; fd_ < 0; ++n) {
    path_ = n == 0 ? base : str(base, ".", n);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0 && (errno != EEXIST || n >= 1000))
      throw Error(str(path_, ": cannot create the TensorBoard events file (", std::strerror(errno), ")"));
  }
  try {
    pb::Event version;
    version.set_wall_time(unix_seconds());
    version.set_file_version("brain.Event:2");
    write_record(version.SerializeAsString());
    pb::Event start;
    start.set_wall_time(unix_seconds());
    start.set_step(first_step);
    start.mutable_session_log()->set_status(pb::SessionLog::START);
    write_record(start.SerializeAsString());
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

EventWriter::~EventWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void EventWriter::write_scalars(int64_t step, const std::vector<Scalar>& scalars) {
  pb::Event e;
  e.set_wall_time(unix_seconds());
  e.set_step(step);
  pb::Summary* summary = e.mutable_summary();
  for (const Scalar& s : scalars) {
    pb::Summary::Value* v = summary->add_value();
    v->set_tag(s.tag);
    v->set_simple_value((float)s.value);
  }
  write_record(e.SerializeAsString());
}

void EventWriter::write_record(const std::string& data) {
  const std::string record = tfrecord_frame(data);
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(str(path_, ": cannot write the TensorBoard event (", std::strerror(errno), ")"));
    done += (size_t)n;
  }
}

}  // namespace tt::trainer
