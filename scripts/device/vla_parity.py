"""VLA compatibility: our VLA checkpoints are LlavaForConditionalGeneration checkpoints and theirs
load here (issue 16).

Run on a machine with torch + transformers (the GPU machine), with the probe built here:
  python3 scripts/device/vla_parity.py .device/hf/vla_parity_tool OUTDIR
A tiny VLA (a 2-layer SigLIP tower on 8 x 8 frames of 4 patches, the LLaVA projector, a 2-layer
Qwen3 decoder), one sequence with two frames:
(1) we export a model; transformers loads it; its logits must match ours;
(2) transformers writes a randomly initialised model; we load it; logits must match theirs;
(3) the gradient of transformers' loss (labels = input_ids, image positions -100) for every tensor,
    the SigLIP tower's (SiglipVisionModel inside LLaVA) and the projector's included, against ours;
all three for vision_feature_layer -1 (the last layer) and -2 (LLaVA-1.5's: the tower's last layer
gets no gradient in transformers, and exact zeros in ours).
Rule: fp32 (transformers) against fp64 (ours) of the same function: max |diff| / max |reference|
< 1e-4, per tensor for gradients. The tower's k_proj bias has gradient 0 in exact arithmetic (the
softmax cancels a per-query constant), so there both sides are rounding noise: reported, not
compared.
"""
import os
import subprocess
import sys

import numpy as np
import safetensors.torch
import torch
import transformers

tool, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
IMG = 95
tokens = [3, 17, IMG, IMG, IMG, IMG, 42, 5, 88, IMG, IMG, IMG, IMG, 61, 7, 23, 54, 12]
tok_arg = ",".join(map(str, tokens))
rng = np.random.default_rng(5)
pixels = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
pix_file = os.path.join(out, "pixels.f32")
pixels.tofile(pix_file)
V = 96


def canonical(name):
    """One spelling for transformers' in-memory names and the on-disk ones ours are written in."""
    if name.startswith("model."):
        name = name[len("model."):]
    name = name.replace("language_model.model.", "language_model.").replace("vision_tower.vision_model.", "vision_tower.")
    return name.replace("language_model.lm_head.", "lm_head.")


def run(args):
    subprocess.run([tool] + args, check=True)


def hf_logits(path):
    model = transformers.LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        o = model(input_ids=torch.tensor([tokens]), pixel_values=torch.from_numpy(pixels))
    return o.logits[0].double().numpy(), model


def ours_logits(f):
    return np.fromfile(f, dtype=np.float32).reshape(len(tokens), V).astype(np.float64)


def check(layer):
    """(1)-(3) for a model whose projector reads hidden_states[layer]; True when all pass."""
    out_l = os.path.join(out, f"layer{layer}")
    os.makedirs(out_l, exist_ok=True)
    # (1) ours -> transformers
    d1 = os.path.join(out_l, "ours")
    run(["export", d1, "7", tok_arg, pix_file, os.path.join(out_l, "ours.f32"), str(layer)])
    theirs1, model1 = hf_logits(d1)
    if model1.config.vision_feature_layer != layer:
        print(f"  transformers read vision_feature_layer {model1.config.vision_feature_layer}, expected {layer}")
        return False
    err1 = np.abs(ours_logits(os.path.join(out_l, "ours.f32")) - theirs1).max() / np.abs(theirs1).max()

    # (2) transformers -> ours: a random model of the same config.
    cfg = transformers.AutoConfig.from_pretrained(d1)
    torch.manual_seed(11)
    fresh = transformers.LlavaForConditionalGeneration(cfg).float()
    with torch.no_grad():
        for name, p in fresh.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.1)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.1)  # biases
    d2 = os.path.join(out_l, "theirs")
    fresh.save_pretrained(d2, safe_serialization=True)
    theirs2, model2 = hf_logits(d2)
    run(["import", d2, tok_arg, pix_file, os.path.join(out_l, "import.f32")])
    err2 = np.abs(ours_logits(os.path.join(out_l, "import.f32")) - theirs2).max() / np.abs(theirs2).max()

    # (3) gradients of transformers' loss on (2)'s weights.
    model2.train()
    labels = torch.tensor([[t if t != IMG else -100 for t in tokens]])
    model2.zero_grad()
    loss = model2(input_ids=torch.tensor([tokens]), pixel_values=torch.from_numpy(pixels), labels=labels).loss
    loss.backward()
    gdir = os.path.join(out_l, "grads")
    run(["grad", d2, tok_arg, pix_file, gdir])
    mine = {canonical(k): v for k, v in safetensors.torch.load_file(os.path.join(gdir, "model.safetensors")).items()}
    theirs_grads = {canonical(n): p.grad for n, p in model2.named_parameters() if p.grad is not None}
    worst, worst_name, compared, noise = 0.0, "", 0, []
    for name, g in theirs_grads.items():
        if name not in mine:
            print(f"  (not in ours: {name}, |grad| max {g.abs().max().item():.2e})")
            continue
        ref = g.double()
        m = mine[name].double()
        if "self_attn.k_proj.bias" in name and "vision_tower" in name:
            noise.append((name, ref.abs().max().item(), m.abs().max().item()))
            continue
        scale = ref.abs().max().item()
        e = (m - ref).abs().max().item() / scale if scale > 0 else (m.abs().max().item())
        compared += 1
        if e > worst:
            worst, worst_name = e, name
    # Tensors transformers gives no gradient (the tower's layers past the feature layer, which
    # never reach the output): ours must hold exact zeros there.
    unread = [n for n in mine if n not in theirs_grads]
    missing = [n for n in unread if mine[n].abs().max().item() != 0.0]
    print(f"vision_feature_layer {layer}: transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{type(model1).__name__} (vision tower {type(model1.model.vision_tower).__name__})")
    print(f"  ours -> HF logits   {err1:.2e}")
    print(f"  HF -> ours logits   {err2:.2e}")
    print(f"  gradients           {worst:.2e} worst ({worst_name}); {compared} tensors compared, loss {loss.item():.6f}")
    if unread:
        print(f"  {len(unread)} tensors without a transformers gradient, zero in ours: {len(unread) - len(missing)}")
    for n, a, b in noise:
        print(f"  zero-gradient tensor {n}: |HF| {a:.1e}, |ours| {b:.1e}")
    if missing:
        print(f"  ours only, nonzero: {missing}")
    # Past -2: the last of the two SigLIP layers, 16 tensors (2 norms, q/k/v/out, fc1, fc2; weight
    # and bias each), and nothing else.
    expect_unread = 0 if layer == -1 else 16
    wrong = [n for n in unread if not n.startswith("vision_tower.encoder.layers.1.")]
    if wrong:
        print(f"  without a transformers gradient but not past the feature layer: {wrong}")
    return (err1 < 1e-4 and err2 < 1e-4 and worst < 1e-4 and compared > 20 and not missing and not wrong
            and len(unread) == expect_unread)


results = {layer: check(layer) for layer in (-1, -2)}
ok = all(results.values())
print("PASS" if ok else f"FAIL {results}")
sys.exit(0 if ok else 1)
