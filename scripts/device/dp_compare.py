#!/usr/bin/env python3
"""Compares a data-parallel run of `treetrain` with a one-process run of the same global batch.

    dp_compare.py INIT_RUN ONE_RUN DP_RUN

Each argument is a run_dir. INIT_RUN holds the initial weights (one step at lr 1e-30, below fp32
resolution, so its checkpoint is the fresh init), ONE_RUN the one-process run, DP_RUN the
N-rank run of the same config. Reads metrics.jsonl and the newest checkpoint's model.safetensors
(F32) of each; standard library only.

Rule (bf16 activations; scripts/device/dp_check.sh): the N-rank step regroups the step's trees
into other micro-batches and sums the gradients over ranks, so the runs differ by bf16 rounding
of activations in differently shaped GEMMs and by fp32 summation order, not in what is summed.
  - per step: the counts (n_tree, n_flat, paths) equal; loss and grad_norm agree to 1e-2
    relative (the CUDA backend's bound against the fp64 reference, tests/model_cuda);
  - final weights: the update agrees to 1e-2 relative in L2,
    ||p_dp - p_one|| / ||p_one - p_init|| <= 1e-2, with optim.eps = 1e-3 so that AdamW's update
    m / (sqrt(v) + eps) is Lipschitz in the gradient (as tests/distributed/data_parallel_test.cc).
Prints one line per step and a verdict; exits 1 when a bound is broken.
"""
import array
import json
import math
import os
import re
import struct
import sys

LOSS_REL = 1e-2
UPDATE_REL = 1e-2


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def newest_checkpoint(run):
    d = os.path.join(run, "checkpoints")
    steps = [(int(m.group(1)), n) for n in os.listdir(d) for m in [re.fullmatch(r"step_(\d+)", n)] if m]
    if not steps:
        raise SystemExit(f"{d}: no checkpoint")
    return os.path.join(d, max(steps)[1])


def read_safetensors(path):
    """name -> array('f') of an F32 safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {t['dtype']}, expected F32")
        a = array.array("f")
        a.frombytes(data[t["data_offsets"][0]:t["data_offsets"][1]])
        if sys.byteorder != "little":
            a.byteswap()
        out[name] = a
    return out


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    init_run, one_run, dp_run = sys.argv[1:]
    ok = True
    a, b = metrics(one_run), metrics(dp_run)
    if len(a) != len(b) or not a:
        print(f"FAIL steps: one process {len(a)}, data-parallel {len(b)}")
        return 1
    worst_loss = worst_norm = 0.0
    for x, y in zip(a, b):
        counts = all(x[k] == y[k] for k in ("n_tree", "n_flat", "paths"))
        rl, rn = rel(y["loss"], x["loss"]), rel(y["grad_norm"], x["grad_norm"])
        worst_loss, worst_norm = max(worst_loss, rl), max(worst_norm, rn)
        bad = not counts or rl > LOSS_REL or rn > LOSS_REL
        ok &= not bad
        print(f"step {x['step']:3}  loss {x['loss']:.6f} {y['loss']:.6f} rel {rl:.2e}  gnorm {x['grad_norm']:.5f} "
              f"{y['grad_norm']:.5f} rel {rn:.2e}  world {y.get('world_size', 1)}  tok/s {x['tokens_per_s']:.0f} "
              f"{y['tokens_per_s']:.0f}{'  counts differ' if not counts else ''}{'  FAIL' if bad else ''}")
    p0 = read_safetensors(os.path.join(newest_checkpoint(init_run), "model.safetensors"))
    p1 = read_safetensors(os.path.join(newest_checkpoint(one_run), "model.safetensors"))
    p2 = read_safetensors(os.path.join(newest_checkpoint(dp_run), "model.safetensors"))
    if set(p0) != set(p1) or set(p1) != set(p2):
        print("FAIL the checkpoints hold different tensors")
        return 1
    diff2 = upd2 = 0.0
    worst_tensor = (0.0, "")
    for name in sorted(p1):
        d2 = sum((u - v) ** 2 for u, v in zip(p2[name], p1[name]))
        u2 = sum((u - v) ** 2 for u, v in zip(p1[name], p0[name]))
        diff2 += d2
        upd2 += u2
        worst_tensor = max(worst_tensor, (math.sqrt(d2 / u2) if u2 > 0 else 0.0, name))
    update_rel = math.sqrt(diff2 / upd2) if upd2 > 0 else float("inf")
    ok &= update_rel <= UPDATE_REL and upd2 > 0
    print(f"weights: ||p_dp - p_one|| / ||p_one - p_init|| = {update_rel:.2e} (bound {UPDATE_REL:g}); "
          f"||p_one - p_init|| = {math.sqrt(upd2):.4e}; worst tensor {worst_tensor[1]} {worst_tensor[0]:.2e}")
    print(f"{'PASS' if ok else 'FAIL'} dp vs one process: worst loss rel {worst_loss:.2e}, worst grad-norm rel "
          f"{worst_norm:.2e} (bound {LOSS_REL:g}), update rel L2 {update_rel:.2e} (bound {UPDATE_REL:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
