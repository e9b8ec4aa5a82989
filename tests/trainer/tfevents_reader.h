// A reader of TensorBoard events files for the tests, written from the format's description and
// sharing no code with trainer/tensorboard.cc: a bitwise CRC-32C, the TFRecord framing, and a
// protobuf wire-format decoder of the Event fields TensorBoard reads (wall_time 1, step 2,
// file_version 3, summary 5 with Value tag 1 / simple_value 2, session_log 7 with status 1).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tt::trainer::testing {

// One bit at a time, reflected polynomial 0x82f63b78.
inline uint32_t bitwise_crc32c(const std::string& bytes) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  }
  return c ^ 0xffffffffu;
}

inline uint32_t tfrecord_mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

struct TbEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;                         // "" unless the event is one
  bool has_summary = false;
  std::vector<std::pair<std::string, float>> values;  // the summary's (tag, simple_value)
  bool has_simple_value_for_all = true;             // every value carried simple_value
  int session_status = -1;                          // -1: no session_log
};

struct TbFile {
  std::vector<TbEvent> events;
  bool torn = false;  // the file ends inside a record
};

namespace detail {

struct Cursor {
  const std::string& s;
  size_t at = 0;
  bool done() const { return at >= s.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at >= s.size()) throw std::runtime_error("truncated varint");
      const unsigned char b = (unsigned char)s[at++];
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    throw std::runtime_error("varint too long");
  }
  std::string bytes(size_t n) {
    if (s.size() - at < n) throw std::runtime_error("truncated field");
    std::string out = s.substr(at, n);
    at += n;
    return out;
  }
  template <class T>
  T fixed() {
    T v;
    const std::string b = bytes(sizeof(T));
    std::memcpy(&v, b.data(), sizeof(T));
    return v;
  }
  void skip(int wire_type) {
    if (wire_type == 0) varint();
    else if (wire_type == 1) bytes(8);
    else if (wire_type == 2) bytes(varint());
    else if (wire_type == 5) bytes(4);
    else throw std::runtime_error("bad wire type");
  }
};

inline void parse_value(const std::string& msg, TbEvent* e) {
  Cursor c{msg};
  std::string tag;
  bool has = false;
  float value = 0;
  while (!c.done()) {
    const uint64_t key = c.varint();
    if (key == (1 << 3 | 2)) tag = c.bytes(c.varint());
    else if (key == (2 << 3 | 5)) value = c.fixed<float>(), has = true;
    else c.skip(key & 7);
  }
  e->values.push_back({tag, value});
  e->has_simple_value_for_all &= has;
}

inline TbEvent parse_event(const std::string& msg) {
  TbEvent e;
  Cursor c{msg};
  while (!c.done()) {
    const uint64_t key = c.varint();
    if (key == (1 << 3 | 1)) {
      e.wall_time = c.fixed<double>();
    } else if (key == (2 << 3 | 0)) {
      e.step = (int64_t)c.varint();
    } else if (key == (3 << 3 | 2)) {
      e.file_version = c.bytes(c.varint());
    } else if (key == (5 << 3 | 2)) {
      e.has_summary = true;
      const std::string summary = c.bytes(c.varint());
      Cursor s{summary};
      while (!s.done()) {
        const uint64_t k = s.varint();
        if (k == (1 << 3 | 2)) parse_value(s.bytes(s.varint()), &e);
        else s.skip(k & 7);
      }
    } else if (key == (7 << 3 | 2)) {
      const std::string log = c.bytes(c.varint());
      Cursor l{log};
      e.session_status = 0;
      while (!l.done()) {
        const uint64_t k = l.varint();
        if (k == (1 << 3 | 0)) e.session_status = (int)l.varint();
        else l.skip(k & 7);
      }
    } else {
      c.skip(key & 7);
    }
  }
  return e;
}

}  // namespace detail

// Every record of the file; a CRC mismatch throws, a file ending inside a record sets `torn`.
inline TbFile read_tfevents(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), {});
  TbFile f;
  size_t at = 0;
  while (at < all.size()) {
    if (all.size() - at < 12) {
      f.torn = true;
      break;
    }
    const std::string len_bytes = all.substr(at, 8);
    uint64_t len;
    uint32_t len_crc;
    std::memcpy(&len, len_bytes.data(), 8);
    std::memcpy(&len_crc, all.data() + at + 8, 4);
    if (len_crc != tfrecord_mask(bitwise_crc32c(len_bytes)))
      throw std::runtime_error(path.string() + ": bad length CRC at byte " + std::to_string(at));
    if (all.size() - at - 12 < len + 4) {
      f.torn = true;
      break;
    }
    const std::string data = all.substr(at + 12, len);
    uint32_t data_crc;
    std::memcpy(&data_crc, all.data() + at + 12 + len, 4);
    if (data_crc != tfrecord_mask(bitwise_crc32c(data)))
      throw std::runtime_error(path.string() + ": bad data CRC at byte " + std::to_string(at));
    f.events.push_back(detail::parse_event(data));
    at += 12 + len + 4;
  }
  return f;
}

// The events files of a folder in name order (the order TensorBoard reads them).
inline std::vector<std::filesystem::path> tfevents_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find("tfevents") != std::string::npos) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The scalars TensorBoard shows for a folder: files in name order, and a SessionLog START at
// step s drops what was read before at steps >= s (TensorBoard's purge of orphaned steps).
// step -> tag -> value.
inline std::map<int64_t, std::map<std::string, float>> tensorboard_scalars(const std::filesystem::path& dir) {
  std::map<int64_t, std::map<std::string, float>> out;
  for (const auto& file : tfevents_files(dir)) {
    for (const TbEvent& e : read_tfevents(file).events) {
      if (e.session_status == 1) out.erase(out.lower_bound(e.step), out.end());
      for (const auto& [tag, v] : e.values) out[e.step][tag] = v;
    }
  }
  return out;
}

}  // namespace tt::trainer::testing
