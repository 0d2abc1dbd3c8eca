#!/usr/bin/env bash
# The evidence run on one lent GPU in one call, under 8 minutes in all (python benchmarks/evidence.py, then
# predict_paper.py scoring its file). Needs a CUDA build of torch and gac's Python dependencies (transformers, numpy,
# pandas, pyyaml); installs nothing, except wheels from $GAC_WHEELS when that folder is set (pip --no-index).
# Writes evidence-<gpu>.json, evidence.log, predict_paper.txt and nvidia-smi.txt to $OUT (default: the current
# folder). Run from anywhere:   bash benchmarks/evidence_gpu.sh [more evidence.py arguments]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT_DIR="${OUT:-$PWD}"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -n "${GAC_WHEELS:-}" ] && [ -d "$GAC_WHEELS" ]; then
  "$PY" -m pip install -q --no-index --no-deps "$GAC_WHEELS"/*.whl || { echo "evidence_gpu.sh: installing \$GAC_WHEELS failed"; exit 2; }
fi
# prerequisites first, in seconds, so a box that cannot run it costs no GPU minutes
"$PY" - <<'PY' || exit 2
import sys
try:
    import torch, transformers, numpy, pandas, yaml  # noqa: F401
    import gac.compression.structure, gac.predict  # noqa: F401
except Exception as e:
    sys.exit(f"evidence_gpu.sh: {type(e).__name__}: {e}; install gac's dependencies (pip install -e .) or set GAC_WHEELS")
if not torch.cuda.is_available():
    sys.exit("evidence_gpu.sh: torch sees no CUDA GPU here")
print(f"evidence_gpu.sh: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
PY
nvidia-smi > "$OUT_DIR/nvidia-smi.txt" 2>&1 || true
GPU=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0).split()[-1].lower())" 2>/dev/null || echo gpu)
FILE="$OUT_DIR/evidence-$GPU.json"
# the run checks its own budget (330 s, 60 of them kept for its printed table); timeout is the backstop
timeout 380 "$PY" benchmarks/evidence.py --out "$FILE" --force --budget-s 330 "$@" 2>&1 | grep -v '^USDT' | tee "$OUT_DIR/evidence.log"
[ -s "$FILE" ] || { echo "evidence_gpu.sh: no evidence file was written"; exit 1; }
timeout 60 "$PY" benchmarks/predict_paper.py --evidence "$FILE" --evidence-only --boot 10 2>&1 | tee "$OUT_DIR/predict_paper.txt"
echo "evidence_gpu.sh: done; files in $OUT_DIR"
