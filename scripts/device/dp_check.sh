#!/usr/bin/env bash
# Data parallelism with NCCL on a 2-GPU machine: the communicator's tests, the CUDA backend's
# overlap hook, `treetrain launch --nproc 2` against one process, and timings.
#
#   scripts/device/dp_check.sh stage   here (no GPU): bazel build nccl_test, backend_cuda_test,
#                                      treetrain and bench:dp_bench, copy the stripped binaries
#                                      (and libgomp) to .device/dp/ (ignored by git; carried)
#   scripts/device/dp_check.sh [run]   there, in about 3 minutes:
#     (a) tests: tests/distributed/nccl_test (collectives exact on integer-valued data, bucketed
#         all-reduce = whole buffer, a rank that leaves fails the other within the timeout), and
#         backend_cuda_test's NotifyReportsEachGradientOnceWhenFinal (the overlap hook);
#     (b) equivalence: the quickstart Qwen3 with head_dim 64 (CUDA backend), 8 steps of 4
#         micro-batches, on 2 ranks (treetrain launch --nproc 2: NCCL, bucketed all-reduce
#         overlapped with the last backward) and in one process with the same config (the same
#         global batch: grad_accum means the same for any number of ranks), compared by
#         dp_compare.py. Rule: per-step loss and grad norm within 1e-2 relative; final weights:
#         ||p_dp - p_one|| / ||p_one - p_init|| <= 1e-2 (optim.eps 1e-3; see dp_compare.py);
#     (c) speed: dp_bench train, the Qwen3-1.7B shape on generated agent-rollout trees (17.5k
#         tokens each, one per micro-batch), 4 micro-batches per step, 2 warm-up + 4 timed steps,
#         on 1 GPU and on 2: step time, tokens/s, speed-up, and reduce_s (the all-reduce time
#         backward did not hide);
#     (d) bandwidth: dp_bench allreduce, the plain NCCL all-reduce of the 1.72e9-value fp32
#         gradient (6.9 GB) in one call and in the trainer's 25 MiB buckets, and of one bucket:
#         algorithm and bus bandwidth (nccl-tests' busbw = algbw * 2 (W - 1) / W).
#     Logs in $OUT (tests.log, trainer.log, compare.txt, bench.jsonl, bench.log, topo.txt,
#     summary.txt); the summary table is printed last.
# Device run:  run(command="scripts/device/dp_check.sh", carry=[".device/dp"], kind="nvidia-h200-x2",
#                  timeout_s=420)
# Environment: SKIP_TESTS=1, SKIP_EQUIV=1, SKIP_BENCH=1, SKIP_ALLREDUCE=1; BENCH_ARGS (extra
# dp_bench train flags, e.g. "--layers 8").
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

DIR=.device/dp

if [ "${1:-run}" = "stage" ]; then
  bazel build //tests/distributed:nccl_test //tests/model_cuda:backend_cuda_test //trainer:treetrain \
    //bench:dp_bench || exit 1
  rm -rf "$DIR" && mkdir -p "$DIR/lib"
  cp bazel-bin/tests/distributed/nccl_test bazel-bin/tests/model_cuda/backend_cuda_test \
    bazel-bin/trainer/treetrain bazel-bin/bench/dp_bench "$DIR/"
  chmod u+w "$DIR"/* && strip "$DIR/nccl_test" "$DIR/backend_cuda_test" "$DIR/treetrain" "$DIR/dp_bench"
  cp -L /usr/lib/x86_64-linux-gnu/libgomp.so.1 "$DIR/lib/"  # fallback only
  du -sh "$DIR"
  exit 0
fi

# NVLink SHARP multicast stays off (KINDS.md: it can take the host's GPUs out of service); the
# communicator also defaults it to 0, this makes it explicit for every process started here.
export NCCL_NVLS_ENABLE=0
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
if ! ldconfig -p | grep -q 'libgomp.so.1 '; then
  export LD_LIBRARY_PATH="$PWD/$DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# libnccl.so.2: the system's, else the toolkit's, else the one of the nvidia-nccl wheel.
if ! ldconfig -p | grep -q 'libnccl.so.2 '; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib \
    "$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0] + "/lib")' 2>/dev/null)"; do
    if [ -n "$d" ] && [ -e "$d/libnccl.so.2" ]; then
      export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      break
    fi
  done
fi
OUT=${OUT:-/tmp/dp_check}
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >"$summary"
T=/tmp/dp_check_runs
rm -rf "$T" && mkdir -p "$T"
tt="$DIR/treetrain"
{
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,memory.used --format=csv
  nvidia-smi topo -m
  ldd "$DIR/dp_bench" | grep -E 'nccl|cublas|gomp'
} >"$OUT/topo.txt" 2>&1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "GPUs visible: $gpus; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE" >>"$summary"

# (a) Tests.
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  : >"$OUT/tests.log"
  for spec in "nccl_test:*" "backend_cuda_test:*Notify*"; do
    t=${spec%%:*} filter=${spec#*:}
    echo "===== $t $filter" >>"$OUT/tests.log"
    start=$SECONDS
    timeout 120 "$DIR/$t" --gtest_color=no --gtest_filter="$filter" >>"$OUT/tests.log" 2>&1
    rc=$?
    section=$(sed -n "/^===== $t /,\$p" "$OUT/tests.log")
    printf "(a) %-18s %-12s passed %2d failed %2d skipped %2d %4ds\n" "$t" \
      "$([ $rc -eq 0 ] && echo PASS || echo "FAIL(rc=$rc)")" "$(grep -c '^\[       OK \]' <<<"$section")" \
      "$(grep -c '^\[  FAILED  \].*(' <<<"$section")" "$(grep -c '^\[  SKIPPED \].*(' <<<"$section")" \
      $((SECONDS - start)) >>"$summary"
  done
fi

# (b) Two ranks against one process, same global batch.
if [ "${SKIP_EQUIV:-0}" != 1 ]; then
  start=$SECONDS
  common=(--config configs/quickstart.yaml --set device=cuda --set model.head_dim=64
          --set "data.path=$T/data.jsonl" --set train.max_steps=8 --set train.grad_accum=4
          --set train.checkpoint_every=0 --set train.log_every=1 --set optim.eps=1.0e-3
          --set schedule.warmup_steps=2 --set distributed.timeout_s=60 --set distributed.collective_timeout_s=120)
  {
    "$tt" generate --kind rollouts --out "$T/data.jsonl" &&
    echo "===== init (one step at lr 1e-30: the fresh weights)" &&
    timeout 60 "$tt" train "${common[@]}" --set "run_dir=$T/init" --set train.max_steps=1 \
      --set schedule.warmup_steps=0 --set optim.lr=1.0e-30 &&
    echo "===== one process" &&
    timeout 60 "$tt" train "${common[@]}" --set "run_dir=$T/one" &&
    echo "===== launch --nproc 2" &&
    timeout 90 "$tt" launch --nproc 2 -- train "${common[@]}" --set "run_dir=$T/dp"
  } >"$OUT/trainer.log" 2>&1
  rc=$?
  echo "(b) treetrain runs rc=$rc ($((SECONDS - start))s); dp communicator: $(grep -o 'joining 2 ranks.*communicator[^;]*' \
    "$OUT/trainer.log" | head -1 | sed 's/.*), //')" >>"$summary"
  python3 scripts/device/dp_compare.py "$T/init" "$T/one" "$T/dp" >"$OUT/compare.txt" 2>&1
  echo "(b) dp_compare rc=$?: $(tail -1 "$OUT/compare.txt")" >>"$summary"
fi

# (c) Step time on 1 and 2 GPUs, Qwen3-1.7B shape.
: >"$OUT/bench.jsonl"
: >"$OUT/bench.log"
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  "$tt" generate --kind rollouts --out "$T/agent.jsonl" --num-trees 8 --vocab-size 151936 --seed 17 \
    --prompt-len 4096 --turns 6 --turn-len 160 --branches 4 --branch-turns 2 >>"$OUT/bench.log" 2>&1
  start=$SECONDS
  echo "===== dp_bench train, 1 GPU" >>"$OUT/bench.log"
  CUDA_VISIBLE_DEVICES=0 timeout 150 "$DIR/dp_bench" train --data "$T/agent.jsonl" ${BENCH_ARGS:-} \
    >>"$OUT/bench.jsonl" 2>>"$OUT/bench.log"
  echo "(c) dp_bench train 1 GPU rc=$? ($((SECONDS - start))s)" >>"$summary"
  start=$SECONDS
  echo "===== dp_bench train, 2 GPUs" >>"$OUT/bench.log"
  timeout 150 "$tt" launch --nproc 2 --program "$DIR/dp_bench" -- train --data "$T/agent.jsonl" ${BENCH_ARGS:-} \
    2>>"$OUT/bench.log" | sed 's/^\[rank 0\] //' >>"$OUT/bench.jsonl"
  echo "(c) dp_bench train 2 GPUs rc=${PIPESTATUS[0]} ($((SECONDS - start))s)" >>"$summary"
fi

# (d) The plain all-reduce of the gradient buffer.
if [ "${SKIP_ALLREDUCE:-0}" != 1 ]; then
  start=$SECONDS
  echo "===== dp_bench allreduce, 2 GPUs" >>"$OUT/bench.log"
  # NCCL_DEBUG=INFO here: bench.log then says which transport the ranks use (P2P/NVLink, SHM, ...).
  NCCL_DEBUG=INFO timeout 90 "$tt" launch --nproc 2 --program "$DIR/dp_bench" -- allreduce 2>>"$OUT/bench.log" |
    sed 's/^\[rank 0\] //' >>"$OUT/bench.jsonl"
  echo "(d) dp_bench allreduce rc=${PIPESTATUS[0]} ($((SECONDS - start))s)" >>"$summary"
fi

echo "----- failures"
grep -B2 -A12 'Failure$\|what()' "$OUT/tests.log" 2>/dev/null | head -40
grep -i 'error' "$OUT/trainer.log" "$OUT/bench.log" 2>/dev/null | grep -v 'NCCL INFO' | head -10
echo "----- (b) equivalence"
cat "$OUT/compare.txt" 2>/dev/null
echo "----- (c)/(d) timings"
grep -m2 -o 'Channel 00.* via .*' "$OUT/bench.log" 2>/dev/null | sed 's/^/NCCL transport: /'
python3 - "$OUT/bench.jsonl" <<'EOF' || true
import json, sys
rows = []
for l in open(sys.argv[1]):
    l = l.strip()
    if l.startswith("{"):
        try:
            rows.append(json.loads(l))
        except ValueError:
            pass
train = {r["world_size"]: r for r in rows if r.get("mode") == "train"}
if train:
    print(f"{'GPUs':>4} {'step s':>7} {'tok/s':>8} {'speed-up':>8} {'eff.':>6} {'reduce ms':>9} {'MFU r0':>7} "
          f"{'tokens/step':>11} {'loss':>8}")
    base = train.get(1)
    for w in sorted(train):
        r = train[w]
        sp = r["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
        print(f"{w:>4} {r['step_s']:>7.3f} {r['tokens_per_s']:>8.0f} {sp:>8.3f} {sp / w:>6.3f} "
              f"{1e3 * r['reduce_s']:>9.1f} {100 * r['mfu_rank0']:>6.1f}% {r['tokens_per_step']:>11} {r['last_loss']:>8.4f}")
    if 1 in train and 2 in train:
        r1, r2 = train[1], train[2]
        print(f"same global batch: {r1['tokens_per_step'] == r2['tokens_per_step']}; last-step loss rel diff "
              f"{abs(r2['last_loss'] - r1['last_loss']) / abs(r1['last_loss']):.2e}")
ar = [r for r in rows if r.get("mode") == "allreduce"]
if ar:
    print(f"{'all-reduce':14} {'GB':>6} {'calls':>5} {'ms':>8} {'algbw GB/s':>10} {'busbw GB/s':>10}")
    for r in ar:
        print(f"{r['what']:14} {r['bytes'] / 1e9:>6.2f} {r['calls']:>5} {r['ms']:>8.2f} {r['algbw_GBps']:>10.1f} "
              f"{r['busbw_GBps']:>10.1f}")
    whole = {r["what"]: r for r in ar}
    if "grad_whole" in whole and 2 in train:
        print(f"whole-gradient all-reduce {whole['grad_whole']['ms']:.1f} ms vs {1e3 * train[2]['reduce_s']:.1f} ms "
              f"left exposed after backward in training (reduce_s, includes the norm)")
EOF
echo "----- summary"
cat "$summary"
