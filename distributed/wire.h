// The rendezvous's wire format (rendezvous.h), as pure functions: what a peer sends is decoded
// here, checked against stated bounds, before anything else reads it or allocates for it.
//
// Every message is a 24-byte header {magic, op, collective number, payload bytes} followed by the
// payload, in host byte order (all ranks of a job run the same build on the same architecture).
// A header whose magic is not kMagic, or which announces more than kMaxMessageBytes (a hello:
// kMaxHelloBytes), is refused before its payload is read. Payloads:
//   challenge  rank 0's nonce, 32 hex digits               (rank 0 -> a new connection)
//   hello    "<rank> <world size> <host>\n<secret set: 0|1> <nonce> <mac>\n<job id variable>\n<job id>"
//            (worker -> rank 0; nonce 32 and mac 64 hex digits: auth.h)
//   welcome  "<mac>\n" and the host table, one name per line, by rank  (rank 0 -> worker)
//   reject   the reason, text                            (rank 0 -> a refused peer)
//   all_gather reply: per rank a u64 length and the bytes (pack_blobs)
// Decoders throw tt::Error saying what is malformed; the rendezvous adds who sent it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tt::distributed::wire {

constexpr uint32_t kMagic = 0x50447454;                 // "TtDP"
constexpr size_t kHeaderBytes = 24;
constexpr uint64_t kMaxMessageBytes = uint64_t(64) << 20;  // any payload: 64 MiB
constexpr uint64_t kMaxHelloBytes = 4096;                // a hello (and a reject's reason)
constexpr size_t kMaxJobIdBytes = 256;
constexpr size_t kMaxHostBytes = 255;
constexpr size_t kMaxJobIdVarBytes = 64;

struct Header {
  uint32_t magic = kMagic;
  uint32_t op = 0;
  uint64_t seq = 0;
  uint64_t bytes = 0;
};

void encode_header(const Header& h, char out[kHeaderBytes]);
Header decode_header(const char in[kHeaderBytes]);
// Why a received header cannot start a message, or "" when it can, as what the peer did: "sent a
// message that is not treetrain's protocol (magic ...)" or "announced a message of N bytes, more
// than the protocol's maximum of M bytes" (M = max_bytes).
std::string header_problem(const Header& h, uint64_t max_bytes);

struct Hello {
  int rank = 0;
  int world_size = 0;
  std::string host;
  bool secret_set = false;  // the worker has a TT_JOB_SECRET (its mac is keyed by it)
  std::string nonce;        // the worker's, 32 hex digits
  std::string mac;          // 64 hex digits (auth.h)
  std::string job_id;      // "" when the launcher gave none
  std::string job_id_var;  // the variable it came from ("TT_JOB_ID", ...; "" with no id)
};
std::string encode_hello(const Hello& h);
Hello decode_hello(const std::string& text);

// Host names (non-empty, no whitespace) of `world` ranks, one per line.
std::string encode_host_table(const std::vector<std::string>& hosts);
std::vector<std::string> decode_host_table(const std::string& text, int world);

// The hello's and the welcome's MACs (auth.h, keyed by the job secret): over both nonces and
// every field of the message but the mac.
std::string hello_mac(const std::string& secret, const std::string& root_nonce, const Hello& h);
std::string welcome_mac(const std::string& secret, const std::string& root_nonce, const std::string& worker_nonce,
                        const std::string& table);

// The challenge: exactly 32 hex digits.
std::string decode_challenge(const std::string& text);

// The welcome: rank 0's mac (64 hex digits) and the host table.
std::string encode_welcome(const std::string& mac, const std::string& table);
struct Welcome {
  std::string mac;
  std::string table;  // as sent; decode_host_table reads it
};
Welcome decode_welcome(const std::string& text);

// The all_gather reply: exactly `world` blobs.
std::string pack_blobs(const std::vector<std::string>& blobs);
std::vector<std::string> unpack_blobs(const std::string& packed, int world);

}  // namespace tt::distributed::wire
