#!/usr/bin/env bash
# The default-size table beside fairseq's other non-autoregressive models (python -m benchmarks.run
# --peers-table) on a GPU machine with no network, in calls of a few minutes each. Every call reuses the
# finished steps in WORK, which stays on the machine between calls.
#
#   bash benchmarks/gpu_peers.sh train  [SECONDS]   # install + build (once), trainings side by side, then
#                                                   # sweeps and timed decodes while time is left
#   bash benchmarks/gpu_peers.sh decode [SECONDS]   # no new training: the sweeps and timed decodes left
#
# SECONDS (default 480): this call's wall-clock budget. Trainings stop (fairseq --stop-time-hours; the updates
# reached are recorded) to end within it, and no step starts that could not finish in it. OUT gets, as they
# change: results.json and results.md, progress.log (this script's output) and, at the end, work.tar.gz (every
# step's JSON, training log and decode output; no checkpoints).
#
# GPU_DIR (default REPO/.gpu) holds whl/ (the wheels fairseq needs, fairseq-fixed as its sdist) and kit/:
# teacher/{checkpoint.pt,data-bin,distilled/data-bin}, insertion/{checkpoint.pt,results.json} and
# raw/{valid,test}.{src,tgt} (the raw references); the first call copies kit/ into WORK. Environment: WORK
# (default TMP/peers), SITE (default TMP/site, where the wheels and fairseq go; TMP is $TMPDIR or /tmp), OUT
# (default WORK/out), PYTHON (default python3), DEVICE (default cuda), JOBS (default 8), BENCH_ARGS (more
# benchmark flags, last: sizes for a dry run), FIND_LINKS (another wheel directory, e.g. for another Python).
set -uo pipefail
PHASE=${1:?usage: gpu_peers.sh train|decode [SECONDS]}
BUDGET=${2:-480}
START=$(date +%s)
REPO=$(cd "$(dirname "$0")/.." && pwd)
GPU_DIR=${GPU_DIR:-$REPO/.gpu}
WORK=${WORK:-${TMPDIR:-/tmp}/peers}
SITE=${SITE:-${TMPDIR:-/tmp}/site}
OUT=${OUT:-$WORK/out}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
JOBS=${JOBS:-8}
case $PHASE in train|decode) ;; *) echo "PHASE must be train or decode, got $PHASE" >&2; exit 2 ;; esac
mkdir -p "$WORK" "$OUT"
exec > >(tee -a "$OUT/progress.log") 2>&1
left() { echo $((BUDGET - ($(date +%s) - START))); }
echo "== gpu_peers.sh $PHASE $BUDGET on $(hostname) at $(date -u +%FT%TZ)"

export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export PATH=$SITE/bin:$PATH
export PYTHONUNBUFFERED=1
# fairseq's CUDA extensions are not built (no nvcc needed): the Levenshtein Transformer's edit distances use
# fairseq's CPU libnat, its own fallback
unset CUDA_HOME

install() {
    local pip=("$PY" -m pip) links=(--find-links "$GPU_DIR/whl")
    # pip from its own wheel where the machine has none
    "$PY" -m pip --version >/dev/null 2>&1 || pip=("$PY" "$(ls "$GPU_DIR"/whl/pip-*.whl | head -1)/pip")
    [ -n "${FIND_LINKS:-}" ] && links+=(--find-links "$FIND_LINKS")
    # what fairseq and the benchmark import; setuptools and wheel only where the machine lacks them
    local names=(pyyaml bitarray regex cffi pycparser hydra-core omegaconf antlr4-python3-runtime sacremoses click
                 joblib cloudpickle tqdm packaging subword-nmt mock)
    "$PY" -c "import setuptools, wheel" 2>/dev/null || names+=(setuptools wheel)
    "${pip[@]}" install -q --no-index --no-deps --target "$SITE" "${links[@]}" "${names[@]}" || return 1
    # fairseq imports scikit-learn and scipy for criteria and tasks this benchmark does not use: stand-ins
    # raise if called, and only where the machine lacks the real ones
    if ! "$PY" -c "import sklearn.metrics" 2>/dev/null; then
        mkdir -p "$SITE/sklearn"
        printf 'def _absent(*a, **k):\n    raise ImportError("scikit-learn is not installed")\n' > "$SITE/sklearn/__init__.py"
        printf 'from . import _absent as f1_score, _absent as matthews_corrcoef  # noqa\n' > "$SITE/sklearn/metrics.py"
    fi
    if ! "$PY" -c "import scipy.stats" 2>/dev/null; then
        mkdir -p "$SITE/scipy"
        printf 'def _absent(*a, **k):\n    raise ImportError("scipy is not installed")\n' > "$SITE/scipy/__init__.py"
        printf 'from . import _absent as pearsonr, _absent as spearmanr  # noqa\n' > "$SITE/scipy/stats.py"
    fi
    # fairseq-fixed from its sdist against this machine's torch, its C++ extensions compiled in parallel and
    # without debug information (--upgrade: its bin/ with the fairseq-* commands replaces the wheels' bin/)
    printf '[build_ext]\nparallel = %s\n' "$(nproc)" > "$WORK/build_ext.cfg"
    MAX_JOBS=$(nproc) CFLAGS=-g0 "${pip[@]}" install -q --no-index --no-deps \
        --no-build-isolation --upgrade --target "$SITE" "$GPU_DIR"/whl/fairseq_fixed-*.tar.gz || return 1
    "$PY" -c "import fairseq, fairseq.libnat, fairseq.data.data_utils_fast, sacremoses, torch
print('fairseq', fairseq.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" || return 1
    touch "$SITE/.installed"
}

if [ ! -f "$SITE/.installed" ]; then
    echo "== install and build ($(left) s left)"
    t0=$(date +%s)
    install || { echo "install failed"; exit 1; }
    echo "== installed in $(($(date +%s) - t0)) s"
fi

# the kit and the data in WORK, so that a later call needs nothing from GPU_DIR
KIT=$WORK/kit
DATA=$WORK/data
if [ ! -f "$DATA/raw/test.tgt" ]; then
    rm -rf "$KIT" "$DATA"
    cp -r "$GPU_DIR/kit" "$KIT" && mkdir -p "$DATA/raw" && cp -r "$KIT/teacher/data-bin" "$DATA/data-bin" &&
        cp "$KIT"/raw/valid.* "$KIT"/raw/test.* "$DATA/raw/" || { echo "no kit in $GPU_DIR/kit"; exit 1; }
fi

sync_out() {
    for f in results.json results.md iterations.png; do
        [ -f "$WORK/bench/$f" ] && cp "$WORK/bench/$f" "$OUT/$f.tmp" && mv "$OUT/$f.tmp" "$OUT/$f"
    done
}

# no step starts with less than ~20 s left; the trainings end ~20 s before that
DEADLINE=$(($(left) - 15))
BOX=0
[ "$PHASE" = train ] && BOX=$((DEADLINE - 20))
echo "== benchmark: deadline ${DEADLINE} s, training box ${BOX} s"
cd "$REPO" || exit 1
# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
timeout -k 5 $((DEADLINE + 10)) "$PY" -m benchmarks.run --out "$WORK/bench" --data "$DATA" --device "$DEVICE" \
    --jobs "$JOBS" --peers-table --teacher "$KIT/teacher/checkpoint.pt" \
    --distilled "$KIT/teacher/distilled/data-bin" --warm-model "$KIT/insertion/checkpoint.pt" \
    --updates 1800 --max-tokens 4096 --warmup 500 --dropout 0.3 --clip-norm 0 --betas 1 2 3 4 \
    --batch1-sentences 100 --prestart --deadline "$DEADLINE" --train-box "$BOX" \
    --note "fairseq-fixed 0.12.3.1 built from its sdist on this machine without its CUDA extensions: the Levenshtein Transformer computes its edit distances with fairseq's CPU libnat." \
    --note "The kit's checkpoints were carried with fp16-stored weights and are loaded as fp32." \
    ${BENCH_ARGS:-} &
BENCH=$!
while kill -0 "$BENCH" 2>/dev/null; do sync_out; sleep 5; done
wait "$BENCH"
RC=$?
sync_out
tar czf "$OUT/work.tar.gz.tmp" -C "$WORK/bench" --exclude='*.pt' --exclude='./data' --exclude='*-head*' \
    --exclude='*.bin' --exclude='*.idx' . && mv "$OUT/work.tar.gz.tmp" "$OUT/work.tar.gz"
echo "== benchmark exit $RC; $(left) s of the budget left"
exit "$RC"
