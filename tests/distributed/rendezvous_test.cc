// The TCP rendezvous on loopback: blobs move between ranks, and every failure (a rank that never
// comes, a master that is not there, a rank that dies or hangs mid-collective, ranks out of step,
// a bad hello; a peer that is silent, sends garbage, is of another job or announces a 1 TB
// message) ends every rank with an error naming host and rank within its time bound.
#include "distributed/rendezvous.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "base/check.h"
#include "distributed/auth.h"
#include "distributed/wire.h"
#include "tests/distributed/test_util.h"

namespace tt::distributed {
namespace {

using namespace testing;
using Clock = std::chrono::steady_clock;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(RendezvousTest, BroadcastAllGatherAndBarrierAcrossFourRanks) {
  auto rv = loopback_rendezvous(4, short_timeouts());
  expect_no_errors(on_ranks(4, [&](int r) {
    Rendezvous& me = *rv[r];
    EXPECT_EQ(me.rank(), r);
    EXPECT_EQ(me.world_size(), 4);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(me.host_of(k), "host" + std::to_string(k)) << "rank " << r;
    EXPECT_EQ(me.broadcast(r == 0 ? "the NCCL unique id" : "ignored"), "the NCCL unique id");
    EXPECT_EQ(me.broadcast(r == 2 ? std::string(300000, 'z') : "", 2), std::string(300000, 'z'));
    // Blobs of different sizes, one empty; binary bytes survive.
    std::string blob = r == 1 ? "" : std::string(r * 1000, char('a' + r));
    if (r == 3) blob[5] = '\0';
    const std::vector<std::string> all = me.all_gather(blob);
    ASSERT_EQ(all.size(), 4u);
    for (int k = 0; k < 4; ++k) {
      std::string want = k == 1 ? "" : std::string(k * 1000, char('a' + k));
      if (k == 3) want[5] = '\0';
      EXPECT_EQ(all[k], want) << "rank " << r << " blob of " << k;
    }
    for (int i = 0; i < 3; ++i) me.barrier();
  }));
}

TEST(RendezvousTest, OneRankNeedsNoNetwork) {
  auto rv = Rendezvous::connect(loopback_env(0, 1, 1), short_timeouts());
  EXPECT_EQ(rv->broadcast("x"), "x");
  EXPECT_EQ(rv->all_gather("y"), std::vector<std::string>{"y"});
  rv->barrier();
}

TEST(RendezvousTest, WorkerThatFindsNoMasterFailsWithinTheTimeout) {
  int port;
  {
    Listener l = bind_free_port();  // free a moment ago, closed now: connections are refused
    port = l.port;
  }
  const auto t0 = Clock::now();
  const auto errors = on_ranks(1, [&](int) { Rendezvous::connect(loopback_env(3, 4, port), short_timeouts(1)); });
  const double took = seconds_since(t0);
  EXPECT_TRUE(has(errors[0], "rank 3/4 on host host3 (local rank 3): cannot connect to master 127.0.0.1:" +
                                 std::to_string(port) + " within 1 s (last error: Connection refused)"))
      << errors[0];
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 3.0);
}

TEST(RendezvousTest, MasterNamesTheRanksThatNeverCame) {
  Listener l = bind_free_port();
  const auto t0 = Clock::now();
  std::vector<std::unique_ptr<Rendezvous>> rv(2);
  const auto errors = on_ranks(2, [&](int r) {
    const DistEnv env = loopback_env(r, 4, l.port);
    if (r == 0) {
      rv[0] = Rendezvous::connect_with_listener(env, short_timeouts(1), std::move(l.socket));
    } else {
      rv[1] = Rendezvous::connect(env, short_timeouts(5));
    }
  });
  EXPECT_TRUE(has(errors[0], "rank 0/4 on host host0 (local rank 0): only 2 of 4 ranks joined within 1 s on port " +
                                 std::to_string(l.port) + " (missing ranks 2, 3)"))
      << errors[0];
  // Rank 1 waited for the host table; rank 0 gave up and closed its connection.
  EXPECT_TRUE(has(errors[1], "rank 1/4 on host host1 (local rank 1): lost rank 0")) << errors[1];
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST(RendezvousTest, BadHellosAreRejectedWithTheReason) {
  {  // two processes claim rank 1
    Listener l = bind_free_port();
    std::vector<std::unique_ptr<Rendezvous>> rv(3);
    const auto errors = on_ranks(3, [&](int r) {
      if (r == 0) {
        rv[0] = Rendezvous::connect_with_listener(loopback_env(0, 3, l.port), short_timeouts(3), std::move(l.socket));
      } else {
        DistEnv env = loopback_env(1, 3, l.port);
        env.host = r == 1 ? "first" : "second";
        try {
          rv[r] = Rendezvous::connect(env, short_timeouts(3));
        } catch (...) {
          rv[r].reset();
          throw;
        }
      }
    });
    // Refused, not fatal: rank 0 goes on waiting for rank 2 (a stray connection claiming a rank
    // must not stop a job), and its timeout error names the refusal.
    EXPECT_TRUE(has(errors[0], "only 2 of 3 ranks joined within 3 s")) << errors[0];
    EXPECT_TRUE(has(errors[0], "was refused: rank 1 joined twice (from host ")) << errors[0];
    const std::string& loser = has(errors[1], "rejected") ? errors[1] : errors[2];
    EXPECT_TRUE(has(loser, "rejected by rank 0: rank 1 joined twice (from host ")) << errors[1] << " | " << errors[2];
  }
  {  // world sizes differ
    Listener l = bind_free_port();
    std::vector<std::unique_ptr<Rendezvous>> rv(2);
    const auto errors = on_ranks(2, [&](int r) {
      if (r == 0) {
        rv[0] = Rendezvous::connect_with_listener(loopback_env(0, 2, l.port), short_timeouts(3), std::move(l.socket));
      } else {
        rv[1] = Rendezvous::connect(loopback_env(1, 3, l.port), short_timeouts(3));
      }
    });
    EXPECT_TRUE(has(errors[0], "only 1 of 2 ranks joined within 3 s")) << errors[0];
    EXPECT_TRUE(has(errors[0], "was refused: rank 1 on host host1 has world size 3, rank 0 has 2")) << errors[0];
    EXPECT_TRUE(has(errors[1], "rejected by rank 0: rank 1 on host host1 has world size 3")) << errors[1];
  }
}

// Runs f on each rank; a rank whose f throws drops its rendezvous, as an exiting process would.
std::vector<std::string> run_and_drop_on_error(std::vector<std::unique_ptr<Rendezvous>>& rv,
                                               const std::function<void(int)>& f) {
  return on_ranks((int)rv.size(), [&](int r) {
    try {
      f(r);
    } catch (...) {
      rv[r].reset();
      throw;
    }
  });
}

TEST(RendezvousTest, RanksInDifferentCollectivesFailNamingBoth) {
  auto rv = loopback_rendezvous(2, short_timeouts());
  const auto t0 = Clock::now();
  const auto errors = run_and_drop_on_error(rv, [&](int r) {
    if (r == 0) rv[0]->barrier();
    if (r == 1) rv[1]->all_gather("x");
  });
  EXPECT_TRUE(has(errors[0], "rank 0/2 on host host0 (local rank 0): collective mismatch with rank 1 (host host1): "
                             "it is in all_gather #1, this rank in barrier #1"))
      << errors[0];
  EXPECT_TRUE(has(errors[1], "lost rank 0 (host host0) during all_gather #1")) << errors[1];
  EXPECT_LT(seconds_since(t0), 2.0);
}

TEST(RendezvousTest, ARankThatLeavesFailsTheOthersAtOnce) {
  // Rank 2 of 3 leaves (its process exits) while the others wait in a barrier: rank 0 sees the
  // connection close, fails, and its exit fails rank 1 in turn, all well within the timeouts.
  auto rv = loopback_rendezvous(3, short_timeouts(3, 30));
  const auto t0 = Clock::now();
  const auto errors = run_and_drop_on_error(rv, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      throw Error("rank 2 exits");
    }
    rv[r]->barrier();
  });
  EXPECT_TRUE(has(errors[0], "rank 0/3 on host host0 (local rank 0): lost rank 2 (host host2) during barrier #1: "
                             "connection closed"))
      << errors[0];
  EXPECT_TRUE(has(errors[1], "rank 1/3 on host host1 (local rank 1): lost rank 0 (host host0) during barrier #1"))
      << errors[1];
  EXPECT_LT(seconds_since(t0), 2.0);  // far below collective_timeout_s = 30
}

// The same in an all_gather: rank 1 says it lost rank 0, not that rank 0 sent something.
TEST(RendezvousTest, ARankThatLeavesDuringAnAllGatherIsNamedPlainly) {
  auto rv = loopback_rendezvous(3, short_timeouts(3, 30));
  const auto errors = run_and_drop_on_error(rv, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      throw Error("rank 2 exits");
    }
    rv[r]->all_gather("x");
  });
  EXPECT_TRUE(has(errors[1], "rank 1/3 on host host1 (local rank 1): lost rank 0 (host host0) during all_gather #1"))
      << errors[1];
  EXPECT_FALSE(has(errors[1], " sent ")) << errors[1];
}

TEST(RendezvousTest, AHungRankFailsTheCollectiveAfterItsTimeout) {
  auto rv = loopback_rendezvous(2, short_timeouts(3, 1));
  std::atomic<bool> done{false};
  const auto t0 = Clock::now();
  const auto errors = on_ranks(2, [&](int r) {
    if (r == 1) {  // alive and connected, but never joins
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    try {
      rv[0]->barrier();
    } catch (...) {
      done = true;
      throw;
    }
    done = true;
  });
  const double took = seconds_since(t0);
  EXPECT_TRUE(has(errors[0], "rank 0/2 on host host0 (local rank 0): rank 1 (host host1) did not send within 1 s "
                             "during barrier #1 (distributed.collective_timeout_s)"))
      << errors[0];
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 3.0);
}

TEST(RendezvousTest, AProcessThatExitsEarlyFailsItsPeerAtOnce) {
  // Rank 1 is a real process: it joins, then exits without taking part in the collective.
  Listener l = bind_free_port();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int code = 0;
    try {
      auto rv = Rendezvous::connect(loopback_env(1, 2, l.port), short_timeouts(3));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    } catch (...) {
      code = 3;
    }
    ::_exit(code);  // no gtest teardown in the child
  }
  std::string error;
  const auto t0 = Clock::now();
  try {
    auto rv = Rendezvous::connect_with_listener(loopback_env(0, 2, l.port), short_timeouts(3, 30), std::move(l.socket));
    rv->all_gather("mine");
  } catch (const Error& e) {
    error = e.what();
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(has(error, "rank 0/2 on host host0 (local rank 0): lost rank 1 (host host1) during all_gather #1"))
      << error;
  EXPECT_LT(seconds_since(t0), 2.0);
}

// Fake peers: raw sockets speaking as much of the protocol as a case needs.
net::Socket fake_connect(int port) {
  std::string err;
  net::Socket s = net::connect_until("127.0.0.1", port, net::deadline_after(3), &err);
  if (!s.valid()) throw Error("fake peer: cannot connect: " + err);
  return s;
}

std::string local_address(const net::Socket& s) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ::getsockname(s.fd(), (sockaddr*)&a, &len);
  return "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

void fake_send(const net::Socket& s, const std::string& bytes) {
  std::string err;
  ASSERT_EQ(net::send_all(s, bytes.data(), bytes.size(), net::deadline_after(3), &err), net::IoStatus::kOk) << err;
}

std::string header_bytes(Op op, uint64_t seq, uint64_t bytes) {
  char h[wire::kHeaderBytes];
  wire::encode_header({wire::kMagic, (uint32_t)op, seq, bytes}, h);
  return std::string(h, sizeof(h));
}

std::string message(Op op, uint64_t seq, const std::string& payload) { return header_bytes(op, seq, payload.size()) + payload; }

// A fake rank: reads rank 0's challenge and answers with a hello proving `secret`.
std::string fake_hello(const net::Socket& s, int rank, int world, const std::string& host, const std::string& secret,
                       const std::string& job_id = "") {
  char h[wire::kHeaderBytes];
  std::string err;
  EXPECT_EQ(net::recv_all(s, h, sizeof(h), net::deadline_after(3), &err), net::IoStatus::kOk) << err;
  const wire::Header header = wire::decode_header(h);
  EXPECT_EQ(header.op, (uint32_t)Op::kChallenge);
  EXPECT_EQ(header.bytes, auth::kNonceHexChars);
  std::string nonce(auth::kNonceHexChars, '\0');
  EXPECT_EQ(net::recv_all(s, nonce.data(), nonce.size(), net::deadline_after(3), &err), net::IoStatus::kOk) << err;
  wire::Hello hello{rank, world, host, !secret.empty(), auth::nonce(), "", job_id, job_id.empty() ? "" : "TT_JOB_ID"};
  hello.mac = wire::hello_mac(secret, nonce, hello);
  fake_send(s, message(Op::kHello, 0, wire::encode_hello(hello)));
  return nonce + "\n" + hello.nonce;
}

// The reason of rank 0's refusal, read from a fake peer's socket ("" when it sent something else).
std::string recv_reject(const net::Socket& s) {
  char h[wire::kHeaderBytes];
  std::string err;
  if (net::recv_all(s, h, sizeof(h), net::deadline_after(3), &err) != net::IoStatus::kOk) return "";
  const wire::Header header = wire::decode_header(h);
  if (header.op != (uint32_t)Op::kReject || header.bytes > wire::kMaxHelloBytes) return "";
  std::string why(header.bytes, '\0');
  if (net::recv_all(s, why.data(), why.size(), net::deadline_after(3), &err) != net::IoStatus::kOk) return "";
  return why;
}

// Seconds until the other end closes `s` (reading and discarding what comes); -1 after 5 s.
double seconds_until_closed(const net::Socket& s) {
  const auto t0 = Clock::now();
  char buf[4096];
  for (;;) {
    std::string err;
    size_t n = 0;
    const net::IoStatus st = net::recv_some(s, buf, sizeof(buf), &n, &err);
    if (st != net::IoStatus::kOk) return seconds_since(t0);
    if (seconds_since(t0) > 5) return -1;
    if (n == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

constexpr uint64_t kTerabyte = uint64_t(1) << 40;

TEST(RendezvousTest, ConnectionsThatAreNotRanksAreDroppedAndNamedWhenTheRendezvousTimesOut) {
  // Rank 0 of 2 waits 2 s; rank 1 never comes. A connection sending garbage and one announcing a
  // 1 TB hello are dropped at once; a silent one when its hello time (here the 2 s) ends.
  Listener l = bind_free_port();
  const int port = l.port;
  std::string error;
  const auto t0 = Clock::now();
  std::thread root([&] {
    try {
      Rendezvous::connect_with_listener(loopback_env(0, 2, port), short_timeouts(2), std::move(l.socket));
    } catch (const Error& e) {
      error = e.what();
    }
  });
  net::Socket garbage = fake_connect(port);
  fake_send(garbage, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  const double garbage_closed = seconds_until_closed(garbage);
  net::Socket huge = fake_connect(port);
  fake_send(huge, header_bytes(Op::kHello, 0, kTerabyte));
  const double huge_closed = seconds_until_closed(huge);
  net::Socket silent = fake_connect(port);
  const double silent_closed = seconds_until_closed(silent);
  root.join();
  const double took = seconds_since(t0);
  EXPECT_EQ(error, "rank 0/2 on host host0 (local rank 0): only 1 of 2 ranks joined within 2 s on port " +
                       std::to_string(port) +
                       " (missing rank 1); did they start, and can they reach MASTER_ADDR=127.0.0.1? Connections "
                       "refused or dropped: " +
                       local_address(garbage) +
                       " sent a message that is not treetrain's protocol (magic 0x20544547, expected 0x50447454); " +
                       local_address(huge) +
                       " announced a message of 1099511627776 bytes, more than the protocol's maximum of 4096 bytes; " +
                       local_address(silent) + " sent no hello within 2 s");
  EXPECT_GE(garbage_closed, 0);
  EXPECT_LT(garbage_closed, 1.0);  // at once, not after the 2 s
  EXPECT_GE(huge_closed, 0);
  EXPECT_LT(huge_closed, 1.0);
  EXPECT_GE(silent_closed, 0);  // every peer ends: rank 0 closed even the silent one
  EXPECT_GE(took, 1.9);
  EXPECT_LT(took, 4.0);
}

TEST(RendezvousTest, ASilentOrGarbageConnectionDelaysNoRank) {
  // With 3 s to join (and so 3 s for each hello), the real rank 1 joins at once although a silent
  // connection and a garbage one came first.
  Listener l = bind_free_port();
  const int port = l.port;
  net::Socket silent = fake_connect(port);
  net::Socket garbage = fake_connect(port);
  fake_send(garbage, std::string(100, '\x7f'));
  std::vector<std::unique_ptr<Rendezvous>> rv(2);
  const auto t0 = Clock::now();
  expect_no_errors(on_ranks(2, [&](int r) {
    const DistEnv env = loopback_env(r, 2, port);
    rv[r] = r == 0 ? Rendezvous::connect_with_listener(env, short_timeouts(3), std::move(l.socket))
                   : Rendezvous::connect(env, short_timeouts(3));
    rv[r]->barrier();
  }));
  EXPECT_LT(seconds_since(t0), 1.5);  // not after the silent connection's 3 s
  rv.clear();
  EXPECT_GE(seconds_until_closed(silent), 0);  // dropped when rank 0 ended
}

// A flood of stray connections (more than rank 0 keeps waiting for a hello) delays no rank: silent
// ones and ones stalled in a hello's first bytes are dropped, oldest first, to make room, and ones
// whose first byte cannot begin a hello at once; the real rank 1 joins long before any hello time
// ends.
class FloodTest : public ::testing::TestWithParam<int> {};  // 0 silent, 1 a garbage byte, 2 the magic, then silence

TEST_P(FloodTest, AFloodOfStrayConnectionsDelaysNoRank) {
  Listener l = bind_free_port();
  const int port = l.port;
  // Descriptors for what is open now, the flood's 200 client ends, rank 0's 64 waiting ones and a
  // few more: rank 0 accepting the whole flood would run out (accept: EMFILE) before rank 1.
  int open_now = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd"); it != std::filesystem::directory_iterator(); ++it)
    ++open_now;
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = std::min<rlim_t>(old.rlim_cur, (rlim_t)open_now + 200 + 64 + 24);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  struct Restore {  // the limit comes back however the test ends (a throw skips the lines below)
    rlimit old;
    ~Restore() { setrlimit(RLIMIT_NOFILE, &old); }
  } restore{old};
  std::vector<net::Socket> flood;
  char magic[4];
  const uint32_t m = wire::kMagic;
  std::memcpy(magic, &m, 4);
  for (int i = 0; i < 200; ++i) {
    flood.push_back(fake_connect(port));
    if (GetParam() == 1) ::send(flood.back().fd(), "X", 1, MSG_NOSIGNAL);
    if (GetParam() == 2) ::send(flood.back().fd(), magic, 4, MSG_NOSIGNAL);
  }
  std::vector<std::unique_ptr<Rendezvous>> rv(2);
  const auto t0 = Clock::now();
  const std::vector<std::string> errors = on_ranks(2, [&](int r) {
    const DistEnv env = loopback_env(r, 2, port);
    rv[r] = r == 0 ? Rendezvous::connect_with_listener(env, short_timeouts(5), std::move(l.socket))
                   : Rendezvous::connect(env, short_timeouts(5));
    rv[r]->barrier();
  });
  const double took = seconds_since(t0);
  rv.clear();
  flood.clear();
  expect_no_errors(errors);
  EXPECT_LT(took, 2.5);  // not after the stray connections' 5 s
}

INSTANTIATE_TEST_SUITE_P(Kinds, FloodTest, ::testing::Values(0, 1, 2), [](const ::testing::TestParamInfo<int>& i) {
  return std::string(i.param == 0 ? "Silent" : i.param == 1 ? "GarbageByte" : "MagicThenSilence");
});

// A job of more ranks than the stray-connection allowance (64), all connecting before rank 0
// listens: every one joins (none is dropped to make room).
TEST(RendezvousTest, AHundredRanksJoinThoughTheyConnectBeforeRankZeroPolls) {
  Listener l = bind_free_port();
  const int port = l.port;
  const int world = 100;
  std::vector<std::unique_ptr<Rendezvous>> rv(world);
  expect_no_errors(on_ranks(world, [&](int r) {
    const DistEnv env = loopback_env(r, world, port);
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others' hellos wait in the queue
      rv[0] = Rendezvous::connect_with_listener(env, short_timeouts(10), std::move(l.socket));
    } else {
      rv[r] = Rendezvous::connect(env, short_timeouts(10));
    }
    rv[r]->barrier();
  }));
}

TEST(RendezvousTest, ARankOfAnotherJobIsRefusedNamingBothJobIdsAndTheJobGoesOn) {
  Listener l = bind_free_port();
  const int port = l.port;
  std::vector<std::unique_ptr<Rendezvous>> rv(3);
  std::atomic<bool> refused{false};
  const auto t0 = Clock::now();
  const auto errors = on_ranks(3, [&](int r) {
    DistEnv env = loopback_env(r == 0 ? 0 : 1, 2, port);
    env.job_id = r == 2 ? "4242" : "launch-a-17";
    env.job_id_var = r == 2 ? "SLURM_JOB_ID" : "TT_JOB_ID";
    if (r == 0) {
      rv[0] = Rendezvous::connect_with_listener(env, short_timeouts(3), std::move(l.socket));
    } else if (r == 2) {  // another job's rank 1 reaches this port first
      try {
        rv[2] = Rendezvous::connect(env, short_timeouts(3));
      } catch (...) {
        refused = true;
        throw;
      }
    } else {
      while (!refused) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      rv[1] = Rendezvous::connect(env, short_timeouts(3));
    }
    if (r != 2) rv[r]->barrier();
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(errors[2],
            "rank 1/2 on host host1 (local rank 1): rejected by rank 0: job id mismatch: rank 1 on host host1 is of job "
            "'4242' (SLURM_JOB_ID), rank 0 on host host0 of job 'launch-a-17' (TT_JOB_ID) (another job's rank 0 on "
            "this master port, or a launcher that gave its ranks different ids)");
  EXPECT_LT(seconds_since(t0), 1.0);
}

TEST(RendezvousTest, ARankWithoutAJobIdIsRefusedByAJobWithOne) {
  Listener l = bind_free_port();
  const int port = l.port;
  std::vector<std::unique_ptr<Rendezvous>> rv(2);
  const auto errors = on_ranks(2, [&](int r) {
    DistEnv env = loopback_env(r, 2, port);
    if (r == 0) {
      env.job_id = "7";
      env.job_id_var = "TT_JOB_ID";
      rv[0] = Rendezvous::connect_with_listener(env, short_timeouts(1), std::move(l.socket));
    } else {
      rv[1] = Rendezvous::connect(env, short_timeouts(1));
    }
  });
  EXPECT_EQ(errors[1],
            "rank 1/2 on host host1 (local rank 1): rejected by rank 0: job id mismatch: rank 1 on host host1 is of job "
            "none (no TT_JOB_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID), rank 0 on host host0 of job '7' (TT_JOB_ID) "
            "(another job's rank 0 on this master port, or a launcher that gave its ranks different ids)");
  EXPECT_TRUE(has(errors[0], "only 1 of 2 ranks joined within 1 s")) << errors[0];
  EXPECT_TRUE(has(errors[0], " was refused: job id mismatch: rank 1 on host host1 is of job none")) << errors[0];
}

// A fake rank 1 that joins properly, then announces a 1 TB message in the first collective.
TEST(RendezvousTest, AJoinedRankAnnouncingATerabyteMessageFailsRankZeroAtOnce) {
  Listener l = bind_free_port();
  const int port = l.port;
  std::string error;
  const auto t0 = Clock::now();
  std::thread root([&] {
    try {
      auto rv = Rendezvous::connect_with_listener(loopback_env(0, 2, port), short_timeouts(3, 30), std::move(l.socket));
      rv->all_gather("mine");
    } catch (const Error& e) {
      error = e.what();
    }
  });
  net::Socket fake = fake_connect(port);
  fake_hello(fake, 1, 2, "fake", kTestSecret);
  fake_send(fake, header_bytes(Op::kAllGather, 1, kTerabyte));
  const double closed = seconds_until_closed(fake);
  root.join();
  EXPECT_EQ(error, "rank 0/2 on host host0 (local rank 0): rank 1 (host fake) announced a message of 1099511627776 "
                   "bytes, more than the protocol's maximum of 67108864 bytes during all_gather #1");
  EXPECT_GE(closed, 0);
  EXPECT_LT(seconds_since(t0), 1.0);  // far below collective_timeout_s = 30
}

// Fake masters: what a worker does when the process at MASTER_ADDR:MASTER_PORT is not rank 0.
std::string worker_against_fake_master(const std::function<void(net::Socket&)>& master, double timeout_s) {
  Listener l = bind_free_port();
  std::thread fake([&] {
    net::Socket s = net::accept_until(l.socket, net::deadline_after(3));
    if (s.valid()) master(s);
  });
  std::string error;
  try {
    Rendezvous::connect(loopback_env(1, 2, l.port), short_timeouts(timeout_s));
  } catch (const Error& e) {
    error = e.what();
  }
  fake.join();
  return error;
}

TEST(RendezvousTest, AWorkerFailsOnASilentMasterWithinTheTimeout) {
  const auto t0 = Clock::now();
  const std::string error = worker_against_fake_master(
      [](net::Socket& s) {
        EXPECT_GE(seconds_until_closed(s), 0);  // the worker gives up and closes
      },
      1);
  const double took = seconds_since(t0);
  EXPECT_EQ(error, "rank 1/2 on host host1 (local rank 1): rank 0 (host 127.0.0.1) did not complete the rendezvous "
                   "within 1 s (distributed.timeout_s); did every rank start?");
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 3.0);  // timeout_s + 1: rank 0 may have started accepting before this worker
}

TEST(RendezvousTest, AWorkerFailsAtOnceOnAGarbageOrTerabyteChallengeOrWelcome) {
  // Each fake master keeps its end open until the worker gives up: closing it at once would race the worker's
  // hello (a reset connection fails the hello with EPIPE before the welcome is read).
  const auto answer = [](const std::string& bytes) {
    return [bytes](net::Socket& s) {
      fake_send(s, bytes);
      EXPECT_GE(seconds_until_closed(s), 0);
    };
  };
  const std::string tag = "rank 1/2 on host host1 (local rank 1): rank 0 (host 127.0.0.1) ";
  const auto t0 = Clock::now();
  std::string error = worker_against_fake_master(answer(std::string(64, 'A')), 3);
  EXPECT_EQ(error, tag + "sent a message that is not treetrain's protocol (magic 0x41414141, expected 0x50447454) "
                         "during challenge #0");
  error = worker_against_fake_master(answer(header_bytes(Op::kChallenge, 0, kTerabyte)), 3);
  EXPECT_EQ(error, tag + "announced a message of 1099511627776 bytes, more than the protocol's maximum of 67108864 "
                         "bytes during challenge #0");
  error = worker_against_fake_master(answer(message(Op::kChallenge, 0, "xyz")), 3);
  EXPECT_EQ(error, tag + "sent a malformed challenge 'xyz' (expected 32 hex digits) during challenge #0 (is something "
                         "other than treetrain's rank 0 on MASTER_PORT?)");
  // A proper challenge, then a bad welcome.
  const std::string challenge = message(Op::kChallenge, 0, std::string(32, 'c'));
  error = worker_against_fake_master(answer(challenge + std::string(64, 'A')), 3);
  EXPECT_EQ(error, tag + "sent a message that is not treetrain's protocol (magic 0x41414141, expected 0x50447454) "
                         "during welcome #0");
  error = worker_against_fake_master(answer(challenge + header_bytes(Op::kWelcome, 0, kTerabyte)), 3);
  EXPECT_EQ(error, tag + "announced a message of 1099511627776 bytes, more than the protocol's maximum of 67108864 "
                         "bytes during welcome #0");
  error = worker_against_fake_master(answer(challenge + message(Op::kWelcome, 0, "a\nb c\n")), 3);
  EXPECT_EQ(error, tag + "sent a malformed welcome 'a?b c?' (expected a line of 64 hex digits, then the host table) "
                         "during welcome #0");
  const std::string mac(64, 'f');
  error = worker_against_fake_master(answer(challenge + message(Op::kWelcome, 0, mac + "\na\nb c\n")), 3);
  EXPECT_EQ(error, tag + "sent a host table with a bad host name 'b c' on line 2 during welcome #0");
  EXPECT_LT(seconds_since(t0), 1.0);
}

// A fake master that knows the protocol but not the job's secret: its welcome cannot prove it.
TEST(RendezvousTest, AWorkerRefusesARankZeroThatDoesNotProveTheSecret) {
  const std::string error = worker_against_fake_master(
      [](net::Socket& s) {
        const std::string root_nonce = auth::nonce();
        fake_send(s, message(Op::kChallenge, 0, root_nonce));
        char h[wire::kHeaderBytes];
        std::string err;
        ASSERT_EQ(net::recv_all(s, h, sizeof(h), net::deadline_after(3), &err), net::IoStatus::kOk) << err;
        std::string hello(wire::decode_header(h).bytes, '\0');
        ASSERT_EQ(net::recv_all(s, hello.data(), hello.size(), net::deadline_after(3), &err), net::IoStatus::kOk);
        const wire::Hello got = wire::decode_hello(hello);
        EXPECT_TRUE(got.secret_set);
        EXPECT_EQ(hello.find(kTestSecret), std::string::npos) << "the secret never crosses the network";
        const std::string table = "host0\nhost1\n";
        const std::string mac = wire::welcome_mac("another-secret-of-16", root_nonce, got.nonce, table);
        fake_send(s, message(Op::kWelcome, 0, wire::encode_welcome(mac, table)));
        EXPECT_GE(seconds_until_closed(s), 0);
      },
      3);
  EXPECT_EQ(error.rfind("rank 1/2 on host host1 (local rank 1): the rank 0 at 127.0.0.1:", 0), 0u) << error;
  EXPECT_TRUE(has(error, " did not prove this rank's TT_JOB_SECRET in its welcome (another job's rank 0 on this port, "
                         "or ranks started with different secrets)"))
      << error;
}

// A process that knows the job id and claims rank 1 but not the secret (a stale rank of an earlier
// attempt, or an impostor) is refused at once; the real rank 1 then joins and the job runs.
TEST(RendezvousTest, ARankWithoutTheSecretIsRefusedAndTheRealOneStillJoins) {
  Listener l = bind_free_port();
  const int port = l.port;
  DistEnv root_env = loopback_env(0, 2, port);
  root_env.job_id = "job-7";
  root_env.job_id_var = "TT_JOB_ID";
  std::vector<std::string> gathered;
  std::string root_error;
  const auto t0 = Clock::now();
  std::thread root([&] {
    try {
      auto rv = Rendezvous::connect_with_listener(root_env, short_timeouts(3, 3), std::move(l.socket));
      gathered = rv->all_gather("zero");
    } catch (const Error& e) {
      root_error = e.what();
    }
  });
  // The impostor: right job id, wrong secret; then one with no secret at all.
  net::Socket impostor = fake_connect(port);
  fake_hello(impostor, 1, 2, "stale", "an-earlier-attempt-secret", "job-7");
  const std::string refusal = recv_reject(impostor);
  EXPECT_EQ(refusal, "rank 1 on host stale did not prove rank 0's TT_JOB_SECRET (its secret differs: one of them belongs "
                     "to another attempt of this job, or the peer knows only the job id)");
  net::Socket bare = fake_connect(port);
  fake_hello(bare, 1, 2, "bare", "", "job-7");
  EXPECT_EQ(recv_reject(bare), "rank 1 on host bare has no TT_JOB_SECRET and rank 0 on host host0 has one (every rank "
                               "needs the same one)");
  // The real rank 1.
  DistEnv env = loopback_env(1, 2, port);
  env.job_id = "job-7";
  env.job_id_var = "TT_JOB_ID";
  std::string error;
  try {
    auto rv = Rendezvous::connect(env, short_timeouts(3, 3));
    EXPECT_EQ(rv->all_gather("one"), (std::vector<std::string>{"zero", "one"}));
  } catch (const Error& e) {
    error = e.what();
  }
  root.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(root_error, "");
  EXPECT_EQ(gathered, (std::vector<std::string>{"zero", "one"}));
  EXPECT_LT(seconds_since(t0), 1.5);  // no timeout was waited out
}

// A rank whose connection closes after its hello, before every rank joined (a crash, a restart):
// its restarted process takes its place instead of being refused as a rank that joined twice, and
// the job starts.
TEST(RendezvousTest, ARankThatClosesBeforeTheWelcomeMayRejoin) {
  Listener l = bind_free_port();
  const int port = l.port;
  std::vector<std::string> gathered;
  std::string root_error;
  std::thread root([&] {
    try {
      auto rv = Rendezvous::connect_with_listener(loopback_env(0, 3, port), short_timeouts(3, 3), std::move(l.socket));
      gathered = rv->all_gather("zero");
    } catch (const Error& e) {
      root_error = e.what();
    }
  });
  {
    net::Socket crashed = fake_connect(port);
    fake_hello(crashed, 1, 3, "crashed", kTestSecret);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 0 has taken the hello
  }  // closed
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::vector<std::string> got(3);
  const std::vector<std::string> errors = on_ranks(3, [&](int r) {
    if (r == 0) return;
    auto rv = Rendezvous::connect(loopback_env(r, 3, port), short_timeouts(3, 3));
    got[r] = rv->all_gather(r == 1 ? "one" : "two")[r];
  });
  root.join();
  expect_no_errors(errors);
  EXPECT_EQ(root_error, "");
  EXPECT_EQ(gathered, (std::vector<std::string>{"zero", "one", "two"}));
}

// Ranks without a secret (torchrun without TT_JOB_SECRET): the job id alone admits them.
TEST(RendezvousTest, RanksWithoutASecretStillJoin) {
  Listener l = bind_free_port();
  const int port = l.port;
  std::vector<std::unique_ptr<Rendezvous>> rv(3);
  expect_no_errors(on_ranks(3, [&](int r) {
    DistEnv env = loopback_env(r, 3, port);
    env.secret = "";
    rv[r] = r == 0 ? Rendezvous::connect_with_listener(env, short_timeouts(), std::move(l.socket))
                   : Rendezvous::connect(env, short_timeouts());
  }));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(rv[r]->host_of(2), "host2");
}

// A rank with a secret and one without: the worker is told why at once.
TEST(RendezvousTest, RanksWithAndWithoutASecretFailWithTheReason) {
  Listener l = bind_free_port();
  const int port = l.port;
  std::vector<std::string> errors(2);
  std::thread root([&] {
    try {
      Rendezvous::connect_with_listener(loopback_env(0, 2, port), short_timeouts(1), std::move(l.socket));
    } catch (const Error& e) {
      errors[0] = e.what();
    }
  });
  DistEnv env = loopback_env(1, 2, port);
  env.secret = "";
  try {
    Rendezvous::connect(env, short_timeouts(1));
  } catch (const Error& e) {
    errors[1] = e.what();
  }
  root.join();
  EXPECT_EQ(errors[1], "rank 1/2 on host host1 (local rank 1): rejected by rank 0: rank 1 on host host1 has no "
                       "TT_JOB_SECRET and rank 0 on host host0 has one (every rank needs the same one)");
  EXPECT_TRUE(has(errors[0], " was refused: rank 1 on host host1 has no TT_JOB_SECRET")) << errors[0];
}

TEST(RendezvousTest, ABlobOverTheMessageLimitIsRefusedBeforeSending) {
  auto rv = loopback_rendezvous(2, short_timeouts());
  const auto errors = run_and_drop_on_error(rv, [&](int r) {
    rv[r]->broadcast(r == 0 ? std::string(wire::kMaxMessageBytes + 1, 'x') : "");
  });
  EXPECT_TRUE(has(errors[0], "rank 0/2 on host host0 (local rank 0): a message of 67108865 bytes to rank 1 (host "
                             "host1) during broadcast #1 is larger than the protocol's maximum of 67108864 bytes"))
      << errors[0];
  EXPECT_TRUE(has(errors[1], "lost rank 0 (host host0) during broadcast #1")) << errors[1];
}

}  // namespace
}  // namespace tt::distributed
