#!/usr/bin/env bash
# make demo: Multi30k en->de with a small Insertion Transformer on CPU (about 20 minutes on 2 cores).
#   prepare (Moses + joint BPE + fairseq-preprocess) -> fairseq-train (binary tree, slot finalization)
#   -> fairseq-generate --decoding parallel on test_2016_flickr -> detokenised sacreBLEU + iterations.
# Usage: demo.sh [RAW_DIR]   (RAW_DIR holds Multi30k's raw {train,val,test_2016_flickr}.{en,de}.gz;
#                             without it prepare.py downloads them)
# Environment: DEMO_DIR (default .demo), UPDATES (default 500), DEVICE_FLAGS (default --cpu).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
raw=${1:-}
work=${DEMO_DIR:-$repo/.demo}
updates=${UPDATES:-500}
device=${DEVICE_FLAGS:---cpu}
mkdir -p "$work"
start=$(date +%s)

if [ ! -f "$work/data/data-bin/dict.src.txt" ]; then
  python "$here/prepare.py" --out "$work/data" --src en --tgt de ${raw:+--raw-dir "$raw"}
fi

python -c "import torch; print(f'torch {torch.__version__}, threads {torch.get_num_threads()}')"
fairseq-train "$work/data/data-bin" --user-dir "$repo/fairseq_insertion" \
  --task insertion_translation --arch insertion_transformer_small --share-all-embeddings \
  --criterion insertion_loss --order binary_tree --tau 1.0 --termination slot --label-smoothing 0.1 \
  --optimizer adam --adam-betas '(0.9, 0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 200 \
  --clip-norm 1.0 --dropout 0.1 --max-tokens 4096 --max-update "$updates" --seed 1 \
  --save-dir "$work/checkpoints" --no-epoch-checkpoints --disable-validation \
  --log-format simple --log-interval 50 $device 2>&1 | tee "$work/train.log" | grep -E "train_inner|done training"

fairseq-generate "$work/data/data-bin" --user-dir "$repo/fairseq_insertion" --task insertion_translation \
  --path "$work/checkpoints/checkpoint_last.pt" --gen-subset test --decoding parallel --eos-penalty 0.5 \
  --batch-size 128 --post-process subword_nmt --print-step $device > "$work/generate.out" 2> "$work/generate.log"
grep -E "Translated|insertion decoding" "$work/generate.log" "$work/generate.out" | sed 's/^[^:]*://'

python "$here/score.py" --generate-output "$work/generate.out" --reference "$work/data/raw/test.tgt" \
  --lang de --json "$work/score.json"
echo "demo finished in $(( $(date +%s) - start )) s; outputs in $work"
