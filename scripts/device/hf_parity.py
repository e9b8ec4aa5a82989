"""Hugging Face compatibility: our checkpoints load in transformers and theirs load here.

Run on a machine with torch + transformers (the GPU machine), with the probe binary built here:
  python3 scripts/device/hf_parity.py .device/hf_parity_tool OUTDIR
For qwen3/llama/qwen3_5_text/qwen3_next (the last two: 3 Gated DeltaNet layers : 1 gated attention;
qwen3_next dense, num_experts 0, its fused in_proj_qkvz / in_proj_ba), tied/untied: (1) we export a model; transformers loads it; logits must match
ours; (2) transformers writes a randomly initialised model; we load it; logits must match theirs.
Rule: fp32 vs fp64 computations of the same function: max |diff| / max |logit| < 1e-4.
(3) one AdamW step from (2)'s weights, ours against torch.optim.AdamW, with eps = lr = 1e3 so the
update is about the gradient itself: per tensor max |update diff| / max |update| < 1e-4.
"""
import os
import subprocess
import sys

import numpy as np
import torch
import transformers

tool, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
tokens = [3, 17, 42, 5, 88, 61, 0, 95, 23, 23, 7, 54, 12, 70, 33, 1]
tok_arg = ",".join(map(str, tokens))
failures = 0
rows = []


def hf_logits(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].double().numpy(), model


def ours(args, vocab):
    subprocess.run([tool] + args, check=True)
    return np.fromfile(args[-1], dtype=np.float32).reshape(len(tokens), vocab).astype(np.float64)


for arch in ["qwen3", "llama", "qwen3_5_text", "qwen3_next"]:
    for tied in ["0", "1"]:
        name = f"{arch}_tied{tied}"
        d = os.path.join(out, "ours_" + name)
        mine = ours(["export", d, arch, tied, "7", tok_arg, os.path.join(out, name + "_ours.f32")], 96)
        theirs, model = hf_logits(d)
        err1 = np.abs(mine - theirs).max() / np.abs(theirs).max()
        # (2) transformers writes a random model of the same config; we load it.
        cfg = transformers.AutoConfig.from_pretrained(d)
        torch.manual_seed(11)
        fresh = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
        with torch.no_grad():
            for p in fresh.parameters():
                p.normal_(0, 0.1) if p.dim() > 1 else p.uniform_(0.5, 1.5)
        d2 = os.path.join(out, "theirs_" + name)
        fresh.save_pretrained(d2, safe_serialization=True)
        theirs2, _ = hf_logits(d2)
        mine2 = ours(["import", d2, tok_arg, os.path.join(out, name + "_import.f32")], 96)
        err2 = np.abs(mine2 - theirs2).max() / np.abs(theirs2).max()
        # (3) One AdamW step on the same sequence from the transformers-written weights: ours
        # (fp64) against torch.optim.AdamW on transformers' loss (labels = input_ids, fp32). With
        # eps = lr = 1e3 the first update lr g / (|g| + eps) is g (1 - |g| / eps + ...): it carries
        # the gradient itself, so a wrong gradient term shows; compared per tensor, normwise.
        lr = eps = 1e3
        subprocess.run([tool, "step", d2, tok_arg, str(lr), os.path.join(out, name + "_step")], check=True)
        step_model = transformers.AutoModelForCausalLM.from_pretrained(d2, torch_dtype=torch.float32)
        step_model.train()
        opt = torch.optim.AdamW(step_model.parameters(), lr=lr, betas=(0.9, 0.999), eps=eps, weight_decay=0.0)
        step_model(torch.tensor([tokens]), labels=torch.tensor([tokens])).loss.backward()
        before = {k: v.detach().clone() for k, v in step_model.state_dict().items()}
        opt.step()
        import safetensors.torch
        mine_after = safetensors.torch.load_file(os.path.join(out, name + "_step", "model.safetensors"))
        err3 = 0.0
        for k, v in step_model.state_dict().items():
            if k not in mine_after:
                continue  # a tied lm_head
            delta_theirs = (v - before[k]).double()
            delta_mine = (mine_after[k].double() - before[k].double())
            scale = delta_theirs.abs().max().item()
            if scale > 0:
                err3 = max(err3, (delta_mine - delta_theirs).abs().max().item() / scale)
        bound3 = 1e-4  # fp32 against fp64 gradients of the same loss, as the logits' rule
        ok = err1 < 1e-4 and err2 < 1e-4 and err3 < bound3
        failures += 0 if ok else 1
        rows.append((name, type(model).__name__, err1, err2, err3, bound3, "ok" if ok else "FAIL"))

print(f"transformers {transformers.__version__}, torch {torch.__version__}")
print(f"{'case':<19} {'HF class':<20} {'ours->HF':>10} {'HF->ours':>10} {'AdamW step':>11} {'bound':>9}")
for r in rows:
    print(f"{r[0]:<19} {r[1]:<20} {r[2]:>10.2e} {r[3]:>10.2e} {r[4]:>11.2e} {r[5]:>9.2e}  {r[6]}")
print(f"{len(rows) - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
