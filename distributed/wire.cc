// The rendezvous's wire format (see wire.h).
#include "distributed/wire.h"

#include <cstring>
#include <iomanip>
#include <sstream>

#include "base/check.h"
#include "distributed/auth.h"

namespace tt::distributed::wire {
namespace {

// A decimal in [0, 2^20] (a rank or a world size), the whole of `s`.
bool parse_count(const std::string& s, int* out) {
  if (s.empty() || s.size() > 7) return false;
  long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > (1 << 20)) return false;
  *out = (int)v;
  return true;
}

bool is_host_name(const std::string& s) {
  if (s.empty() || s.size() > kMaxHostBytes) return false;
  for (unsigned char c : s)
    if (c <= ' ' || c == 0x7f) return false;
  return true;
}

std::string hex32(uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(8) << std::setfill('0') << v;
  return os.str();
}

// A short printable excerpt of untrusted text, for messages.
std::string excerpt(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 64; ++i) {
    const unsigned char c = (unsigned char)s[i];
    out += (c >= ' ' && c < 0x7f) ? (char)c : '?';
  }
  return out + (s.size() > 64 ? "..." : "");
}

}  // namespace

void encode_header(const Header& h, char out[kHeaderBytes]) {
  std::memcpy(out, &h.magic, 4);
  std::memcpy(out + 4, &h.op, 4);
  std::memcpy(out + 8, &h.seq, 8);
  std::memcpy(out + 16, &h.bytes, 8);
}

Header decode_header(const char in[kHeaderBytes]) {
  Header h;
  std::memcpy(&h.magic, in, 4);
  std::memcpy(&h.op, in + 4, 4);
  std::memcpy(&h.seq, in + 8, 8);
  std::memcpy(&h.bytes, in + 16, 8);
  return h;
}

std::string header_problem(const Header& h, uint64_t max_bytes) {
  if (h.magic != kMagic)
    return str("sent a message that is not treetrain's protocol (magic ", hex32(h.magic), ", expected ", hex32(kMagic),
               ")");
  if (h.bytes > max_bytes)
    return str("announced a message of ", h.bytes, " bytes, more than the protocol's maximum of ", max_bytes, " bytes");
  return "";
}

std::string encode_hello(const Hello& h) {
  return str(h.rank, " ", h.world_size, " ", h.host, "\n", h.secret_set ? 1 : 0, " ", h.nonce, " ", h.mac, "\n",
             h.job_id_var, "\n", h.job_id);
}

Hello decode_hello(const std::string& text) {
  if (text.size() > kMaxHelloBytes) throw Error(str("a hello of ", text.size(), " bytes (at most ", kMaxHelloBytes, ")"));
  const size_t nl = text.find('\n');
  const size_t nl2 = nl == std::string::npos ? std::string::npos : text.find('\n', nl + 1);
  const size_t nl3 = nl2 == std::string::npos ? std::string::npos : text.find('\n', nl2 + 1);
  const std::string first = text.substr(0, nl);
  const size_t s1 = first.find(' ');
  const size_t s2 = s1 == std::string::npos ? std::string::npos : first.find(' ', s1 + 1);
  Hello h;
  if (nl3 == std::string::npos || s2 == std::string::npos || !parse_count(first.substr(0, s1), &h.rank) ||
      !parse_count(first.substr(s1 + 1, s2 - s1 - 1), &h.world_size) || !is_host_name(first.substr(s2 + 1)))
    throw Error(str("a malformed hello '", excerpt(text),
                    "' (expected '<rank> <world size> <host>', a proof line, a job id variable line and a job id "
                    "line)"));
  h.host = first.substr(s2 + 1);
  const std::string proof = text.substr(nl + 1, nl2 - nl - 1);
  const size_t p1 = proof.find(' ');
  const size_t p2 = p1 == std::string::npos ? std::string::npos : proof.find(' ', p1 + 1);
  const std::string flag = proof.substr(0, p1);
  if (p2 == std::string::npos || (flag != "0" && flag != "1") ||
      !auth::is_hex(proof.substr(p1 + 1, p2 - p1 - 1), auth::kNonceHexChars) ||
      !auth::is_hex(proof.substr(p2 + 1), auth::kMacHexChars))
    throw Error(str("a hello with a malformed proof line '", excerpt(proof),
                    "' (expected '<0|1> <32 hex digits> <64 hex digits>')"));
  h.secret_set = flag == "1";
  h.nonce = proof.substr(p1 + 1, p2 - p1 - 1);
  h.mac = proof.substr(p2 + 1);
  h.job_id_var = text.substr(nl2 + 1, nl3 - nl2 - 1);
  h.job_id = text.substr(nl3 + 1);
  if (h.job_id_var.size() > kMaxJobIdVarBytes || (!h.job_id_var.empty() && !is_host_name(h.job_id_var)))
    throw Error(str("a hello with a bad job id variable '", excerpt(h.job_id_var), "'"));
  if (h.job_id.size() > kMaxJobIdBytes)
    throw Error(str("a hello whose job id has ", h.job_id.size(), " bytes (at most ", kMaxJobIdBytes, ")"));
  return h;
}

std::string hello_mac(const std::string& secret, const std::string& root_nonce, const Hello& h) {
  return auth::hmac_hex(secret, str("treetrain hello\n", root_nonce, "\n", h.nonce, "\n", h.rank, " ", h.world_size,
                                    " ", h.host, "\n", h.secret_set ? 1 : 0, "\n", h.job_id_var, "\n", h.job_id));
}

std::string welcome_mac(const std::string& secret, const std::string& root_nonce, const std::string& worker_nonce,
                        const std::string& table) {
  return auth::hmac_hex(secret, str("treetrain welcome\n", root_nonce, "\n", worker_nonce, "\n", table));
}

std::string decode_challenge(const std::string& text) {
  if (!auth::is_hex(text, auth::kNonceHexChars))
    throw Error(str("a malformed challenge '", excerpt(text), "' (expected ", auth::kNonceHexChars, " hex digits)"));
  return text;
}

std::string encode_welcome(const std::string& mac, const std::string& table) { return mac + "\n" + table; }

Welcome decode_welcome(const std::string& text) {
  const size_t nl = text.find('\n');
  if (nl == std::string::npos || !auth::is_hex(text.substr(0, nl), auth::kMacHexChars))
    throw Error(str("a malformed welcome '", excerpt(text), "' (expected a line of ", auth::kMacHexChars,
                    " hex digits, then the host table)"));
  return {text.substr(0, nl), text.substr(nl + 1)};
}

std::string encode_host_table(const std::vector<std::string>& hosts) {
  std::string table;
  for (const std::string& h : hosts) table += h + "\n";
  return table;
}

std::vector<std::string> decode_host_table(const std::string& text, int world) {
  std::vector<std::string> hosts;
  size_t at = 0;
  while (at < text.size()) {
    const size_t nl = text.find('\n', at);
    if (nl == std::string::npos) throw Error("a host table whose last line is not ended");
    hosts.push_back(text.substr(at, nl - at));
    if (!is_host_name(hosts.back()))
      throw Error(str("a host table with a bad host name '", excerpt(hosts.back()), "' on line ", hosts.size()));
    if ((int)hosts.size() > world) break;
    at = nl + 1;
  }
  if ((int)hosts.size() != world)
    throw Error(str("a host table of ", hosts.size(), hosts.size() > (size_t)world ? " or more" : "", " hosts for ",
                    world, " ranks"));
  return hosts;
}

std::string pack_blobs(const std::vector<std::string>& blobs) {
  std::string packed;
  for (const std::string& b : blobs) {
    const uint64_t n = b.size();
    packed.append(reinterpret_cast<const char*>(&n), sizeof(n));
    packed += b;
  }
  return packed;
}

std::vector<std::string> unpack_blobs(const std::string& packed, int world) {
  std::vector<std::string> all(world);
  size_t at = 0;
  for (int r = 0; r < world; ++r) {
    uint64_t n = 0;
    if (packed.size() - at < sizeof(n))
      throw Error(str("a truncated all_gather reply (", packed.size(), " bytes, rank ", r, "'s length missing)"));
    std::memcpy(&n, packed.data() + at, sizeof(n));
    at += sizeof(n);
    if (n > packed.size() - at)
      throw Error(str("a truncated all_gather reply (rank ", r, "'s blob of ", n, " bytes, ", packed.size() - at,
                      " left)"));
    all[r] = packed.substr(at, n);
    at += n;
  }
  if (at != packed.size())
    throw Error(str("an all_gather reply with ", packed.size() - at, " bytes after the last of ", world, " blobs"));
  return all;
}

}  // namespace tt::distributed::wire
