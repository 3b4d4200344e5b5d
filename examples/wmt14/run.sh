#!/usr/bin/env bash
# WMT'14 English-German, the paper's setup (Stern et al., 2019, "Experiments"): transformer_base sizes,
# a base Transformer teacher, sequence-level distillation with beam search, an Insertion Transformer
# (binary tree, tau = 2, slot finalization) on the distilled data, parallel decoding with an EOS penalty
# tuned on newstest2013, test on newstest2014. Written for one machine with 8 GPUs; NOT run by this
# project's CI (it takes days). Steps can be run one at a time: run.sh prepare|teacher|distill|train|evaluate
#
# Environment:
#   WORK      work directory (default ./wmt14_work)
#   FAIRSEQ   a checkout of fairseq (for examples/translation/prepare-wmt14en2de.sh; default ./fairseq)
#   GPUS      number of GPUs (default 8); UPDATES (default 300000; the paper trained 1,000,000 steps)
#   TAU       binary-tree temperature (default 2.0, the paper's best distilled model)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=${WORK:-$PWD/wmt14_work}
fairseq_src=${FAIRSEQ:-$PWD/fairseq}
gpus=${GPUS:-8}
updates=${UPDATES:-300000}
tau=${TAU:-2.0}
plugin="$repo/fairseq_insertion"
safe="$repo/examples/multi30k/fairseq_safe_load"   # plain fairseq checkpoints under torch >= 2.6
mkdir -p "$work"

# 8 GPUs x 4096 tokens x update-freq 1 ~ the transformer_base batch of 25k+25k tokens
common=(--optimizer adam --adam-betas '(0.9, 0.98)' --lr 7e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000
        --warmup-init-lr 1e-7 --clip-norm 0.0 --dropout 0.1 --weight-decay 0.0 --label-smoothing 0.1
        --max-tokens 4096 --update-freq $((8 / gpus > 0 ? 8 / gpus : 1)) --fp16 --share-all-embeddings
        --distributed-world-size "$gpus" --ddp-backend legacy_ddp --save-interval-updates 10000
        --keep-interval-updates 5 --no-epoch-checkpoints --log-format simple --log-interval 100)

prepare() {
  # fairseq's own script: downloads WMT'14 (Europarl v7, Common Crawl, News Commentary v12, the
  # newstest sets), Moses-tokenises, learns 40k joint BPE; valid = newstest2013, test = newstest2014
  (cd "$fairseq_src/examples/translation" && bash prepare-wmt14en2de.sh)
  fairseq-preprocess --source-lang en --target-lang de \
    --trainpref "$fairseq_src/examples/translation/wmt14_en_de/train" \
    --validpref "$fairseq_src/examples/translation/wmt14_en_de/valid" \
    --testpref "$fairseq_src/examples/translation/wmt14_en_de/test" \
    --destdir "$work/data-bin" --joined-dictionary --workers 16
}

teacher() {  # the base Transformer teacher (Vaswani et al., 2017)
  fairseq-train "$work/data-bin" --task translation --arch transformer_wmt_en_de \
    --criterion label_smoothed_cross_entropy "${common[@]}" --max-update 100000 --save-dir "$work/teacher"
}

distill() {  # beam search with the teacher (beam 4, length penalty 0.6), same dictionary
  fairseq-generate "$work/data-bin" --user-dir "$safe" --task translation --path "$work/teacher/checkpoint_last.pt" \
    --gen-subset train --beam 4 --lenpen 0.6 --max-tokens 16384 --required-batch-size-multiple 1 \
    --fp16 > "$work/distill.out"
  mkdir -p "$work/distill"
  grep '^S-' "$work/distill.out" | sort -t- -k2 -n | cut -f2- > "$work/distill/train.en"
  grep '^H-' "$work/distill.out" | sort -t- -k2 -n | cut -f3- > "$work/distill/train.de"
  fairseq-preprocess --source-lang en --target-lang de --trainpref "$work/distill/train" \
    --validpref "$fairseq_src/examples/translation/wmt14_en_de/valid" \
    --testpref "$fairseq_src/examples/translation/wmt14_en_de/test" --destdir "$work/data-bin-distilled" \
    --srcdict "$work/data-bin/dict.en.txt" --tgtdict "$work/data-bin/dict.de.txt" --workers 16
}

train() {  # the Insertion Transformer, transformer_base sizes, warm-started from the teacher
  fairseq-train "$work/data-bin-distilled" --user-dir "$plugin" --task insertion_translation \
    --arch insertion_transformer --criterion insertion_loss --order binary_tree --tau "$tau" --termination slot \
    --init-from-transformer "$work/teacher/checkpoint_last.pt" "${common[@]}" --max-update "$updates" \
    --save-dir "$work/insertion"
}

evaluate() {  # EOS penalty swept on newstest2013 (the paper sweeps 0-7), applied to newstest2014
  best=0; best_bleu=-1
  for beta in 0 1 2 3 4 5 6 7; do
    fairseq-generate "$work/data-bin" --user-dir "$plugin" --task insertion_translation \
      --path "$work/insertion/checkpoint_last.pt" --gen-subset valid --decoding parallel --eos-penalty "$beta" \
      --batch-size 128 --remove-bpe --scoring sacrebleu > "$work/valid.beta$beta.out"
    bleu=$(sed -n 's/.*BLEU = \([0-9.]*\).*/\1/p' "$work/valid.beta$beta.out" | tail -1)
    echo "newstest2013, eos penalty $beta: BLEU $bleu"
    if python -c "import sys; sys.exit(0 if float('$bleu') > float('$best_bleu') else 1)"; then best=$beta; best_bleu=$bleu; fi
  done
  fairseq-generate "$work/data-bin" --user-dir "$plugin" --task insertion_translation \
    --path "$work/insertion/checkpoint_last.pt" --gen-subset test --decoding parallel --eos-penalty "$best" \
    --batch-size 128 --remove-bpe --print-step > "$work/test.out"
  # tokenised BLEU as the paper reports it (fairseq's compound-splitting script), and the plot
  bash "$fairseq_src/scripts/compound_split_bleu.sh" "$work/test.out"
  PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" python -m examples.multi30k.recipe plot \
    --generate-output "$work/test.out" --png "$work/iterations.png"
}

if [ $# -eq 0 ]; then set -- prepare teacher distill train evaluate; fi
for step in "$@"; do "$step"; done
