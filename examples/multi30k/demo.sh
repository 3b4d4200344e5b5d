#!/usr/bin/env bash
# make demo: Multi30k en->de with a small Insertion Transformer on CPU (about 20 minutes on 2 cores).
#   prepare (Moses + joint BPE + fairseq-preprocess) -> fairseq-train (binary tree, slot finalization)
#   -> fairseq-generate --decoding parallel on test_2016_flickr -> detokenised sacreBLEU + iterations.
# Usage: demo.sh [RAW_DIR]   (RAW_DIR holds Multi30k's raw {train,val,test_2016_flickr}.{en,de}.gz;
#                             without it, or with an empty one, prepare.py downloads them)
# Environment: DEMO_DIR (default .demo), UPDATES (default 500), DEVICE_FLAGS (default --cpu),
#              BETAS (EOS penalties tried on valid, default "0 1 2 3").
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
  if [ -n "$raw" ]; then
    echo "raw Multi30k from $raw"
  else
    echo "raw Multi30k: downloading it into $work/data/raw_download"
  fi
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

gen() {  # gen SUBSET BETA OUT
  fairseq-generate "$work/data/data-bin" --user-dir "$repo/fairseq_insertion" --task insertion_translation \
    --path "$work/checkpoints/checkpoint_last.pt" --gen-subset "$1" --decoding parallel --eos-penalty "$2" \
    --batch-size 128 --post-process subword_nmt --print-step $device > "$3" 2> "$3.log"
}
# EOS penalty (paper: "Baseline Results") chosen on the validation set, then applied to test
best_beta=0; best_bleu=-1
for beta in ${BETAS:-0 1 2 3}; do
  gen valid "$beta" "$work/valid.beta$beta.out"
  bleu=$(python "$here/score.py" --generate-output "$work/valid.beta$beta.out" --reference "$work/data/raw/valid.tgt" \
    --lang de --json "$work/valid.beta$beta.json" | sed -n 's/^BLEU = \([0-9.]*\).*/\1/p')
  echo "valid: eos penalty $beta -> BLEU $bleu"
  if python -c "import sys; sys.exit(0 if float('$bleu') > float('$best_bleu') else 1)"; then best_beta=$beta; best_bleu=$bleu; fi
done
echo "test_2016_flickr, parallel decoding, eos penalty $best_beta:"
gen test "$best_beta" "$work/generate.out"
grep -hE "Translated|insertion decoding" "$work/generate.out.log" | sed 's/^[^:]*:[^:]*://'
python "$here/score.py" --generate-output "$work/generate.out" --reference "$work/data/raw/test.tgt" \
  --lang de --json "$work/score.json"
echo "demo finished in $(( $(date +%s) - start )) s; outputs in $work"
