#!/usr/bin/env bash
# CUDA decoder and backend tests, and the training-step benchmark, on the GPU machine.
#
#   scripts/device/train_check.sh stage   here (no GPU): bazel build the gpu tests of
#                                         tests/model_cuda and bench:train_bench, copy the stripped
#                                         binaries to .device/model_cuda/ (ignored by git; carried)
#   scripts/device/train_check.sh [run]   there: run both test binaries (a failing one is re-run
#                                         under compute-sanitizer memcheck on its first failing
#                                         case), a short `treetrain` run on the GPU (train, resume,
#                                         partitioned), then the benchmark; logs go to $OUT
#                                         (tests.log, trainer.log, bench.json, bench.log,
#                                         summary.txt); a short table is printed last.
# Device run:  run(command="scripts/device/train_check.sh", carry=[".device"])
# Environment: BENCH_ARGS (extra train_bench flags), SKIP_BENCH=1, SKIP_TESTS=1.
set -uo pipefail
cd "$(dirname "$0")/../.."

DIR=.device/model_cuda
TESTS="model_cuda_test backend_cuda_test"

. scripts/device/lib.sh

if [ "${1:-run}" = "stage" ]; then
  bazel build //tests/model_cuda:model_cuda_test //tests/model_cuda:backend_cuda_test //bench:train_bench \
    //trainer:treetrain || exit 1
  files=""
  for t in $TESTS; do files="$files bazel-bin/tests/model_cuda/$t"; done
  stage_binaries "$DIR" $files bazel-bin/bench/train_bench bazel-bin/trainer/treetrain
  exit 0
fi

device_setup "$DIR" /tmp/train_check

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in $TESTS; do run_gtest "$t" 70 40; done
fi

# The trainer end to end on the GPU: the quickstart model with head dim 64, 60 steps with a
# checkpoint at 30, a resume to 80, then trees larger than a micro-batch run partitioned.
if [ "${SKIP_TRAINER:-0}" != 1 ]; then
  T=/tmp/train_check_cli
  rm -rf "$T" && mkdir -p "$T"
  tt="$DIR/treetrain"
  common="--config configs/quickstart.yaml --set device=cuda --set model.head_dim=64 --set data.path=$T/data.jsonl"
  {
    "$tt" generate --kind rollouts --out "$T/data.jsonl" &&
    timeout 60 "$tt" train $common --set run_dir=$T/run --set train.max_steps=60 --set train.checkpoint_every=30 &&
    timeout 60 "$tt" train $common --set run_dir=$T/run --set train.max_steps=80 --set train.resume=true &&
    timeout 60 "$tt" train $common --set run_dir=$T/part --set train.max_steps=20 \
      --set data.max_tokens_per_batch=128 --set partition.capacity_tokens=64 &&
    # A kill after step 8, before its checkpoint: the copy resumes from step 4 with the run's GEMM
    # tuning table and must repeat steps 5..8 bitwise (autotuning on, the default).
    timeout 60 "$tt" train $common --set run_dir=$T/full --set train.max_steps=8 --set train.checkpoint_every=4 \
      --set train.keep_checkpoints=0 &&
    cp -r $T/full $T/cut && rm -rf $T/cut/checkpoints/step_8 &&
    timeout 60 "$tt" train $common --set run_dir=$T/cut --set train.max_steps=8 --set train.checkpoint_every=4 \
      --set train.keep_checkpoints=0 --set train.resume=true
  } >"$OUT/trainer.log" 2>&1
  echo "treetrain rc=$?" >>"$summary"
  python3 - "$T" >>"$summary" <<'EOF' || true
import json, os, sys, filecmp
T = sys.argv[1]
try:
    full = [json.loads(l) for l in open(f"{T}/full/metrics.jsonl")]
    cut = [json.loads(l) for l in open(f"{T}/cut/metrics.jsonl")]
    table = json.load(open(f"{T}/full/gemm_tuning.json"))
    in_ckpt = os.path.exists(f"{T}/full/checkpoints/step_4/gemm_tuning.json")
    manifest = "gemm_tuning.json" in json.load(open(f"{T}/full/checkpoints/step_4/trainer_state.json"))["files"]
    same_loss = [a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] for a, b in zip(full, cut)]
    same_model = filecmp.cmp(f"{T}/full/checkpoints/step_8/model.safetensors",
                             f"{T}/cut/checkpoints/step_8/model.safetensors", shallow=False)
    ok = len(full) == len(cut) == 8 and all(same_loss) and same_model and in_ckpt and manifest and table["entries"]
    print(f"gemm tuning resume {'PASS' if ok else 'FAIL'}: {len(table['entries'])} entries ({table['signature']}); "
          f"in checkpoint {in_ckpt}, manifest {manifest}; steps equal {same_loss}; step_8 model bitwise {same_model}; "
          f"tune s per step {[round(r.get('gemm_tune_s', -1), 3) for r in full]}")
except Exception as e:
    print(f"gemm tuning resume FAIL: {e!r}")
EOF
  python3 - "$T" >>"$summary" <<'EOF' || true
import json, sys
for run in ("run", "part"):
    try:
        rows = [json.loads(l) for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl")]
    except Exception as e:
        print(f"treetrain {run}: no metrics ({e})"); continue
    for r in rows:
        if r["step"] in (1, 30, 31, 60, 61, 80) or (run == "part" and r["step"] in (1, 20)):
            print(f"treetrain {run:4} step {r['step']:3} loss {r['loss']:.4f} gnorm {r['grad_norm']:.3f} "
                  f"tok/s {r['tokens_per_s']:.0f} mfu {100*r.get('mfu', 0):.3f}% pieces {r['pieces']}")
EOF
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  start=$SECONDS
  timeout 120 "$DIR/train_bench" ${BENCH_ARGS:-} >"$OUT/bench.json" 2>"$OUT/bench.log"
  echo "train_bench rc=$? $((SECONDS - start))s" >>"$summary"
fi

echo "----- failures"
grep -B2 -A12 'Failure$\|error:\|what()' "$OUT/tests.log" | head -60
grep -i 'error' "$OUT/trainer.log" 2>/dev/null | head -10
grep -E '^========= (Invalid|Error|.*SUMMARY)' "$OUT/tests.log" | head -20
echo "----- measured errors"
grep -h '^\[ \(errors\|curve\|alloc\|init\|batch\) ' "$OUT/tests.log" | head -60
echo "----- benchmark"
tail -5 "$OUT/bench.log" 2>/dev/null
python3 - "$OUT/bench.json" <<'EOF' || true
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print("no bench.json:", e); sys.exit(0)
print(f"{j['device']}, {j['model']['parameters']/1e9:.3f}B parameters, memory used {j['device_memory_used_gib']:.1f} GiB")
print(f"{'workload':8} {'packing':8} {'mb':>3} {'tokens':>7} {'step s':>7} {'fb s':>6} {'opt s':>6} {'tok/s':>8} {'TF/s':>6} {'MFU':>6}")
for name, w in j.get("workloads", {}).items():
    for p in ("tree", "per_path"):
        r = w[p]
        print(f"{name:8} {p:8} {r['micro_batches']:>3} {r['packed_tokens']:>7} {r['step_s']:>7.3f} {r['fwd_bwd_s']:>6.3f} "
              f"{r['optimizer_s']:>6.3f} {r['tokens_per_s']:>8.0f} {r['model_tflops']:>6.1f} {100*r['mfu']:>5.1f}%")
    print(f"{name:8} speedup {w['speedup']:.3f} FLOP ratio {w['flop_ratio']:.3f} speedup/FLOP ratio "
          f"{w['speedup_over_flop_ratio']:.3f} (executed FLOPs: ratio {w['executed_flop_ratio']:.3f}, "
          f"speedup/ratio {w['speedup_over_executed_flop_ratio']:.3f}) loss rel diff {w['loss_rel_diff']:.2e}")
for name, b in j.get("breakdown", {}).items():
    for p, r in b.items():
        print(f"{name:5} {p[:8]:8} N {r['tokens']:6} total {r['total_ms']:6.1f} ms: gemm {r['gemm_ms']:6.1f} "
              f"({r['gemm_tflops']:.0f} TF/s) attn {r['attention_ms']:6.1f} ({r['attention_tflops_14']:.0f}) "
              f"head {r['head_ms']:5.1f} ({r['head_tflops']:.0f}) norm {r['norm_rope_swiglu_ms']:5.1f} "
              f"other {r['other_ms']:5.1f}")
EOF
echo "----- tests"
cat "$summary"
