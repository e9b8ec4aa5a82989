#!/usr/bin/env python3
"""Times transformers' chunked gated delta rule (torch_chunk_gated_delta_rule, the torch fallback
of Qwen3-Next's and Qwen3.5's GatedDeltaNet) on issue 15's benchmark shape, for the side-by-side
table of docs/BENCHMARKS.md: one sequence of 32k tokens, 32 value heads of 128 (the 16 key heads
repeated to 32, as the model does before the call), bf16 inputs, q and k L2-normalised outside the
timed call (as our kernels take them), chunk 64.

  python3 scripts/device/gdn_compare.py --mode eager|compile [--tokens 32768] [--heads 32]
      [--dim 128] [--iters 3]

Prints one JSON line per pass (forward without gradients; forward + backward), CUDA-event medians
after one warm-up; with --mode compile the first call's time (compilation) is reported apart.
Run it under a timeout: compiling the chunk loop (tokens / 64 iterations) can take minutes.
Device machine only (torch and transformers are not part of the product)."""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args()

    import transformers
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    torch.manual_seed(0)
    dev = "cuda"
    T, H, D = a.tokens, a.heads, a.dim
    q = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).to(torch.bfloat16)
    k = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).to(torch.bfloat16)
    v = torch.randn(1, T, H, D, device=dev).to(torch.bfloat16)
    g = (-F.softplus(torch.randn(1, T, H, device=dev)) * 0.1).float()  # log decays, as the model's g
    beta = torch.sigmoid(torch.randn(1, T, H, device=dev)).to(torch.bfloat16)
    dout = torch.randn(1, T, H, D, device=dev).to(torch.bfloat16)

    rule = torch_chunk_gated_delta_rule
    if a.mode == "compile":
        rule = torch.compile(torch_chunk_gated_delta_rule)

    def fwd():
        with torch.no_grad():
            return rule(q, k, v, g, beta)[0]

    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))

    def fwd_bwd():
        for x in (qg, kg, vg):
            x.grad = None  # each call computes its gradients afresh (no accumulation across calls)
        out = rule(qg, kg, vg, g, beta)[0]
        out.backward(dout)
        return out

    common = {"impl": "transformers torch_chunk_gated_delta_rule", "mode": a.mode, "tokens": T, "heads": H,
              "dim": D, "transformers": transformers.__version__, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name()}
    for name, fn in (("forward", fwd), ("forward_backward", fwd_bwd)):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()  # peak_gib is this pass's
        t0 = time.perf_counter()
        fn()  # warm-up (with --mode compile: compilation)
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        times = []
        for _ in range(a.iters):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1))
        print(json.dumps({**common, "pass": name, "ms": round(statistics.median(times), 3),
                          "first_call_s": round(first_s, 2), "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}),
              flush=True)


if __name__ == "__main__":
    main()
