#!/usr/bin/env python3
"""GRPO-shaped rollout groups for the trainer benchmarks (scripts/device/cli_speed.sh).

Each line is one `rollouts` group: a prompt of --prompt-len tokens (masked) and --responses
responses whose lengths are drawn uniformly from [--min-len, --max-len] (targets), token ids
uniform in [0, --vocab), weights +-1 (advantages). Deterministic for --seed.

  python3 bench/grpo_groups.py --out FILE [--groups 32] [--prompt-len 1536] [--responses 12]
                               [--min-len 256] [--max-len 1536] [--vocab 151936] [--seed 1]
"""
import argparse
import json
import random


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=1536)
    ap.add_argument("--responses", type=int, default=12)
    ap.add_argument("--min-len", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=1536)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    n_tree = n_flat = 0
    with open(a.out, "w") as f:
        for g in range(a.groups):
            prompt = [rng.randrange(a.vocab) for _ in range(a.prompt_len)]
            seqs = []
            for r in range(a.responses):
                n = rng.randint(a.min_len, a.max_len)
                resp = [rng.randrange(a.vocab) for _ in range(n)]
                seqs.append({"tokens": prompt + resp, "loss_mask": [0] * len(prompt) + [1] * n,
                             "weight": 1.0 if r % 2 == 0 else -1.0})
                n_tree += n
                n_flat += len(prompt) + n
            n_tree += len(prompt)
            f.write(json.dumps({"id": f"grpo-{g:04d}", "sequences": seqs}, separators=(",", ":")) + "\n")
    print(f"{a.out}: {a.groups} groups, n_tree {n_tree}, n_flat {n_flat}, flat/unique {n_flat / n_tree:.3f}")


if __name__ == "__main__":
    main()
