#!/usr/bin/env bash
# The GPU checks of issues 27 and 41, prepared for a machine with one or more NVIDIA GPUs (<= 8 min on
# one GPU). NOT RUN YET: no GPU was lent to the session that wrote it. Run from the repository
# root with the project's venv built (.venv). Output: one line per check, then the details.
#
#   1. the GPU tests (pytest -m gpu: devices auto, RPC device maps, inspect gpus memory)
#   2. collectives recorded on NCCL (the same Flight Recorder path as gloo): a clean job's
#      counts through `rpcctl inspect collectives --json`
#   3. with 2+ GPUs: the NCCL collective hang (a rank not entering all_reduce #4) and mismatch
#      are named (NCCL refuses two ranks on one GPU, so one GPU runs 1-rank NCCL only)
#   4. `rpcctl inspect gpus --json` of an NCCL run shows real memory figures
#   5. (issue 41) a 1-rank NCCL job that holds 1 GiB on its GPU and then sleeps, kept after its
#      hang verdict (--keep-on-hang): the verdict has a line per GPU from nvidia-smi with the rank
#      holding memory (hang/gpus.json too); `rpcctl stack --native` reads it from outside (py-spy);
#      `rpcctl profile --seconds 2` writes a speedscope file; then `rpcctl stop`
# Without a GPU (nvidia-smi), each check says it is skipped and the script exits 2.
set -u
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=$(mktemp -d)
RUNS="$OUT/runs"
fail=0
say() { printf '%-60s %s\n' "$1" "$2"; }
if ! nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; then
  for check in "pytest -m gpu" "NCCL collectives counted" "inspect gpus: real memory figures" "NCCL hang / mismatch" \
               "verdict: GPU memory and use (nvidia-smi)" "stack --native of an NCCL rank" "profile of an NCCL rank"; do
    say "$check" "skipped: no NVIDIA GPU (nvidia-smi)"
  done
  exit 2
fi
GPUS=$(nvidia-smi -L | wc -l)
NPROC=$(( GPUS >= 3 ? 3 : GPUS ))

timeout 300 .venv/bin/pytest -q -n 0 -m gpu tests/test_gpu.py tests/test_gpu_evidence.py > "$OUT/pytest-gpu.txt" 2>&1 && say "pytest -m gpu" ok || { say "pytest -m gpu" FAILED; fail=1; }

job() {  # job NAME MODE NPROC HANG_TIMEOUT
  cat > "$OUT/$1.yaml" <<YAML
name: $1
script: $PWD/tests/workers/collectives_job.py
args: ["$2"]
nproc_per_node: $3
timeout: 120
hang_timeout: $4
devices: auto
env: {COLL_BACKEND: nccl}
YAML
  timeout 150 $PY -m rpcctl launch "$OUT/$1.yaml" --no-live --runs-dir "$RUNS/$1" > "$OUT/$1.txt" 2>&1
}

if [ "$NPROC" -ge 2 ]; then
  job nccl-clean clean "$NPROC" 60
  $PY -m rpcctl inspect collectives --runs-dir "$RUNS/nccl-clean" --json > "$OUT/nccl-clean.json"
  $PY - "$OUT/nccl-clean.json" "$NPROC" <<'PYCHECK' && say "NCCL collectives counted exactly ($NPROC ranks)" ok || { say "NCCL collectives counted" FAILED; fail=1; }
import json, sys
report, n = json.load(open(sys.argv[1])), int(sys.argv[2])
counts = {s["op"]: s["count"] for s in report["summary"] if s["group"] == "default_pg"}
assert counts.get("all_reduce") == 5 * n and counts.get("broadcast") == 3 * n, counts
PYCHECK
  $PY -m rpcctl inspect gpus --runs-dir "$RUNS/nccl-clean" --json > "$OUT/gpus.json"; cat "$OUT/gpus.json"
  grep -q '"memory_total_bytes": [1-9]' "$OUT/gpus.json" && say "inspect gpus: real memory figures" ok || { say "inspect gpus memory" FAILED; fail=1; }
  if [ "$NPROC" -ge 3 ]; then
    job nccl-stall stall 3 10
    grep -q "rank 2 has not entered it" "$OUT/nccl-stall.txt" && grep -q "load_batch" "$OUT/nccl-stall.txt" \
      && say "NCCL hang: the rank not in all_reduce #4 named" ok || { say "NCCL hang" FAILED; fail=1; }
    job nccl-mismatch mismatch 3 10
    grep -q "collective mismatch in pg 0: rank 1 called broadcast #4" "$OUT/nccl-mismatch.txt" \
      && say "NCCL mismatch named" ok || { say "NCCL mismatch (NCCL may also just fail: read the log)" FAILED; fail=1; }
  else
    say "NCCL hang / mismatch" "skipped: they need 3 GPUs"
  fi
else
  job nccl-one clean 1 60
  $PY -m rpcctl inspect collectives --runs-dir "$RUNS/nccl-one" --json > "$OUT/nccl-one.json"
  $PY -c "import json,sys; r=json.load(open('$OUT/nccl-one.json')); c={s['op']: s['count'] for s in r['summary']}; assert c.get('all_reduce')==5, c" \
    && say "NCCL collectives counted exactly (1 rank, 1 GPU)" ok || { say "NCCL collectives (1 rank)" FAILED; fail=1; }
  $PY -m rpcctl inspect gpus --runs-dir "$RUNS/nccl-one" --json | tee "$OUT/gpus.json"
  say "NCCL hang / mismatch" "skipped: NCCL needs one GPU per rank"
fi
# 5. GPU evidence in a verdict, native stacks and a profile of a rank on a GPU (issue 41)
cat > "$OUT/gpu_hold.py" <<'PYJOB'
import time
import torch, torch.distributed as dist
dist.init_process_group("nccl")
held = torch.ones(1 << 28, device="cuda")  # 1 GiB on the rank's GPU
dist.all_reduce(held)
torch.cuda.synchronize()
print("holding", flush=True)
time.sleep(600)  # no progress: the watchdog's verdict comes at hang_timeout
PYJOB
cat > "$OUT/gpu-hold.yaml" <<YAML
name: gpu-hold
script: $OUT/gpu_hold.py
nproc_per_node: 1
timeout: 200
hang_timeout: 6
on_hang: keep
devices: auto
YAML
$PY -m rpcctl launch "$OUT/gpu-hold.yaml" --no-live --runs-dir "$RUNS/gpu-hold" > "$OUT/gpu-hold.txt" 2>&1 &
LAUNCHER=$!
for _ in $(seq 120); do ls "$RUNS"/gpu-hold/*/hang/diagnosis.txt > /dev/null 2>&1 && break; sleep 1; done
HOLD_RUN=$(ls -d "$RUNS"/gpu-hold/*/ 2>/dev/null | head -1)
cat "${HOLD_RUN}hang/diagnosis.txt" 2>/dev/null > "$OUT/gpu-verdict.txt"
grep -Eq "^  GPU [0-9]+ \(.*\): .* GiB of .* GiB used, ([0-9]+%|\?) busy; (rank 0 \(pid [0-9]+\)|pid [0-9]+) holds" "$OUT/gpu-verdict.txt" && [ -s "${HOLD_RUN}hang/gpus.json" ] \
  && say "verdict: GPU memory and use (nvidia-smi)" ok || { say "verdict: GPU memory and use" FAILED; fail=1; }
if [ -x .venv/bin/py-spy ]; then
  $PY -m rpcctl stack --native --runs-dir "$RUNS/gpu-hold" > "$OUT/gpu-stack.txt" 2>&1
  grep -q "· native ──" "$OUT/gpu-stack.txt" && grep -q "gpu_hold.py:" "$OUT/gpu-stack.txt" \
    && say "stack --native of an NCCL rank" ok || { say "stack --native of an NCCL rank" FAILED; fail=1; }
  $PY -m rpcctl profile --runs-dir "$RUNS/gpu-hold" --seconds 2 -o "$OUT/gpu.speedscope.json" > "$OUT/gpu-profile.txt" 2>&1 \
    && grep -q speedscope "$OUT/gpu.speedscope.json" && say "profile of an NCCL rank" ok || { say "profile of an NCCL rank" FAILED; fail=1; }
else
  say "stack --native / profile of an NCCL rank" "skipped: no .venv/bin/py-spy (pip install -c constraints.txt py-spy)"
fi
$PY -m rpcctl stop --runs-dir "$RUNS/gpu-hold" --wait 30 > /dev/null 2>&1 || kill "$LAUNCHER" 2>/dev/null
wait "$LAUNCHER" 2>/dev/null

echo "details in $OUT"; for f in "$OUT"/*.txt; do echo "== $f"; tail -20 "$f"; done
exit $fail
