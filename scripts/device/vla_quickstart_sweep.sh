#!/usr/bin/env bash
# Issue 17: GPU recipes for the VLA quickstart (CUDA-sized heads), 3 train seeds each; the sweep
# behind configs/vla_quickstart_gpu.yaml (recipe C) and docs/BENCHMARKS.md's table. Run on the
# device machine from the repository root with a built treetrain copied to
# .device/q17/treetrain (or TREETRAIN=path); writes table.txt and logs.tgz to $OUT. A dry run
# anywhere: DEV=cpu MAXSTEPS=1 EVAL_EPS=2 (SIZES: the episode counts generated).
# 4 lanes train concurrently on the one GPU (train seconds are therefore inflated); each finished
# training's closed-loop eval (100 layouts, seed 7777, CPU, 1 thread) runs in the background.
set -uo pipefail
T0=$(date +%s)
B=${TREETRAIN:-$PWD/.device/q17/treetrain}
CFG=$PWD/configs/vla_quickstart.yaml
W=/tmp/w
OUT=${OUT:-/tmp/out}
mkdir -p "$W" "$OUT"
LAUNCH_CUTOFF=${LAUNCH_CUTOFF:-200}   # no training starts after this many seconds
HARD=${HARD:-285}                     # every process is stopped by then
LANES=${LANES:-4}
el() { echo $(( $(date +%s) - T0 )); }

nvidia-smi -L
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.used --format=csv
nproc

for n in ${SIZES:-1600 3200 6400}; do
  mkdir -p "$W/ep$n"
  "$B" generate --kind nav-episodes --out "$W/ep$n/episodes.jsonl" --num-episodes $n --seed 1 >"$W/ep$n/gen.log" 2>&1 &
done
wait
echo "data generated at $(el) s"; tail -qn1 "$W"/ep*/gen.log

COMMON="--set device=${DEV:-cuda} --set model.head_dim=64 --set vision.hidden_size=128 --set vision.intermediate_size=256 --set train.checkpoint_every=0 --set train.log_every=250 --set schedule.warmup_steps=50"
S=""
M="--set model.hidden_size=128 --set model.intermediate_size=256 --set model.num_key_value_heads=2"
L="$M --set model.num_hidden_layers=4 --set vision.num_hidden_layers=3"
declare -A EPS STEPS ARGS
EPS[A]=1600; STEPS[A]=2000; ARGS[A]="$S --set data.max_tokens_per_batch=4096 --set optim.lr=3e-3"
EPS[B]=6400; STEPS[B]=3000; ARGS[B]="$S --set data.max_tokens_per_batch=16384 --set optim.lr=3e-3"
EPS[C]=3200; STEPS[C]=3000; ARGS[C]="$M --set data.max_tokens_per_batch=8192 --set optim.lr=2e-3"
EPS[D]=6400; STEPS[D]=3000; ARGS[D]="$M --set data.max_tokens_per_batch=16384 --set optim.lr=2e-3"
EPS[E]=6400; STEPS[E]=3000; ARGS[E]="$L --set data.max_tokens_per_batch=16384 --set optim.lr=1.5e-3"
ORDER=(A1 B1 C1 D1 E1 A2 B2 C2 D2 E2 A3 B3 C3 D3 E3)

trial() {  # trial R SEED
  local r=$1 s=$2 d="$W/run_$1$2" t0 t1 left
  mkdir -p "$d"
  left=$(( HARD - $(el) ))
  t0=$(date +%s.%N)
  OMP_NUM_THREADS=2 timeout "$left" "$B" train --config "$CFG" --set run_dir="$d" --set data.path="$W/ep${EPS[$r]}/episodes.jsonl" \
    --set train.seed="$s" --set train.max_steps="${MAXSTEPS:-${STEPS[$r]}}" $COMMON ${ARGS[$r]} >"$d/train.log" 2>&1
  echo "rc=$?" >>"$d/train.log"
  t1=$(date +%s.%N)
  echo "$t0 $t1" | awk '{printf "%.1f\n", $2 - $1}' >"$d/train_s"
  (
    left=$(( HARD - $(el) ))
    e0=$(date +%s.%N)
    OMP_NUM_THREADS=1 timeout "$left" "$B" eval --env nav --checkpoint "$d" --episodes ${EVAL_EPS:-100} --seed 7777 >"$d/eval.json" 2>"$d/eval.log"
    e1=$(date +%s.%N)
    echo "$e0 $e1" | awk '{printf "%.1f\n", $2 - $1}' >"$d/eval_s"
  ) &
}

lane() {  # lane K: trials K, K+LANES, ...
  local i=$1
  while [ "$i" -lt "${#ORDER[@]}" ]; do
    [ "$(el)" -ge "$LAUNCH_CUTOFF" ] && break
    local t=${ORDER[$i]}
    echo "[$(el) s] lane $1 starts ${t:0:1} seed ${t:1}"
    trial "${t:0:1}" "${t:1}"
    echo "[$(el) s] lane $1 trained ${t:0:1} seed ${t:1}: $(cat "$W/run_$t/train_s") s, $(grep -o 'done:.*' "$W/run_$t/train.log" | head -1)"
    i=$(( i + LANES ))
  done
  wait
}

for k in $(seq 0 $(( LANES - 1 ))); do lane "$k" & done
wait
echo "all done at $(el) s"

python3 - "$W" <<'PY' | tee "$OUT/table.txt"
import glob, json, os, re, sys
w = sys.argv[1]
print("| recipe | seed | train s (4 concurrent) | steps | success | SPL | random | zeroed | eval s | train rc |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for d in sorted(glob.glob(os.path.join(w, "run_*"))):
    name = os.path.basename(d)[4:]
    log = open(os.path.join(d, "train.log")).read() if os.path.exists(os.path.join(d, "train.log")) else ""
    rc = re.search(r"rc=(\d+)", log); dev = "rc " + (rc.group(1) if rc else "?")
    m = re.search(r"done: (\d+) steps in ([\d.]+)s", log)
    steps = m.group(1) if m else "-"
    ts = open(os.path.join(d, "train_s")).read().strip() if os.path.exists(os.path.join(d, "train_s")) else "-"
    es = open(os.path.join(d, "eval_s")).read().strip() if os.path.exists(os.path.join(d, "eval_s")) else "-"
    try:
        r = json.load(open(os.path.join(d, "eval.json")))
        cells = [f'{r["model"]["success"]:.2f}', f'{r["model"]["spl"]:.3f}', f'{r["random"]["success"]:.2f}',
                 f'{r["zeroed_images"]["success"]:.2f}']
    except Exception:
        cells = ["-"] * 4
    print(f"| {name[0]} | {name[1:]} | {ts} | {steps} | " + " | ".join(cells) + f" | {es} | {dev} |")
PY
cd "$W" && tar czf "$OUT/logs.tgz" ep*/gen.log run_*/train.log run_*/eval.* run_*/metrics.jsonl run_*/*_s 2>/dev/null
grep -h "device:" "$W"/run_A1/train.log | head -2
echo "total $(el) s"
