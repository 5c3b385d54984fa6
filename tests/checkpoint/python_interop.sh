#!/usr/bin/env bash
# dtensor's files as Python's own tools read and write them (CTest
# example_train_gpt_checkpoint_python; skipped, status 77, without numpy and safetensors):
#   1. a 3-D checkpoint (pp x dp x tp, ZeRO-2) and the exported model: check_files.py reads
#      them with safetensors and xxhash and finds the export equal to the checkpoint;
#   2. Python rewrites the export with safetensors.numpy.save_file (its own writer), a
#      tensor-parallel pipeline run starts from that file (--init-from) with lr 0 and
#      exports again: the weights are Python's, bit for bit.
#   python_interop.sh TRAIN_GPT SOURCE_DIR WORK_DIR
set -euo pipefail
train_gpt="$1"
source_dir="$2"
work="$3"
if ! command -v python3 >/dev/null || ! python3 -c "import numpy, safetensors" 2>/dev/null; then
  echo "SKIP: python3 with numpy and safetensors is needed (pip install numpy safetensors)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--log plain --layers 2)

echo "== a 3-D checkpoint and its export, read by Python"
"$train_gpt" --mesh pp=2,dp=2,tp=2 --fsdp 2 --steps 2 "${common[@]}" --save-dir ckpt --export model.safetensors \
  --out run.csv > run.log
python3 "$source_dir/tests/checkpoint/check_files.py" ckpt/step-00000002 model.safetensors

echo "== a file Python wrote, loaded by a pp=2,tp=2 run"
python3 - <<'PY'
from safetensors.numpy import load_file, save_file
weights = load_file("model.safetensors")
save_file(dict(sorted(weights.items(), reverse=True)), "from_python.safetensors", metadata={"format": "np"})
PY
"$train_gpt" --mesh pp=2,tp=2 --steps 1 --lr 0 --min-lr 0 "${common[@]}" --init-from from_python.safetensors \
  --export again.safetensors --out again.csv > again.log
grep -q "parameters from from_python.safetensors" again.log || { cat again.log; echo "FAIL: --init-from was not applied"; exit 1; }
python3 - <<'PY'
from safetensors.numpy import load_file
theirs, ours = load_file("from_python.safetensors"), load_file("again.safetensors")
assert sorted(theirs) == sorted(ours), "different names"
for name in theirs:
    assert theirs[name].dtype == ours[name].dtype and theirs[name].tobytes() == ours[name].tobytes(), name
print(f"PASS: {len(theirs)} tensors written by Python, loaded by dtensor on pp=2,tp=2, equal bit for bit")
PY
