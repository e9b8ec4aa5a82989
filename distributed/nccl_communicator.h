// The NCCL communicator: device buffers, one NCCL communicator per process (one GPU per rank).
//
// Setup: NCCL_NVLS_ENABLE defaults to 0 (set it to override). Rank 0 makes the NCCL unique id and the rendezvous broadcasts it; every rank then calls
// ncclCommInitRankConfig in non-blocking mode and polls it against distributed.timeout_s, so a rank
// that never arrives fails the others with a tagged error instead of a hang (the communicator is
// aborted).
//
// Streams (docs: shared/STYLE.md, "collectives on their own stream tied by events"): every
// collective runs on the communicator's own stream. Before each, an event recorded on the compute
// stream makes the communication stream wait for the work already enqueued there (the gradients);
// wait() records an event on the communication stream and makes the compute stream wait for it.
// No host synchronisation on the gradient path.
//
// Hang protection: a watchdog thread polls the outstanding collectives (an event each) and
// ncclCommGetAsyncError. When NCCL reports an error, or a collective has not completed after
// distributed.collective_timeout_s (a peer died or hung), it aborts the NCCL communicator, which
// makes the enqueued kernels return, and records the error; the next call on this communicator
// throws it (tagged with host and rank), so a stuck job ends with a message rather than a hang.
//
// Host-side operations (all_reduce_host, barrier, all_gather_host) go over the rendezvous's TCP
// star, as in the CPU communicator: they need their values on the host anyway.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "distributed/communicator.h"
#include "distributed/rendezvous.h"

namespace tt::distributed {

// device: the CUDA device of this rank (pick_device); compute_stream: the stream the backend
// enqueues backward on. Takes ownership of the connected rendezvous.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Rendezvous> rendezvous, int device,
                                                     cudaStream_t compute_stream);

}  // namespace tt::distributed
