// Loopback worlds for the distributed tests: W ranks as threads of the test process, joined by
// the real rendezvous over 127.0.0.1 on a port the OS picks (rank 0's listener is bound to port 0
// before any rank starts, so there is no race for the port).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/env.h"
#include "distributed/rendezvous.h"

namespace tt::distributed::testing {

// Every loopback rank has this job secret (auth.h) unless a test says otherwise.
inline const char* const kTestSecret = "loopback-test-secret";

inline DistEnv loopback_env(int rank, int world, int port) {
  DistEnv e;
  e.secret = kTestSecret;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank;
  e.local_world_size = world;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  e.host = "host" + std::to_string(rank);
  e.source = "test";
  return e;
}

// Runs f(rank) on `world` threads and waits; returns each rank's exception message ("" if none).
inline std::vector<std::string> on_ranks(int world, const std::function<void(int)>& f) {
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  return errors;
}

inline void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// A bound listener for rank 0 and its port.
struct Listener {
  net::Socket socket;
  int port = 0;
};
inline Listener bind_free_port() {
  Listener l;
  l.socket = net::listen_on(0, "test");
  l.port = net::local_port(l.socket);
  return l;
}

// `world` connected rendezvous, by rank.
inline std::vector<std::unique_ptr<Rendezvous>> loopback_rendezvous(int world, const RendezvousOptions& options) {
  Listener l = bind_free_port();
  std::vector<std::unique_ptr<Rendezvous>> out(world);
  expect_no_errors(on_ranks(world, [&](int r) {
    const DistEnv env = loopback_env(r, world, l.port);
    out[r] = r == 0 ? Rendezvous::connect_with_listener(env, options, std::move(l.socket))
                    : Rendezvous::connect(env, options);
  }));
  return out;
}

inline std::vector<std::unique_ptr<Communicator>> loopback_world(int world, const RendezvousOptions& options) {
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& rv : loopback_rendezvous(world, options)) out.push_back(make_cpu_communicator(std::move(rv)));
  return out;
}

inline RendezvousOptions short_timeouts(double timeout_s = 3, double collective_timeout_s = 3) {
  RendezvousOptions o;
  o.timeout_s = timeout_s;
  o.collective_timeout_s = collective_timeout_s;
  return o;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline std::filesystem::path test_dir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::filesystem::path d = (t ? std::filesystem::path(t) : std::filesystem::temp_directory_path()) / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace tt::distributed::testing
