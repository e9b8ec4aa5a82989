// The TCP rendezvous on loopback: blobs move between ranks, and every failure (a rank that never
// comes, a master that is not there, a rank that dies or hangs mid-collective, ranks out of step,
// a bad hello) ends every rank with an error naming host and rank within its time bound.
#include "distributed/rendezvous.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "base/check.h"
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
    EXPECT_TRUE(has(errors[0], "bad rendezvous: rank 1 joined twice")) << errors[0];
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
    EXPECT_TRUE(has(errors[0], "rank 1 on host host1 has world size 3, rank 0 has 2")) << errors[0];
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

}  // namespace
}  // namespace tt::distributed
