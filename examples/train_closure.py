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

Then the look-ahead closure (:class:`~fairseq_insertion.closure.LookAhead`; ``--no-lookahead``: not made): the same
training lines decoded again with the closure head, every pass's open slots kept with what the pass computed of
them (state, token, scores) and whether the model's next pass closed the slots each one leaves (the two beside an
inserted token, an end-of-slot slot itself); the same logistic loss on those decisions, and its threshold chosen on
valid by the same rule, against the decode without either head. Where none qualifies, NEW.pt has the closure head
alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
from fairseq import checkpoint_utils, tasks
from sacrebleu.metrics import BLEU
from torch import Tensor, nn

from fairseq_insertion import slots as S
from fairseq_insertion.closure import LOOKAHEAD, PREFIX, LookAhead, SlotClosure, fingerprint
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

    def score_slots(self, cache: Any, framed: Tensor, open_: Tensor, inputs: Any, k: int,
                    fresh: Optional[Tensor] = None) -> Any:
        choice = super().score_slots(cache, framed, open_, inputs, k, fresh)
        may = S.may_close(inputs, open_, self.closure_beta, k)  # (N,)
        if may is not None:
            self.records.append((self.model.decoder.closure.states[may], choice.tokens[may, 0] == self.eos))
        return choice


class RecordingGenerator(InsertionGenerator):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.records: List[Any] = []

    def backend(self, model: Any, src_tokens: Tensor, src_lengths: Tensor) -> ModelBackend:
        kind = LookAheadBackend if isinstance(model.decoder.lookahead, LookAheadRecorder) else RecordingBackend
        batch: List[Any] = []  # this batch's passes
        if kind is LookAheadBackend:
            self.records.append(batch)
        return kind(**{**vars(super().backend(model, src_tokens, src_lengths)),
                       "records": batch if kind is LookAheadBackend else self.records})


class LookAheadRecorder(nn.Module):
    """Stands in for the look-ahead closure while the model decodes the training sources: it ends nothing and keeps
    what the pass gave it of the open slots (the inputs the look-ahead will read)."""

    def __init__(self, eos_penalty: float):
        super().__init__()
        self.register_buffer("threshold", torch.tensor(float("inf")))
        self.register_buffer("eos_penalty", torch.tensor(eos_penalty))
        self.inputs: Tuple[Tensor, ...] = ()

    def forward(self, h: Tensor, w: Tensor, log_probs: Tensor, eos_log_probs: Tensor) -> Tensor:
        self.inputs = (h.detach().float(), w, log_probs.float(), eos_log_probs.float())
        return h.new_full((len(h), 3), float("-inf")).float()  # (N, 3) ends nothing


class Pass(NamedTuple):
    """One recorded pass: the batch row of each canvas, its open slots and what the pass computed of them."""

    ids: Tensor  # (A,) each canvas's row in the batch
    open_: Tensor  # (A, S)
    may: Tensor  # (N,) the open slots the look-ahead may end
    inputs: Tuple[Tensor, ...]  # the LookAheadRecorder's (N, C), (N,), (N,), (N,)


@dataclass(frozen=True)
class LookAheadBackend(ModelBackend):
    """The model's backend that keeps every pass's open slots (from the model's :class:`LookAheadRecorder`) and
    follows each canvas's batch row as sentences finish (:meth:`reorder`)."""

    records: List[Pass] = field(default_factory=list)
    ids: List[Tensor] = field(default_factory=list)  # the canvases' batch rows after each reorder

    def score_slots(self, cache: Any, framed: Tensor, open_: Tensor, inputs: Any, k: int,
                    fresh: Optional[Tensor] = None) -> Any:
        choice = super().score_slots(cache, framed, open_, inputs, k, fresh)
        may = S.may_close(inputs, open_, self.lookahead_beta, k)  # (N,)
        if may is not None:
            self.records.append(Pass(self.rows(), open_.cpu(), may.cpu(), self.model.decoder.lookahead.inputs))
        return choice

    def reorder(self, cache: Any, keep: Tensor) -> Any:
        self.ids.append(self.rows()[keep.cpu()])
        return super().reorder(cache, keep)

    def rows(self) -> Tensor:
        return self.ids[-1] if self.ids else torch.arange(len(self.src_tokens))


def lookahead_examples(passes: Sequence[Pass], eos: int) -> Tuple[Tuple[Tensor, ...], Tensor, Tensor]:
    """From one batch's recorded passes: the inputs of every open slot the look-ahead may end in a pass that another
    pass followed, (M, 3) whether that next pass closed the slot before its token, the slot after it and (where
    its token is end-of-slot) the slot itself, and (M, 3) which of the three apply."""
    inputs: List[Tuple[Tensor, ...]] = []
    labels, applies = [], []
    for now, then in zip(passes, passes[1:]):
        where = {int(i): r for r, i in enumerate(then.ids)}  # batch row -> its canvas in the next pass
        slot_row = now.open_.nonzero()[:, 0]  # (N,) each open slot's canvas
        slot_col = now.open_.nonzero()[:, 1]
        w = now.inputs[1].cpu()
        # the next pass's decisions: a slot closes where it is not open or its token is end-of-slot
        next_tokens = torch.full(then.open_.shape, eos, dtype=torch.long).masked_scatter(then.open_,
                                                                                         then.inputs[1].cpu())
        for r, i in enumerate(now.ids.tolist()):
            if i not in where:  # the sentence ended after this pass
                continue
            mine = slot_row == r
            ins = torch.zeros(now.open_.shape[1], dtype=torch.long)
            ins[slot_col[mine]] = (w[mine] != eos).long()
            if int(now.open_[r].sum() + ins.sum()) != int(then.open_[where[i]].sum()):
                continue  # not every token inserted (a cap), or closed slots: left out
            base = torch.arange(len(ins)) + ins.cumsum(0) - ins  # (S,) each slot's first slot in the next pass
            closes = next_tokens[where[i]] == eos  # (S',)
            col = slot_col[mine]
            b = base[col]
            inserted = ins[col].bool()
            left, right = closes[b], closes[(b + 1).clamp(max=len(closes) - 1)]
            labels.append(torch.stack([left, right, left], 1))
            applies.append(torch.stack([inserted, inserted, ~inserted], 1) & now.may[mine][:, None])
            inputs.append(tuple(x[mine] for x in now.inputs))
    if not inputs:
        return (), torch.zeros(0, 3, dtype=torch.bool), torch.zeros(0, 3, dtype=torch.bool)
    return tuple(torch.cat(x) for x in zip(*inputs)), torch.cat(labels), torch.cat(applies)


def train_lookahead(inputs: Sequence[Tensor], labels: Tensor, applies: Tensor, vocab: int, epochs: int = 8,
                    seed: int = 1) -> LookAhead:
    """A :class:`LookAhead` fitted to ``labels`` (M, 3) where ``applies`` (M, 3): logistic loss, Adam, batches of
    1,024, ``epochs`` or 500 updates if more; each column's bias starting at its share of closings."""
    torch.manual_seed(seed)
    head = LookAhead(inputs[0].shape[1], vocab)
    target, weight = labels.float(), applies.float()
    with torch.no_grad():
        share = ((target * weight).sum(0) + 1) / (weight.sum(0) + 2)  # (3,) smoothed
        head.out.bias.copy_((share / (1 - share)).log())
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-3)
    epochs = max(epochs, math.ceil(500 / math.ceil(len(target) / 1024)))
    for epoch in range(epochs):
        order, total = torch.randperm(len(target)), 0.0
        for at in range(0, len(target), 1024):
            idx = order[at:at + 1024]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                head(*(x[idx] for x in inputs)), target[idx], weight[idx], reduction="sum")
            loss = loss / weight[idx].sum().clamp(min=1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
        if (epoch + 1) % math.ceil(epochs / 8) == 0:
            logger.info(f"look-ahead epoch {epoch + 1}: loss {total / len(target):.4f}")
    return head.eval()


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
    p.add_argument("--no-lookahead", action="store_true", help="the closure head alone, no look-ahead closure")
    p.add_argument("--lookahead-threshold", type=float,
                   help="this probability for the look-ahead instead of the one chosen on valid")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(message)s", stream=sys.stderr)
    state = checkpoint_utils.load_checkpoint_to_cpu(args.path, {"data": args.data})
    task = tasks.setup_task(state["cfg"].task)
    model = task.build_model(state["cfg"].model, from_checkpoint=True)
    model.load_state_dict({k: v for k, v in state["model"].items() if not k.startswith((PREFIX, LOOKAHEAD))},
                          strict=True)
    model.decoder.closure = model.decoder.lookahead = None
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
    generator = InsertionGenerator(task.target_dictionary, config, src_dict=task.source_dictionary)
    plain = decode(model, generator, valid, range(len(valid)))
    base = bleu(task, plain, valid, args.post_process)
    logger.info(f"valid without the head: BLEU {base:.2f}")
    summary.update(valid_bleu_plain=round(base, 2), valid_plain=work(generator.stats))
    model.decoder.closure = head
    thresholds = THRESHOLDS if args.threshold is None else (args.threshold,)
    summary["sweep"], chosen = sweep(model, head, task, config, valid, plain, base, thresholds, args)
    summary["threshold"] = chosen
    heads = {PREFIX: head}
    if chosen is not None and not args.no_lookahead:
        head.threshold.fill_(logit(chosen))
        ahead, summary["lookahead"] = lookahead(model, task, config, train, lines, valid, plain, base, args)
        if ahead is not None:
            heads[LOOKAHEAD] = ahead
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
    if chosen is None:
        logger.error(f"{args.path}: no threshold keeps valid within 0.1 BLEU and 97% of its outputs; no head written")
        return 3
    head.threshold.fill_(logit(chosen))
    saved = torch.load(args.path, map_location="cpu", weights_only=True)  # as fairseq saved it (cfg a dict)
    saved["model"] = {k: v for k, v in saved["model"].items() if not k.startswith((PREFIX, LOOKAHEAD))}
    for prefix, module in heads.items():
        saved["model"].update({prefix + k: v for k, v in module.state_dict().items()})
    torch.save(saved, args.out)
    logger.info(f"{args.out}: threshold {chosen}, beta {args.eos_penalty:g}"
                + (f", look-ahead threshold {summary['lookahead']['threshold']}" if LOOKAHEAD in heads else ""))
    return 0


def logit(probability: float) -> float:
    return math.log(probability / (1 - probability))


def work(stats: Dict[str, int]) -> Dict[str, float]:
    """A decode's passes: a sentence's, those that inserted nothing, and decoder positions an output token."""
    n, tokens = max(stats["sentences"], 1), max(stats["tokens"], 1)
    return {"passes_per_sentence": round(stats["sentence_passes"] / n, 3),
            "idle_passes_per_sentence": round((stats["sentence_passes"] - stats["iterations"]) / n, 3),
            "positions_per_token": round(stats["positions"] / tokens, 3),
            "vocabulary_rows_per_token": round(stats["vocabulary_rows"] / tokens, 3)}


def sweep(model: Any, head: nn.Module, task: Any, config: DecodingConfig, valid: Any, plain: Dict[int, List[int]],
          base: float, thresholds: Sequence[float], args: argparse.Namespace) -> Tuple[List[dict], Optional[float]]:
    """Valid decoded with ``head`` at each threshold, lowest first, until one keeps BLEU within 0.1 of ``base`` and
    97% of the outputs ``plain`` (or the one given): the sweep and that threshold (None: none did)."""
    rows = []
    for probability in thresholds:
        head.threshold.fill_(logit(probability))
        generator = InsertionGenerator(task.target_dictionary, config, src_dict=task.source_dictionary)
        found = decode(model, generator, valid, range(len(valid)))
        score, same = bleu(task, found, valid, args.post_process), sum(found[i] == plain[i] for i in plain) / len(plain)
        rows.append({"threshold": probability, "valid_bleu": round(score, 2), "outputs_equal": round(same, 4),
                     **work(generator.stats)})
        logger.info(f"{type(head).__name__} threshold {probability}: " + ", ".join(f"{k} {v}" for k, v in
                                                                                  list(rows[-1].items())[1:]))
        if args.threshold is not None or (score >= base - 0.1 and same >= 0.97):
            return rows, probability
    return rows, None


def lookahead(model: Any, task: Any, config: DecodingConfig, train: Any, lines: Sequence[int], valid: Any,
              plain: Dict[int, List[int]], base: float, args: argparse.Namespace) -> Tuple[Optional[LookAhead], dict]:
    """The look-ahead closure for the model with its closure head: trained on the training ``lines`` decoded again,
    its threshold chosen on valid (:func:`sweep`); None where none qualifies."""
    model.decoder.lookahead = LookAheadRecorder(args.eos_penalty)
    recorder = RecordingGenerator(task.target_dictionary, config, src_dict=task.source_dictionary)
    decode(model, recorder, train, lines)
    found = [lookahead_examples(batch, task.target_dictionary.eos()) for batch in recorder.records]
    inputs = tuple(torch.cat(x) for x in zip(*(f[0] for f in found if f[0])))
    labels, applies = torch.cat([f[1] for f in found]), torch.cat([f[2] for f in found])
    closed = float(labels[applies].float().mean())
    logger.info(f"look-ahead: {len(labels)} slots, {int(applies.sum())} decisions, {closed:.3f} closed")
    ahead = train_lookahead(inputs, labels, applies, len(task.target_dictionary))
    ahead.eos_penalty.fill_(args.eos_penalty)
    ahead.body.copy_(fingerprint(model.state_dict()))
    model.decoder.lookahead = ahead
    given = args.lookahead_threshold
    rows, chosen = sweep(model, ahead, task, config, valid, plain, base, THRESHOLDS if given is None else (given,),
                         argparse.Namespace(threshold=given, post_process=args.post_process))
    model.decoder.lookahead = None
    summary = {"training_slots": len(labels), "decisions": int(applies.sum()), "closed_share": round(closed, 4),
               "sweep": rows, "threshold": chosen}
    if chosen is None:
        logger.warning(f"{args.path}: no look-ahead threshold keeps valid within 0.1 BLEU and 97% of its outputs; "
                       "the checkpoint has the closure head alone")
        return None, summary
    ahead.threshold.fill_(logit(chosen))
    return ahead, summary


if __name__ == "__main__":
    sys.exit(main())
