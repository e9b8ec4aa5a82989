#!/usr/bin/env python3
"""Reads a run's TensorBoard events with tensorboard's own reader and checks them against metrics.jsonl.

    tensorboard_check.py RUN_DIR                  check an existing run
    tensorboard_check.py --treetrain BIN [--device cpu|cuda|auto] [--work DIR]
                                                  train a small run with BIN first (killed after
                                                  step 5 with its checkpoint at step 3, then
                                                  resumed to step 8), then check it

On the GPU machine (tensorboard installed there), after `scripts/device/train_check.sh stage` here:
    run(command="python3 scripts/device/tensorboard_check.py --treetrain .device/model_cuda/treetrain",
        carry=[".device"])

What it checks (tensorboard.backend.event_processing.event_accumulator.EventAccumulator on
RUN_DIR/tb, every scalar kept):
  - the scalar tags loss, nll, lr, grad_norm, tokens_per_s, mfu, por, executed_flops are there
    (trainer/train.cc tensorboard_scalars; a tag in the events but not in this list is reported,
    not failed, so a newly added scalar needs no change here to pass);
  - each tag's steps are exactly the steps of metrics.jsonl (after a resume TensorBoard drops the
    killed run's steps past the checkpoint, as metrics.jsonl does), and each value equals the
    metrics.jsonl value rounded to float32 (the events hold float32);
  - with --treetrain: the run_dir holds two events files (the killed run's and the resumed one's).
Prints one line per tag and PASS or FAIL last; exits 0 on PASS, 1 on FAIL, 2 on bad usage.
"""
import argparse
import glob
import json
import os
import struct
import subprocess
import sys

TAGS = ["loss", "nll", "lr", "grad_norm", "tokens_per_s", "mfu", "por", "executed_flops", "skipped_steps"]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def train(binary, device, work):
    """The small run: 5 steps with a checkpoint at 3 and none at the end (a kill after step 5),
    then resumed to 8. Returns the run_dir."""
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "data.jsonl")
    run_dir = os.path.join(work, "run")
    subprocess.run(["rm", "-rf", run_dir], check=True)
    subprocess.run([binary, "generate", "--kind", "rollouts", "--out", data, "--num-trees", "32",
                    "--vocab-size", "256", "--seed", "1"], check=True)
    config = os.path.join(work, "run.yaml")
    with open(config, "w") as f:
        f.write(f"run_dir: {run_dir}\ndevice: {device}\n"
                "model:\n  vocab_size: 256\n  hidden_size: 128\n  intermediate_size: 256\n"
                "  num_hidden_layers: 2\n  num_attention_heads: 2\n  num_key_value_heads: 1\n"
                "  head_dim: 64\n  max_position_embeddings: 1024\n"
                f"data:\n  path: {data}\n  max_tokens_per_batch: 1024\n"
                "train:\n  max_steps: 5\n  checkpoint_every: 3\n  final_checkpoint: false\n"
                "optim:\n  lr: 1.0e-3\n")
    subprocess.run([binary, "train", "--config", config], check=True)
    subprocess.run([binary, "train", "--config", config, "--set", "train.max_steps=8", "--set",
                    "train.resume=true"], check=True)
    return run_dir


def check(run_dir, expect_files=None):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    failures = []
    tb = os.path.join(run_dir, "tb")
    files = sorted(glob.glob(os.path.join(tb, "events.out.tfevents.*")))
    print(f"{len(files)} events files in {tb}")
    if not files:
        failures.append(f"no events files in {tb}")
    if expect_files is not None and len(files) != expect_files:
        failures.append(f"{len(files)} events files, expected {expect_files}")
    acc = EventAccumulator(tb, size_guidance={"scalars": 0})
    acc.Reload()
    got_tags = set(acc.Tags().get("scalars", []))
    ms = metrics(run_dir)
    steps = [m["step"] for m in ms]
    print(f"metrics.jsonl: {len(ms)} steps ({steps[0] if steps else '-'}..{steps[-1] if steps else '-'})")
    for tag in sorted(got_tags - set(TAGS)):
        print(f"{tag:16} (not in this script's list; not checked)")
    for tag in TAGS:
        if tag not in got_tags:
            failures.append(f"tag {tag} missing")
            print(f"{tag:16} MISSING")
            continue
        events = acc.Scalars(tag)
        ev_steps = [e.step for e in events]
        bad = []
        if ev_steps != steps:
            bad.append(f"steps {ev_steps} != metrics.jsonl steps {steps}")
        else:
            for e, m in zip(events, ms):
                if e.value != f32(m[tag]):
                    bad.append(f"step {e.step}: {e.value!r} != float32({m[tag]!r}) = {f32(m[tag])!r}")
        print(f"{tag:16} {'ok' if not bad else 'BAD'}  {len(events)} values"
              + (f", last {events[-1].value:.6g}" if events else "") + "".join("\n    " + b for b in bad[:5]))
        failures += [f"{tag}: {b}" for b in bad]
    return failures


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", nargs="?")
    p.add_argument("--treetrain")
    p.add_argument("--device", default="auto")
    p.add_argument("--work", default=os.path.join(os.environ.get("OUT", "/tmp"), "tensorboard_check"))
    a = p.parse_args()
    if bool(a.run_dir) == bool(a.treetrain):
        p.print_usage(sys.stderr)
        print("give RUN_DIR or --treetrain BIN", file=sys.stderr)
        return 2
    try:
        if a.treetrain:
            failures = check(train(a.treetrain, a.device, a.work), expect_files=2)
        else:
            failures = check(a.run_dir)
    except Exception as e:  # an unreadable file, a training failure, tensorboard missing
        failures = [f"{type(e).__name__}: {e}"]
    for f in failures:
        print("failure:", f)
    print("PASS" if not failures else f"FAIL ({len(failures)} problems)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
