// The rendezvous's proof of a per-job secret (TT_JOB_SECRET, env.h): who joins as a rank, and who
// answers as rank 0, must know it.
//
// The job id keeps other jobs out, but anyone can read it (SLURM_JOB_ID is public; a stale rank of
// an earlier attempt of a requeued job has the same one). A process that knows only the id could
// take a rank's place and hold the job in its first collective for collective_timeout_s. With a
// secret, rank 0 sends every connection a fresh nonce (the challenge); the worker answers with an
// HMAC-SHA256 over both nonces and its hello, and rank 0's welcome carries an HMAC over both nonces
// and the host table. The secret never crosses the network, a recorded hello does not answer
// another challenge, and a worker learns that it reached its own job's rank 0. This is
// authentication, not encryption: collectives after the welcome are not signed.
//
// Without a secret on either side the same exchange runs with an empty key, which proves nothing:
// the job id alone admits a rank, as before. treetrain launch makes one per launch; the SLURM
// script makes one per job attempt (scripts/slurm/train.sbatch).
#pragma once

#include <string>

namespace tt::distributed::auth {

constexpr size_t kNonceHexChars = 32;  // 128 random bits
constexpr size_t kMacHexChars = 64;    // HMAC-SHA256
constexpr size_t kMinSecretChars = 16;

// n random bytes from the kernel (getrandom), as 2n lowercase hex digits. Throws tt::Error.
std::string random_hex(size_t n_bytes);

// A fresh nonce: kNonceHexChars random hex digits.
inline std::string nonce() { return random_hex(kNonceHexChars / 2); }

// Whether s is exactly `chars` lowercase hex digits.
bool is_hex(const std::string& s, size_t chars);

// HMAC-SHA256(secret, message) as lowercase hex.
std::string hmac_hex(const std::string& secret, const std::string& message);

// Equality of two MACs in time independent of where they differ.
bool same_mac(const std::string& a, const std::string& b);

}  // namespace tt::distributed::auth
