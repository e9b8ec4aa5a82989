// HMAC-SHA256 by nettle (Debian's nettle-dev), random nonces by getrandom (see auth.h).
#include "distributed/auth.h"

#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "base/check.h"

namespace tt::distributed::auth {
namespace {

std::string to_hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

}  // namespace

std::string random_hex(size_t n_bytes) {
  std::string bytes(n_bytes, '\0');
  size_t got = 0;
  while (got < n_bytes) {
    const ssize_t r = ::getrandom(bytes.data() + got, n_bytes - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw Error(str("distributed: getrandom() failed: ", std::strerror(errno)));
    got += (size_t)r;
  }
  return to_hex(reinterpret_cast<const unsigned char*>(bytes.data()), n_bytes);
}

bool is_hex(const std::string& s, size_t chars) {
  return s.size() == chars && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::string hmac_hex(const std::string& secret, const std::string& message) {
  hmac_sha256_ctx ctx;
  hmac_sha256_set_key(&ctx, secret.size(), reinterpret_cast<const uint8_t*>(secret.data()));
  hmac_sha256_update(&ctx, message.size(), reinterpret_cast<const uint8_t*>(message.data()));
  uint8_t digest[SHA256_DIGEST_SIZE];
  hmac_sha256_digest(&ctx, SHA256_DIGEST_SIZE, digest);
  return to_hex(digest, SHA256_DIGEST_SIZE);
}

bool same_mac(const std::string& a, const std::string& b) {
  return a.size() == b.size() && memeql_sec(a.data(), b.data(), a.size()) != 0;
}

}  // namespace tt::distributed::auth
