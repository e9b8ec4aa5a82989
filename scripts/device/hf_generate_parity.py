"""Greedy generation against transformers: a model transformers writes, decoded greedily by
transformers (fp64) and by treetrain's fp64 CPU decoder with its KV cache (hf_parity_tool greedy).

Run on a machine with torch + transformers (the GPU machine), with the probe built here:
  python3 scripts/device/hf_generate_parity.py .device/hf/hf_parity_tool OUTDIR
For qwen3 and llama, tied and untied, three prompts each, 32 new tokens: the tokens must agree
wherever our top-2 logit gap exceeds 1e-6 (fp64 vs fp64 of the same function); at a position
whose gap is at most that, the comparison of that prompt stops (the two may break a tie
differently, and everything after depends on it). eos is ignored by both.
The hybrids (qwen3_5_text, qwen3_next: Gated DeltaNet layers around gated attention; the
config written by our exporter, the weights by transformers) decode with the recurrent state and
conv window in the cache on both sides. transformers' torch Gated DeltaNet casts to fp32 inside
(torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule), so its logits carry fp32
error (~1e-6 relative, the 1e-4 logit rule of hf_parity.py); the gap threshold there is 1e-4.
"""
import json
import os
import subprocess
import sys

import torch
import transformers

tool, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
NEW = 32
prompts = [[3, 17, 42, 5], [88, 61, 0, 95, 23, 23, 7, 54, 12, 70, 33, 1], [9]]
failures, rows = 0, []
for arch, cls in (("qwen3", transformers.Qwen3Config), ("llama", transformers.LlamaConfig),
                  ("qwen3_5_text", None), ("qwen3_next", None)):
    for tied in (False, True):
        if cls is None:  # the hybrid's config as our exporter writes it (hf_parity_tool export)
            d0 = os.path.join(out, f"cfg_{arch}_tied{int(tied)}")
            subprocess.run([tool, "export", d0, arch, str(int(tied)), "7", "1,2,3", os.path.join(out, "unused.f32")],
                           check=True)
            cfg = transformers.AutoConfig.from_pretrained(d0)
        else:
            cfg = cls(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, rope_theta=1000000.0, tie_word_embeddings=tied,
                      max_position_embeddings=256)
        gap_min = 1e-6 if cls is not None else 1e-4
        torch.manual_seed(5)
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.3) if p.dim() > 1 else p.uniform_(0.5, 1.5)
        d = os.path.join(out, f"{arch}_tied{int(tied)}")
        model.save_pretrained(d, safe_serialization=True)
        ref = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float64).eval()
        ref.generation_config.eos_token_id = None
        ref.generation_config.pad_token_id = 0
        compared = agreed = 0
        ok = True
        for k, prompt in enumerate(prompts):
            with torch.no_grad():
                ids = torch.tensor([prompt])  # an explicit mask: a prompt token equal to pad_token_id is not padding
                hf = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
            path = os.path.join(out, f"{arch}_tied{int(tied)}_{k}.json")
            subprocess.run([tool, "greedy", d, ",".join(map(str, prompt)), str(NEW), path], check=True)
            ours = json.load(open(path))
            for j, (a, b) in enumerate(zip(ours["tokens"], hf)):
                if ours["gaps"][j] <= gap_min:
                    break
                compared += 1
                if a != b:
                    ok = False
                    print(f"{arch} tied={tied} prompt {k} token {j}: ours {a}, transformers {b}, gap {ours['gaps'][j]:.3e}")
                    break
                agreed += 1
        failures += 0 if ok else 1
        rows.append((f"{arch}_tied{int(tied)}", type(ref).__name__, compared, agreed, "ok" if ok else "FAIL"))
print(f"transformers {transformers.__version__}, torch {torch.__version__}")
print(f"{'case':<14} {'HF class':<20} {'compared':>9} {'agreed':>7}")
for r in rows:
    print(f"{r[0]:<14} {r[1]:<20} {r[2]:>9} {r[3]:>7}  {r[4]}")
print(f"{len(rows) - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
