// Where this process sits in a data-parallel job: rank, world size, local rank, and the master
// (rank 0's address and port, where the rendezvous listens), read from the launcher's environment.
//
// Sources (distributed.mode in the run config; trainer/config.h):
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (treetrain launch, torchrun,
//             or any launcher that sets them). LOCAL_WORLD_SIZE is optional.
//   slurm     srun with one task per GPU: SLURM_PROCID, SLURM_NTASKS (SLURM_STEP_NUM_TASKS when
//             srun set it), SLURM_LOCALID; the master is the first host of SLURM_STEP_NODELIST
//             (else SLURM_JOB_NODELIST). MASTER_ADDR and MASTER_PORT override; the port defaults
//             to 20000 + SLURM_JOB_ID % 10000 (below Linux's ephemeral range), so two jobs sharing
//             a node do not collide; two steps of one job sharing a node need MASTER_PORT.
//   auto      torchrun when WORLD_SIZE is set; else slurm when srun started the process
//             (SLURM_PROCID and SLURM_STEP_NUM_TASKS set: an sbatch script's own shell also has
//             SLURM_PROCID=0 and the allocation's SLURM_NTASKS, and must not wait for tasks that
//             srun never started); else one process (RANK set to other than 0 without
//             WORLD_SIZE is an error: that rank would train alone as the whole job).
//   off       one process, whatever the environment says.
// The job id (DistEnv::job_id), whatever the mode: TT_JOB_ID (treetrain launch sets it for its
// ranks), else TORCHELASTIC_RUN_ID (torchrun), else SLURM_JOB_ID, else none (""). The rendezvous
// accepts only ranks with rank 0's job id, so another job's ranks that reach this master port are
// refused instead of joining.
// The job secret (DistEnv::secret): TT_JOB_SECRET, at least 16 printable characters, the same on
// every rank (treetrain launch makes one; so does scripts/slurm/train.sbatch). With it, only a
// process that knows it joins as a rank (auth.h); it is never printed or sent.
// A variable that is missing or malformed is an error that names it and what was expected.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace tt::distributed {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes of this host (picks the GPU)
  int local_world_size = 1;  // processes on this host (1 when the launcher does not say)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string host;            // this host's name, for messages
  std::string source = "none";  // "torchrun" | "slurm" | "none"
  std::string job_id;           // "" when no variable names one
  std::string job_id_var;       // the variable it came from ("TT_JOB_ID", ...), for messages
  std::string secret;           // TT_JOB_SECRET, "" when unset (never printed)

  bool distributed() const { return world_size > 1; }
  // "rank 3/8 on host gpu07 (local rank 3)": the tag of every distributed message.
  std::string describe() const;
};

// Looks a variable up: nullptr when unset. Tests pass a map; processes use std::getenv.
using EnvLookup = std::function<const char*(const char*)>;

// mode: "auto" | "torchrun" | "slurm" | "off". Throws tt::Error naming the variable.
DistEnv read_env(const std::string& mode, const EnvLookup& lookup);
DistEnv read_env(const std::string& mode);  // from the process environment

// Expands a SLURM host list: "gpu[01-03,07],cpu5" -> gpu01 gpu02 gpu03 gpu07 cpu5. Ranges keep
// the zero padding of their lower bound; several bracket groups in one name multiply
// ("n[1-2]-ib[0-1]" -> n1-ib0 n1-ib1 n2-ib0 n2-ib1). Throws tt::Error on malformed input.
std::vector<std::string> expand_nodelist(const std::string& list);

// This machine's host name (gethostname), or "unknown-host".
std::string hostname();

// The GPU for a local rank among `visible` devices: local_rank when the process sees every GPU
// of the node, 0 when the launcher bound one GPU per task (srun --gpus-per-task=1,
// CUDA_VISIBLE_DEVICES of one device). Throws tt::Error when neither fits.
int pick_device(int local_rank, int local_world_size, int visible);

}  // namespace tt::distributed
