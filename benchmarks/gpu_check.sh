#!/usr/bin/env bash
# The GPU check: run it whenever a GPU is lent (one H200 expected; about 3 minutes, every step time-limited: at
# most 7.8 minutes in all).
#
#   bash benchmarks/gpu_check.sh            # or: make gpu-check
#
# Writes JSON only, into $OUT (default benchmarks/results/gpu/), 5 files:
#   nvidia_smi.json                  nvidia-smi's facts per GPU, the driver's CUDA, torch's CUDA/NCCL/device
#   optimizer_step_cuda.json         benchmarks/optimizer_step.py --device cuda --nproc 1 (T5-small shape)
#   recipe_cuda.json                 recipes/t5_translation.py, built-in data, $RECIPE_STEPS steps, --bf16:
#                                    the Trainer's all_results.json
#   recipe_cuda_trainer_state.json   its trainer_state.json (the logged loss curve)
#   gpu_check.json                   every step's command, exit code, seconds and log tail
# A failed step is recorded and the next one still runs; the exit code is 1 if any failed.
#
# Uses the torch already installed (never reinstalls it): `pip install -e . --no-deps`, then only the package's
# and the `recipes` extra's missing pure-python requirements (torch pinned to the installed version). Offline,
# point pip at carried wheels (PIP_FIND_LINKS=dir PIP_NO_INDEX=1); if pip cannot install, the checkout still runs
# from PYTHONPATH. No Hub access: HF_HUB_OFFLINE=1. GPU_CHECK_SMOKE=1 runs the same plumbing on the CPU in tiny
# sizes (to test this script where no GPU is).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
OUT="${OUT:-$REPO/benchmarks/results/gpu}"
PYTHON="${PYTHON:-python}"
RECIPE_STEPS="${RECIPE_STEPS:-100}"
SMOKE="${GPU_CHECK_SMOKE:-0}"
mkdir -p "$OUT"
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

say() { echo "[gpu_check $(date +%H:%M:%S)] $*"; }

# run NAME LIMIT_S CMD...: run CMD under a time limit, its output on the terminal and in $LOGS/NAME.log;
# record NAME, exit code and seconds; never stops the script.
run() {
    local name=$1 limit=$2 start=$SECONDS rc=0
    shift 2
    say "$name: $*"
    printf '%s\0' "$@" > "$LOGS/$name.cmd"
    timeout "$limit" "$@" 2>&1 | tee "$LOGS/$name.log" || rc=$?
    printf '%s %s %s\n' "$name" "$rc" "$((SECONDS - start))" >> "$LOGS/steps.txt"
    say "$name: exit $rc after $((SECONDS - start)) s"
}

# The summary, gpu_check.json, from $LOGS; exit 1 if any step failed.
summarize() {
    "$PYTHON" - "$LOGS" "$OUT/gpu_check.json" "$SMOKE" <<'EOF'
import datetime, json, subprocess, sys
from pathlib import Path
logs, out, smoke = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
steps = []
for line in (logs / "steps.txt").read_text().splitlines():
    name, rc, seconds = line.split()
    log = logs / f"{name}.log"
    steps.append({"name": name, "command": (logs / f"{name}.cmd").read_text().rstrip("\0").split("\0"),
                  "exit_code": int(rc), "timed_out": int(rc) == 124, "seconds": int(seconds),
                  "log_tail": log.read_text(errors="replace").splitlines()[-40:] if log.exists() else []})
git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
report = {"ok": all(s["exit_code"] == 0 for s in steps), "smoke_on_cpu": smoke,
          "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "git_commit": git("rev-parse", "HEAD"), "git_dirty": bool(git("status", "--porcelain")), "steps": steps}
out.write_text(json.dumps(report, indent=2) + "\n")
print(f"[gpu_check] {'all steps ok' if report['ok'] else 'FAILED: ' + ', '.join(s['name'] for s in steps if s['exit_code'])}"
      f"; wrote {out}")
sys.exit(0 if report["ok"] else 1)
EOF
}

say "repo $REPO, results in $OUT, python $(command -v "$PYTHON")"

# 0. Is there a GPU torch can use? Without one nothing else can run: record that and stop.
if [[ "$SMOKE" != 1 ]]; then
    run cuda_available 30 "$PYTHON" -c 'import torch; import sys; print("torch", torch.__version__, "CUDA", torch.version.cuda, "devices", torch.cuda.device_count()); sys.exit(0 if torch.cuda.is_available() else "no CUDA device visible to torch")'
    if [[ "$(tail -n 1 "$LOGS/steps.txt" | cut -d' ' -f2)" != 0 ]]; then
        summarize
        exit 1
    fi
fi

# 1. The package from this checkout, without touching torch; missing pure-python requirements only (the smoke
#    run leaves this machine's environment as it is).
[[ "$SMOKE" == 1 ]] || run install 90 bash -c '
    set -euo pipefail
    "$0" -m pip install -q --no-deps --no-build-isolation -e . \
        || echo "pip install -e . failed: the checkout runs from PYTHONPATH"
    missing=$("$0" - <<"EOF"
try:
    import tomllib
except ImportError:  # Python 3.10: the copy pip ships
    from pip._vendor import tomli as tomllib
from importlib.metadata import PackageNotFoundError, version
from pip._vendor.packaging.requirements import Requirement
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
for text in project["dependencies"] + project["optional-dependencies"]["recipes"]:
    req = Requirement(text)
    if req.name == "torch":
        continue
    try:
        if req.specifier.contains(version(req.name), prereleases=True):
            continue
    except PackageNotFoundError:
        pass
    print(text)
EOF
)
    if [[ -z "$missing" ]]; then echo "requirements: all present"; exit 0; fi
    echo "missing or too old:" $missing
    constraints=$(mktemp)
    "$0" -c "import torch; print(\"torch==\" + torch.__version__)" > "$constraints"
    timeout 60 "$0" -m pip install -q --retries 1 --timeout 15 -c "$constraints" $missing
' "$PYTHON"

# 2. The GPU's facts.
run nvidia_smi 30 "$PYTHON" - "$OUT/nvidia_smi.json" <<'EOF'
import json, re, shutil, subprocess, sys
FIELDS = ["index", "name", "uuid", "pci.bus_id", "driver_version", "memory.total", "memory.used", "power.limit",
          "clocks.max.sm", "clocks.max.memory", "temperature.gpu", "compute_mode", "mig.mode.current"]
def query(fields):
    done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True)
    return [line.split(", ") for line in done.stdout.strip().splitlines()] if done.returncode == 0 else None
facts = {"nvidia_smi": shutil.which("nvidia-smi")}
if facts["nvidia_smi"]:
    rows = query(FIELDS)
    if rows is None:  # an old driver refuses the whole query for one unknown field: ask one at a time
        columns = {f: query([f]) for f in FIELDS}
        fields = [f for f in FIELDS if columns[f]]
        rows = [list(r) for r in zip(*([row[0] for row in columns[f]] for f in fields))]
    else:
        fields = FIELDS
    facts["gpus"] = [dict(zip(fields, row)) for row in rows]
    header = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout
    match = re.search(r"CUDA Version:\s*([\d.]+)", header)
    facts["driver_cuda_version"] = match.group(1) if match else None
    facts["topology"] = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout
try:
    import torch
    facts["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                      "cuda_available": torch.cuda.is_available(), "device_count": torch.cuda.device_count()}
    if torch.cuda.is_available():
        nccl = torch.cuda.nccl.version()
        facts["torch"] |= {"nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
                           "cudnn": torch.backends.cudnn.version(),
                           "device_name": torch.cuda.get_device_name(0),
                           "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                           "bf16_supported": torch.cuda.is_bf16_supported()}
except Exception as err:  # the facts are still worth writing
    facts["torch_error"] = repr(err)
with open(sys.argv[1], "w") as f:
    json.dump(facts, f, indent=2)
print(json.dumps({k: v for k, v in facts.items() if k != "topology"}, indent=2))
EOF

# 3. The optimizer step on one GPU: AdamW, FlexDeMo (replicate group of one: compression and decode, no
#    exchange), the reference if its package is importable.
if [[ "$SMOKE" == 1 ]]; then
    step_args=(--device cpu --nproc 1 --model tiny --steps 3 --warmup 1)
else
    step_args=(--device cuda --nproc 1 --steps 20 --warmup 5)
fi
run optimizer_step 150 "$PYTHON" benchmarks/optimizer_step.py "${step_args[@]}" \
    --out "$OUT/optimizer_step_cuda.json" --allow_dirty --timeout_s 140

# 4. The translation recipe on its built-in data, one process on the GPU, bf16.
if [[ "$SMOKE" == 1 ]]; then
    recipe_args=(--max_steps 4 --logging_steps 2 --number_words_eval_size 16)
else
    recipe_args=(--max_steps "$RECIPE_STEPS" --logging_steps 10 --bf16)
fi
run recipe 170 "$PYTHON" recipes/t5_translation.py --output_dir "$LOGS/recipe" "${recipe_args[@]}" \
    --report_to none --disable_tqdm true --seed 0
if [[ -f "$LOGS/recipe/all_results.json" ]]; then
    cp "$LOGS/recipe/all_results.json" "$OUT/recipe_cuda.json"
    [[ -f "$LOGS/recipe/trainer_state.json" ]] && cp "$LOGS/recipe/trainer_state.json" "$OUT/recipe_cuda_trainer_state.json"
    say "copied the recipe's all_results.json and trainer_state.json to $OUT"
else
    say "the recipe wrote no all_results.json"
fi

summarize
