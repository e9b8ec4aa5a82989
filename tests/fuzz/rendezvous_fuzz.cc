// libFuzzer target: bytes as the rendezvous's messages (distributed/wire.h): a header, a
// challenge, a hello, a welcome, a host table and an all_gather reply; what decodes must encode back to the same bytes. Only
// tt::Error may come out of a decoder; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/check.h"
#include "distributed/wire.h"

namespace wire = tt::distributed::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int world = 1 + data[0] % 8;  // the first byte: the world size of the table and the reply
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (bytes.size() >= wire::kHeaderBytes) {
    const wire::Header h = wire::decode_header(bytes.data());
    wire::header_problem(h, wire::kMaxMessageBytes);
    char back[wire::kHeaderBytes];
    wire::encode_header(h, back);
    if (std::string(back, sizeof(back)) != bytes.substr(0, wire::kHeaderBytes)) __builtin_trap();
  }
  try {
    const wire::Hello h = wire::decode_hello(bytes);
    if (wire::encode_hello(h) != bytes) {
      // Decimals may carry leading zeros ("01"); what they decode to must still round-trip.
      const wire::Hello again = wire::decode_hello(wire::encode_hello(h));
      if (again.rank != h.rank || again.world_size != h.world_size || again.host != h.host ||
          again.job_id != h.job_id || again.job_id_var != h.job_id_var || again.secret_set != h.secret_set ||
          again.nonce != h.nonce || again.mac != h.mac)
        __builtin_trap();
    }
  } catch (const tt::Error&) {
  }
  try {
    if (wire::decode_challenge(bytes) != bytes) __builtin_trap();
  } catch (const tt::Error&) {
  }
  try {
    const wire::Welcome w = wire::decode_welcome(bytes);
    if (wire::encode_welcome(w.mac, w.table) != bytes) __builtin_trap();
    wire::decode_host_table(w.table, world);
  } catch (const tt::Error&) {
  }
  try {
    if (wire::encode_host_table(wire::decode_host_table(bytes, world)) != bytes) __builtin_trap();
  } catch (const tt::Error&) {
  }
  try {
    if (wire::pack_blobs(wire::unpack_blobs(bytes, world)) != bytes) __builtin_trap();
  } catch (const tt::Error&) {
  }
  return 0;
}
