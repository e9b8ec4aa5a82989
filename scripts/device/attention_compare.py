#!/usr/bin/env python3
"""Side-by-side timing of the treetrain tree attention against PyTorch, on the same trees.

Reads the JSON lines that bench/attention_bench printed (one per workload and head layout; each
names the layout it dumped: <prefix>subtree_end.npy), and for each times, in this process:
  - FlexAttention (torch.compile'd flex_attention) with the tree mask
    mask_mod = (kv <= q) & (q < subtree_end[kv]) as a block mask on the packed length N;
  - dense causal SDPA (F.scaled_dot_product_attention, is_causal=True) on the same N, on
    cuDNN's attention (SDPBackend.CUDNN_ATTENTION; the default flash backend if cuDNN cannot
    run, said in the table's backend column).
Same heads / KV heads / head dim, bf16, batch 1, forward + backward (torch.autograd.grad), CUDA
events after warm-up, medians. TFLOP/s count 14 * head_dim * heads FLOPs per visible pair
(4 forward, 10 backward): the tree's pairs for ours and Flex, N (N + 1) / 2 for causal SDPA.
Prints a table with the ratios ours / Flex and ours / SDPA (per visible pair) and writes the
rows as JSON lines to --out.
"""
import argparse
import json
import signal
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def time_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def fwd_bwd_times(attn, q, k, v, dout, warmup, iters):
    """Median forward ms (inputs requiring grad, as in training) and forward + backward ms."""
    fwd = time_ms(lambda: attn(q, k, v), warmup, iters)

    def step():
        out = attn(q, k, v)
        torch.autograd.grad(out, (q, k, v), dout)

    total = time_ms(step, warmup, iters)
    return fwd, total


def tflops(flop_per_pair, pairs, ms):
    return flop_per_pair * pairs / (ms * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True, help="JSON lines of bench/attention_bench")
    ap.add_argument("--out", required=True, help="JSON lines written here")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new rows after this")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    flex = torch.compile(flex_attention, dynamic=False)
    start = time.time()
    rows = []
    with open(args.ours) as f:
        ours_rows = [json.loads(line) for line in f if line.strip().startswith("{")]
    # A timeout's SIGTERM ends the loop, not the table of the rows done so far.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    out_f = open(args.out, "w")
    try:
        for o in ours_rows:
            compare_row(o, args, flex, start, rows, out_f)
    except KeyboardInterrupt:
        print("interrupted: table of the finished rows", flush=True)
    print_table(rows)
    return 0


def compare_row(o, args, flex, start, rows, out_f):
    """Times Flex and SDPA for one bench row; appends the row to rows and out_f."""
    if time.time() - start > args.budget_s:
        print(f"budget spent: skipping {o['workload']} kv={o['kv_heads']}", flush=True)
        return
    n, h, hkv, d = o["n"], o["heads"], o["kv_heads"], o["head_dim"]
    se = torch.from_numpy(np.load(o["layout"] + "subtree_end.npy").astype(np.int32)).cuda()
    assert se.numel() == n, (se.numel(), n)
    pairs = int(o["visible_pairs"])
    # The same count from the layout: key j is seen by queries j .. subtree_end[j] - 1.
    pairs_check = int((se.long() - torch.arange(n, device="cuda")).sum().item())
    assert pairs_check == pairs, (pairs_check, pairs)
    fpp = 14 * d * h

    def mask_mod(b, hh, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx < se[kv_idx])

    tag = f"{o['workload']} N={n} H={h}/{hkv}"
    t0 = time.time()
    bm = create_block_mask(mask_mod, B=None, H=None, Q_LEN=n, KV_LEN=n, device="cuda")
    torch.cuda.synchronize()
    print(f"[{time.time() - start:6.1f}s] {tag}: block mask in {time.time() - t0:.1f}s", flush=True)
    mk = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_(True)
    q, k, v = mk(1, h, n, d), mk(1, hkv, n, d), mk(1, hkv, n, d)
    dout = torch.randn(1, h, n, d, device="cuda", dtype=torch.bfloat16)
    gqa = hkv != h
    flex_attn = lambda q_, k_, v_: flex(q_, k_, v_, block_mask=bm, enable_gqa=gqa)
    flex_fwd, flex_total = fwd_bwd_times(flex_attn, q, k, v, dout, args.warmup, args.iters)
    t_flex = time.time() - t0
    print(f"[{time.time() - start:6.1f}s] {tag}: flex fwd {flex_fwd:.2f} ms, fwd+bwd {flex_total:.2f} ms "
          f"({tflops(fpp, pairs, flex_total):.0f} TFLOP/s; compile and timing {t_flex:.1f}s)", flush=True)

    # SDPA on full heads (KV heads repeated outside the timing), so every backend applies.
    ke = k.detach().repeat_interleave(h // hkv, dim=1).requires_grad_(True)
    ve = v.detach().repeat_interleave(h // hkv, dim=1).requires_grad_(True)
    def sdpa_on(backend):
        def run(q_, k_, v_):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)
        return run

    backend = "cudnn"
    try:
        sdpa_fwd, sdpa_total = fwd_bwd_times(sdpa_on(SDPBackend.CUDNN_ATTENTION), q, ke, ve, dout, args.warmup,
                                             args.iters)
    except RuntimeError as e:
        print(f"{tag}: cuDNN SDPA cannot run ({str(e)[:120]}); flash instead", flush=True)
        backend = "flash"
        sdpa_fwd, sdpa_total = fwd_bwd_times(sdpa_on(SDPBackend.FLASH_ATTENTION), q, ke, ve, dout, args.warmup,
                                             args.iters)
    causal_pairs = n * (n + 1) // 2
    print(f"[{time.time() - start:6.1f}s] {tag}: sdpa ({backend}) causal fwd {sdpa_fwd:.2f} ms, fwd+bwd {sdpa_total:.2f} ms "
          f"({tflops(fpp, causal_pairs, sdpa_total):.0f} TFLOP/s)", flush=True)
    del q, k, v, ke, ve, dout, bm
    torch.cuda.empty_cache()

    row = {
        "workload": o["workload"], "n": n, "heads": h, "kv_heads": hkv, "head_dim": d,
        "visible_pairs": pairs, "density": pairs / causal_pairs,
        "ours_fwd_ms": o["fwd_ms"], "ours_bwd_ms": o["bwd_ms"], "ours_total_ms": o["total_ms"],
        "ours_tflops": o["total_tflops"],
        "flex_fwd_ms": flex_fwd, "flex_total_ms": flex_total,
        "flex_tflops": tflops(fpp, pairs, flex_total),
        "flex_fwd_tflops": tflops(4 * d * h, pairs, flex_fwd),
        "sdpa_fwd_ms": sdpa_fwd, "sdpa_total_ms": sdpa_total,
        "sdpa_tflops": tflops(fpp, causal_pairs, sdpa_total),
        "sdpa_fwd_tflops": tflops(4 * d * h, causal_pairs, sdpa_fwd),
        "flex_setup_s": t_flex,
        "sdpa_backend": backend,
        "fwd_occupancy": o.get("fwd_occupancy", float("nan")), "bwd_occupancy": o.get("bwd_occupancy", float("nan")),
    }
    row["ours_over_flex"] = row["ours_tflops"] / row["flex_tflops"]
    row["ours_over_sdpa"] = row["ours_tflops"] / row["sdpa_tflops"]
    rows.append(row)
    out_f.write(json.dumps(row) + "\n")
    out_f.flush()


def print_table(rows):
    hdr = (f"{'workload':<18}{'N':>7}{'H/KV':>7}{'pairs':>9} {'occ f/b':>10} | {'ours ms':>8}{'TF/s':>6} (fwd {'TF/s':>4})"
           f" | {'flex ms':>8}{'TF/s':>6} | {'sdpa ms':>8}{'TF/s':>6} {'':>5} | {'/flex':>6}{'/sdpa':>6}")
    print(hdr)
    for r in rows:
        ours_fwd_tf = 4 * r["head_dim"] * r["heads"] * r["visible_pairs"] / (r["ours_fwd_ms"] * 1e-3) / 1e12
        print(f"{r['workload']:<18}{r['n']:>7}{str(r['heads']) + '/' + str(r['kv_heads']):>7}"
              f"{r['visible_pairs'] / 1e6:>8.1f}M {r['fwd_occupancy']:>5.2f}/{r['bwd_occupancy']:<4.2f}"
              f" | {r['ours_total_ms']:>8.2f}{r['ours_tflops']:>6.0f} (fwd {ours_fwd_tf:>4.0f})"
              f" | {r['flex_total_ms']:>8.2f}{r['flex_tflops']:>6.0f} | {r['sdpa_total_ms']:>8.2f}{r['sdpa_tflops']:>6.0f}"
              f" {r['sdpa_backend']:>5} | {r['ours_over_flex']:>6.2f}{r['ours_over_sdpa']:>6.2f}")


if __name__ == "__main__":
    sys.exit(main())
