"""Train a model's slot-closure head (:mod:`fairseq_insertion.closure`) with the model frozen; write the model with it.

    python -m examples.train_closure --path CHECKPOINT --data DATA-BIN --out NEW.pt --eos-penalty BETA \\
        [--block-neighbour-copies] [--no-repeat-ngram-size 3] [--sentences 4000] [--post-process subword_nmt]

The model decodes ``--sentences`` source lines of the training split (parallel, at BETA, the repetition rules
given) and every pass's open slots that may close are kept: their states and whether the model closed them. The
head learns that decision (logistic loss, Adam). Its threshold: the valid split decoded without the head, then
with it at each candidate probability, lowest first: the first whose BLEU (the data-bin's references,
``--post-process``'d, tokenised BLEU) is within 0.1 of the plain decode's and whose outputs equal it on at least
97% of sentences. NEW.pt is the checkpoint with the head, decoded with it wherever it is loaded; ``--summary``
writes what was measured as JSON. Exit status 3: no threshold qualified (nothing written but the summary).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from fairseq import checkpoint_utils, tasks
from sacrebleu.metrics import BLEU
from torch import Tensor, nn

from fairseq_insertion import slots as S
from fairseq_insertion.closure import PREFIX, SlotClosure, fingerprint
from fairseq_insertion.config import DecodingConfig
from fairseq_insertion.generator import InsertionGenerator, ModelBackend

logger = logging.getLogger("examples.train_closure")
THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)  # the candidate probabilities, lowest first


class Recorder(nn.Module):
    """Stands in for the closure head while the model decodes the training sources: it closes nothing and keeps
    the open slots' states the pass gave it (the states the head will read)."""

    def __init__(self, eos_penalty: float):
        super().__init__()
        self.register_buffer("threshold", torch.tensor(float("inf")))
        self.register_buffer("eos_penalty", torch.tensor(eos_penalty))
        self.states: Optional[Tensor] = None

    def forward(self, h: Tensor) -> Tensor:
        self.states = h.detach().float()  # (N, C)
        return h.new_full(h.shape[:1], float("-inf")).float()  # (N,) closes nothing


@dataclass(frozen=True)
class RecordingBackend(ModelBackend):
    """The model's backend that also keeps, for every pass, the states of the open slots the head may close (from
    the model's :class:`Recorder`) and whether the slot rule closed them."""

    records: List[Tuple[Tensor, Tensor]] = field(default_factory=list)

    def score_slots(self, cache: Any, framed: Tensor, open_: Tensor, inputs: Any, k: int) -> Any:
        choice = super().score_slots(cache, framed, open_, inputs, k)
        may = S.may_close(inputs, open_, self.closure_beta, k)  # (N,)
        if may is not None:
            self.records.append((self.model.decoder.closure.states[may], choice.tokens[may, 0] == self.eos))
        return choice


class RecordingGenerator(InsertionGenerator):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.records: List[Tuple[Tensor, Tensor]] = []

    def backend(self, model: Any, src_tokens: Tensor, src_lengths: Tensor) -> ModelBackend:
        return RecordingBackend(**{**vars(super().backend(model, src_tokens, src_lengths)), "records": self.records})


def decode(model: Any, generator: InsertionGenerator, dataset: Any, ids: Sequence[int], batch: int = 128
           ) -> Dict[int, List[int]]:
    """The sentences ``ids`` of ``dataset`` decoded, in batches of similar length: id -> output token ids."""
    out: Dict[int, List[int]] = {}
    ids = sorted(ids, key=lambda i: int(dataset.src_sizes[i]))
    with torch.no_grad():
        for at in range(0, len(ids), batch):
            sample = dataset.collater([dataset[i] for i in ids[at:at + batch]])
            for i, hypos in zip(sample["id"].tolist(), generator.generate([model], sample)):
                out[i] = hypos[0]["tokens"][:-1].tolist()
    return out


def train_head(states: Tensor, closes: Tensor, epochs: int = 8, seed: int = 1) -> SlotClosure:
    """A :class:`SlotClosure` fitted to ``closes`` (M,) from ``states`` (M, C): logistic loss, Adam, batches of
    1,024."""
    torch.manual_seed(seed)
    head = SlotClosure(states.shape[1])
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-3)
    target = closes.float()
    for epoch in range(epochs):
        order, total = torch.randperm(len(states)), 0.0
        for at in range(0, len(states), 1024):
            idx = order[at:at + 1024]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(head(states[idx]), target[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
        logger.info(f"epoch {epoch + 1}: loss {total / len(states):.4f}")
    return head.eval()


def bleu(task: Any, found: Dict[int, List[int]], dataset: Any, how: str) -> float:
    tgt = task.target_dictionary
    text = lambda ids: tgt.string(torch.tensor(ids, dtype=torch.long), how)  # noqa: E731  fairseq's post_process
    ids = sorted(found)
    refs = [text(dataset.tgt[i].tolist()[:-1]) for i in ids]
    return BLEU(tokenize="none").corpus_score([text(found[i]) for i in ids], [refs]).score


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.train_closure", description=__doc__.splitlines()[0])
    p.add_argument("--path", required=True, help="an insertion_transformer checkpoint")
    p.add_argument("--data", required=True, help="its data-bin (train and valid splits)")
    p.add_argument("--out", required=True, help="the checkpoint to write, with the head")
    p.add_argument("--eos-penalty", type=float, required=True, help="the beta the model decodes at")
    p.add_argument("--block-neighbour-copies", action="store_true")
    p.add_argument("--no-repeat-ngram-size", type=int, default=0)
    p.add_argument("--sentences", type=int, default=4000, help="training lines decoded (default 4000)")
    p.add_argument("--post-process", default="subword_nmt", help="how valid's pieces become words for BLEU")
    p.add_argument("--threshold", type=float, help="this probability instead of the one chosen on valid")
    p.add_argument("--summary", help="a JSON file for the measurements (the valid sweep, the threshold)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(message)s", stream=sys.stderr)
    state = checkpoint_utils.load_checkpoint_to_cpu(args.path, {"data": args.data})
    task = tasks.setup_task(state["cfg"].task)
    model = task.build_model(state["cfg"].model)
    model.load_state_dict({k: v for k, v in state["model"].items() if not k.startswith(PREFIX)}, strict=True)
    model.decoder.closure = None
    model.eval()
    config = DecodingConfig(eos_penalty=args.eos_penalty, block_neighbour_copies=args.block_neighbour_copies,
                            no_repeat_ngram_size=args.no_repeat_ngram_size)
    for split in ("train", "valid"):
        task.load_dataset(split)
    train = task.dataset("train")
    lines = torch.randperm(len(train), generator=torch.Generator().manual_seed(1))[:args.sentences].tolist()
    recorder = RecordingGenerator(task.target_dictionary, config, src_dict=task.source_dictionary)
    model.decoder.closure = Recorder(args.eos_penalty)
    decode(model, recorder, train, lines)
    states = torch.cat([r[0] for r in recorder.records])  # (M, C)
    closes = torch.cat([r[1] for r in recorder.records])  # (M,)
    logger.info(f"{len(states)} slots of {len(lines)} sentences, {float(closes.float().mean()):.3f} closed")
    summary = {"training_sentences": len(lines), "training_slots": len(states),
               "closed_share": round(float(closes.float().mean()), 4), "sweep": []}
    head = train_head(states, closes)
    head.eos_penalty.fill_(args.eos_penalty)
    head.body.copy_(fingerprint(model.state_dict()))
    valid = task.dataset("valid")
    model.decoder.closure = None
    plain = decode(model, InsertionGenerator(task.target_dictionary, config, src_dict=task.source_dictionary),
                   valid, range(len(valid)))
    base = bleu(task, plain, valid, args.post_process)
    logger.info(f"valid without the head: BLEU {base:.2f}")
    summary["valid_bleu_plain"] = round(base, 2)
    model.decoder.closure = head
    chosen = None
    for probability in THRESHOLDS if args.threshold is None else (args.threshold,):
        head.threshold.fill_(math.log(probability / (1 - probability)))
        generator = InsertionGenerator(task.target_dictionary, config, src_dict=task.source_dictionary)
        found = decode(model, generator, valid, range(len(valid)))
        score, same = bleu(task, found, valid, args.post_process), sum(found[i] == plain[i] for i in plain) / len(plain)
        rows = generator.stats["vocabulary_rows"] / max(generator.stats["tokens"], 1)
        logger.info(f"threshold {probability}: BLEU {score:.2f}, outputs equal {same:.4f}, vocabulary rows per "
                    f"output token {rows:.2f}")
        summary["sweep"].append({"threshold": probability, "valid_bleu": round(score, 2),
                                 "outputs_equal": round(same, 4), "vocabulary_rows_per_token": round(rows, 3)})
        if args.threshold is not None or (score >= base - 0.1 and same >= 0.97):
            chosen = probability
            break
    summary["threshold"] = chosen
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
    if chosen is None:
        logger.error(f"{args.path}: no threshold keeps valid within 0.1 BLEU and 97% of its outputs; no head written")
        return 3
    saved = torch.load(args.path, map_location="cpu", weights_only=True)  # as fairseq saved it (cfg a dict)
    saved["model"] = {**{k: v for k, v in saved["model"].items() if not k.startswith(PREFIX)},
                      **{PREFIX + k: v for k, v in head.state_dict().items()}}
    torch.save(saved, args.out)
    logger.info(f"{args.out}: threshold {chosen}, beta {args.eos_penalty:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
