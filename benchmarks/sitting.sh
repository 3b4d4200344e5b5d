#!/usr/bin/env bash
# One GPU sitting of the table beside fairseq's non-autoregressive models, on a machine without network:
# the systems recipe trains (or goes on training from checkpoint_last.pt) for at most TRAIN seconds, then the
# harness measures whatever models are finished. Run it again into the same WORK to go on.
#
#   bash benchmarks/sitting.sh [TRAIN_SECONDS]        # default 300; 0: measure only
#
# GPU_DIR (default REPO/.gpu) holds whl/ (the wheels fairseq needs, fairseq-fixed as its sdist) and kit/:
# teacher/{checkpoint.pt,data-bin,distilled/data-bin}, insertion/checkpoint.pt, raw/{valid,test}.tgt.
# Environment: WORK (default TMP/peers), SITE (default TMP/site), PYTHON (default python3), JOBS (default 8).
# Writes WORK/out/results.json and results.md (paths as REPO, DATA, MODELS, KIT, INS, OUT).
set -euo pipefail
TRAIN=${1:-300}
REPO=$(cd "$(dirname "$0")/.." && pwd)
GPU_DIR=${GPU_DIR:-$REPO/.gpu}
WORK=${WORK:-${TMPDIR:-/tmp}/peers}
SITE=${SITE:-${TMPDIR:-/tmp}/site}
PY=${PYTHON:-python3}
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
unset CUDA_HOME  # fairseq's CUDA extensions are not built: the Levenshtein Transformer uses its CPU libnat
stand_in() {  # PACKAGE MODULE "NAME NAME": fairseq imports them, the benchmark never calls them
    "$PY" -c "import $1.$2" 2>/dev/null && return
    mkdir -p "$SITE/$1"
    printf 'def _absent(*a, **k):\n    raise ImportError("%s is not installed")\n' "$1" > "$SITE/$1/__init__.py"
    printf 'from . import _absent as %s, _absent as %s  # noqa\n' $3 > "$SITE/$1/$2.py"
}
install() {  # the wheels of GPU_DIR/whl, fairseq-fixed built from its sdist against this machine's torch
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" --find-links "$GPU_DIR/whl" pyyaml bitarray \
        regex cffi pycparser hydra-core omegaconf antlr4-python3-runtime sacremoses click joblib cloudpickle tqdm \
        packaging subword-nmt mock || return 1
    stand_in sklearn metrics "f1_score matthews_corrcoef" && stand_in scipy stats "pearsonr spearmanr"
    MAX_JOBS=$(nproc) CFLAGS=-g0 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --upgrade \
        --target "$SITE" "$GPU_DIR"/whl/fairseq_fixed-*.tar.gz && touch "$SITE/.installed"
}
[ -f "$SITE/.installed" ] || install || { echo "install failed"; exit 1; }
KIT=$WORK/kit DATA=$WORK/data MODELS=$WORK/models
if [ ! -f "$DATA/raw/test.tgt" ]; then
    mkdir -p "$DATA/raw" && cp -r "$GPU_DIR/kit" "$KIT" && cp -r "$KIT/teacher/data-bin" "$DATA/data-bin"
    cp "$KIT"/raw/valid.tgt "$KIT"/raw/test.tgt "$DATA/raw/"
fi
cd "$REPO"
SCHEDULE=(--updates 1800 --max-tokens 4096 --warmup 500 --dropout 0.3 --clip-norm 0)
if [ "$TRAIN" -gt 0 ]; then  # stopped at the box; the next sitting goes on from checkpoint_last.pt
    timeout "$TRAIN" "$PY" -m examples.multi30k.systems --data "$DATA" --out "$MODELS" --device cuda \
        --jobs "${JOBS:-8}" --teacher "$KIT/teacher/checkpoint.pt" --distilled "$KIT/teacher/distilled/data-bin" \
        --only ar nat_distilled binary_tree_distilled binary_tree_fp16_distilled cmlm_distilled \
        levenshtein_distilled "${SCHEDULE[@]}" || echo "trainings stopped after $TRAIN s; run again to go on"
fi
"$PY" -m benchmarks.peers --models "$MODELS" --data "$DATA" --out "$WORK/out" --device cuda --set table peers \
    --teacher "$KIT/teacher/checkpoint.pt" --warm-model "$KIT/insertion/checkpoint.pt" --betas 1 2 3 4 \
    --note "The kit's checkpoints are loaded as fp32; fairseq-fixed built without its CUDA extensions."
