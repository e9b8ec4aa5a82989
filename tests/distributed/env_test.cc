// Launcher environments: SLURM host lists, torchrun and SLURM variables, auto detection, errors
// that name the variable, and the GPU of a local rank.
#include "distributed/env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "base/check.h"

namespace tt::distributed {
namespace {

using Vars = std::map<std::string, std::string>;

DistEnv read(const std::string& mode, const Vars& vars) {
  return read_env(mode, [&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// A torchrun-style rank 1 of 2, and vars with more set.
const Vars kTorchrun = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "a"},
                        {"MASTER_PORT", "29500"}};
Vars with(Vars v, const Vars& extra) {
  v.insert(extra.begin(), extra.end());
  return v;
}

std::string error_of(const std::string& mode, const Vars& vars) {
  try {
    read(mode, vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

using Hosts = std::vector<std::string>;

TEST(NodelistTest, ExpandsRangesListsAndPadding) {
  EXPECT_EQ(expand_nodelist("gpu[01-03,07],cpu5"), (Hosts{"gpu01", "gpu02", "gpu03", "gpu07", "cpu5"}));
  EXPECT_EQ(expand_nodelist("node7"), (Hosts{"node7"}));
  EXPECT_EQ(expand_nodelist("a,b,c"), (Hosts{"a", "b", "c"}));
  EXPECT_EQ(expand_nodelist("n[8-11]"), (Hosts{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand_nodelist("n[098-101]"), (Hosts{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_nodelist("rack[1-2]-gpu[0-1]"), (Hosts{"rack1-gpu0", "rack1-gpu1", "rack2-gpu0", "rack2-gpu1"}));
  EXPECT_EQ(expand_nodelist("x[3]"), (Hosts{"x3"}));
  EXPECT_EQ(expand_nodelist("gpu-a100-[1-2].cluster"), (Hosts{"gpu-a100-1.cluster", "gpu-a100-2.cluster"}));
}

TEST(NodelistTest, MalformedListsAreErrors) {
  for (const std::string bad : {"", "gpu[01-03", "gpu]01[", "gpu[]", "gpu[3-1]", "gpu[a-b]", "a,,b", "gpu[1-2],"}) {
    EXPECT_THROW(expand_nodelist(bad), Error) << bad;
  }
  try {
    expand_nodelist("gpu[3-1]");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'3-1'"), std::string::npos) << e.what();
  }
  // Bracket groups multiply: a list naming 10^10 hosts is an error before any is built.
  try {
    expand_nodelist("n[0-99999][0-99999]");
    ADD_FAILURE() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "host list 'n[0-99999][0-99999]' names more than 131072 hosts");
  }
  EXPECT_EQ(expand_nodelist("n[0-99999]").size(), 100000u);
}

TEST(EnvTest, TorchrunVariables) {
  const DistEnv e = read("torchrun", {{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                                      {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_TRUE(e.distributed());
  EXPECT_FALSE(e.host.empty());
  EXPECT_NE(e.describe().find("rank 3/8 on host "), std::string::npos) << e.describe();
}

TEST(EnvTest, SlurmVariables) {
  Vars v = {{"SLURM_PROCID", "5"},        {"SLURM_NTASKS", "16"},
            {"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_LOCALID", "1"},
            {"SLURM_JOB_ID", "123456"},    {"SLURM_JOB_NODELIST", "gpu[01-02,07]"},
            {"SLURM_STEP_NODELIST", "gpu[02,07]"}};
  DistEnv e = read("slurm", v);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);  // the step's task count wins over the allocation's
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "gpu02");  // the first host of the step
  EXPECT_EQ(e.master_port, 20000 + 123456 % 10000);
  EXPECT_EQ(e.source, "slurm");
  // Without srun's step variables: the allocation's; MASTER_ADDR / MASTER_PORT override.
  v.erase("SLURM_STEP_NUM_TASKS");
  v.erase("SLURM_STEP_NODELIST");
  e = read("slurm", v);
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.master_addr, "gpu01");
  v["MASTER_ADDR"] = "10.1.2.3";
  v["MASTER_PORT"] = "31000";
  e = read("slurm", v);
  EXPECT_EQ(e.master_addr, "10.1.2.3");
  EXPECT_EQ(e.master_port, 31000);
}

TEST(EnvTest, AutoPicksTheLauncher) {
  EXPECT_EQ(read("auto", {}).source, "none");
  EXPECT_EQ(read("auto", {}).world_size, 1);
  const Vars torchrun = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "h"},
                         {"MASTER_PORT", "1234"}};
  EXPECT_EQ(read("auto", torchrun).source, "torchrun");
  // An sbatch script's own shell: SLURM_PROCID=0 and the allocation's task count, but no srun
  // step. That is one process, not rank 0 of 16 waiting for ranks that srun never started.
  const Vars batch_shell = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "0"},
                            {"SLURM_JOB_NODELIST", "gpu[01-02]"}, {"SLURM_JOB_ID", "7"}};
  EXPECT_EQ(read("auto", batch_shell).world_size, 1);
  Vars srun = batch_shell;
  srun["SLURM_STEP_NUM_TASKS"] = "16";
  EXPECT_EQ(read("auto", srun).source, "slurm");
  EXPECT_EQ(read("auto", srun).world_size, 16);
  // torchrun variables win (treetrain launch inside an allocation).
  Vars both = srun;
  both.insert(torchrun.begin(), torchrun.end());
  EXPECT_EQ(read("auto", both).source, "torchrun");
  EXPECT_EQ(read("off", both).world_size, 1);
  // RANK of a world that is not given: an error, not a lone rank 1 training as the whole job.
  EXPECT_EQ(error_of("auto", {{"RANK", "1"}}),
            "distributed: environment variable RANK is 1 but WORLD_SIZE is not set (a torchrun-style launch sets "
            "both; distributed.mode: off trains as one process whatever they say)");
  EXPECT_EQ(read("auto", {{"RANK", "0"}}).world_size, 1);
  EXPECT_EQ(read("off", {{"RANK", "1"}}).world_size, 1);
}

TEST(EnvTest, ErrorsNameTheVariable) {
  EXPECT_NE(error_of("torchrun", {{"WORLD_SIZE", "2"}}).find("environment variable RANK is not set"), std::string::npos);
  EXPECT_NE(error_of("torchrun", {{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"}})
                .find("MASTER_PORT is not set"),
            std::string::npos);
  const std::string bad_port = error_of("torchrun", {{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"LOCAL_RANK", "0"},
                                                     {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}});
  EXPECT_NE(bad_port.find("MASTER_PORT='70000': expected an integer in [1, 65535]"), std::string::npos) << bad_port;
  const std::string rank = error_of("torchrun", {{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"LOCAL_RANK", "0"},
                                                 {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  EXPECT_NE(rank.find("RANK=2 is not below WORLD_SIZE=2"), std::string::npos) << rank;
  EXPECT_NE(error_of("torchrun", {{"WORLD_SIZE", "two"}}).find("WORLD_SIZE='two'"), std::string::npos);
  EXPECT_NE(error_of("slurm", {}).find("SLURM_NTASKS is not set"), std::string::npos);
  const std::string list = error_of("slurm", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                                              {"SLURM_JOB_ID", "1"}, {"SLURM_JOB_NODELIST", "gpu[1-"}});
  EXPECT_NE(list.find("SLURM_JOB_NODELIST: unbalanced brackets"), std::string::npos) << list;
  const std::string nolist = error_of("slurm", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}});
  EXPECT_NE(nolist.find("SLURM_JOB_NODELIST is not set"), std::string::npos) << nolist;
  EXPECT_NE(error_of("mpi", {}).find("distributed.mode: expected one of auto|torchrun|slurm|off"), std::string::npos);
}

TEST(EnvTest, PickDevice) {
  EXPECT_EQ(pick_device(3, 8, 8), 3);  // the process sees the whole node
  EXPECT_EQ(pick_device(3, 8, 1), 0);  // one GPU bound per task
  EXPECT_THROW(pick_device(5, 8, 4), Error);
  EXPECT_THROW(pick_device(0, 1, 0), Error);
}

TEST(EnvTest, JobIdFromTheLauncherTorchrunOrSlurmInThatOrder) {
  const Vars& torchrun = kTorchrun;
  DistEnv e = read("torchrun", torchrun);
  EXPECT_EQ(e.job_id, "");
  EXPECT_EQ(e.job_id_var, "");
  e = read("torchrun", with(torchrun, {{"SLURM_JOB_ID", "4242"}}));
  EXPECT_EQ(e.job_id, "4242");
  EXPECT_EQ(e.job_id_var, "SLURM_JOB_ID");
  e = read("torchrun", with(torchrun, {{"SLURM_JOB_ID", "4242"}, {"TORCHELASTIC_RUN_ID", "run-9"}}));
  EXPECT_EQ(e.job_id, "run-9");
  EXPECT_EQ(e.job_id_var, "TORCHELASTIC_RUN_ID");
  e = read("auto", with(torchrun, {{"SLURM_JOB_ID", "4242"}, {"TORCHELASTIC_RUN_ID", "run-9"}, {"TT_JOB_ID", "mine"}}));
  EXPECT_EQ(e.job_id, "mine");
  EXPECT_EQ(e.job_id_var, "TT_JOB_ID");
  e = read("slurm", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_ID", "77"}});
  EXPECT_EQ(e.job_id, "77");
  EXPECT_EQ(error_of("torchrun", with(torchrun, {{"TT_JOB_ID", "a\nb"}})),
            "distributed: TT_JOB_ID: expected a job id of at most 256 printable characters, got 3 bytes");
  EXPECT_EQ(error_of("torchrun", with(torchrun, {{"TT_JOB_ID", std::string(257, 'x')}})),
            "distributed: TT_JOB_ID: expected a job id of at most 256 printable characters, got 257 bytes");
}

TEST(EnvTest, TheJobSecretIsReadCheckedAndNeverDescribed) {
  const Vars& torchrun = kTorchrun;
  EXPECT_EQ(read("torchrun", torchrun).secret, "");
  const DistEnv e = read("torchrun", with(torchrun, {{"TT_JOB_SECRET", "0123456789abcdef"}}));
  EXPECT_EQ(e.secret, "0123456789abcdef");
  EXPECT_EQ(e.describe().find("0123456789abcdef"), std::string::npos);
  const std::string expected =
      "distributed: TT_JOB_SECRET: expected 16 to 1024 printable characters without spaces (for example 32 random "
      "hex digits), got ";
  EXPECT_EQ(error_of("torchrun", with(torchrun, {{"TT_JOB_SECRET", "short"}})), expected + "5 characters that are not");
  EXPECT_EQ(error_of("torchrun", with(torchrun, {{"TT_JOB_SECRET", "has a space in it ok"}})),
            expected + "20 characters that are not");
  // Set but empty (a failed $(...) in a job script) is an error, not "no authentication".
  EXPECT_EQ(error_of("torchrun", with(torchrun, {{"TT_JOB_SECRET", ""}})),
            "distributed: TT_JOB_SECRET is set but empty; expected 16 to 1024 printable characters (for example 32 "
            "random hex digits), or leave it unset");
}

}  // namespace
}  // namespace tt::distributed
