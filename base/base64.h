// Base64 (RFC 4648, standard alphabet, '=' padding), for images inside JSON messages (the policy
// server, the nav environment's stdio protocol).
#pragma once

#include <string>

namespace tt {

std::string base64_encode(const std::string& bytes);
// Throws tt::Error naming `what` for a character outside the alphabet, bad padding or a length
// that is not a multiple of 4 (whitespace is not allowed).
std::string base64_decode(const std::string& text, const std::string& what);

}  // namespace tt
