"""``insertion_loss``: sample a canvas per sentence, score its slots, and take
the paper's weighted slot loss (paper: "Training and Loss Functions")."""


import math
from dataclasses import dataclass, field

import torch
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from . import canvas as C
from . import loop as L
from .decoding import TORCH
from .pass_decoder import OPTION as CACHED_DECODER
from .pass_decoder import TRAJECTORIES, framed_levels


@dataclass
class InsertionLossConfig(FairseqDataclass):
    order: ChoiceEnum(list(C.ORDERS)) = field(default="binary_tree", metadata={  # type: ignore[valid-type]
        "help": "generation order the loss teaches (paper: Left-to-Right, Balanced Binary Tree, Uniform)"})
    tau: float = field(default=1.0, metadata={"help": "binary tree temperature: weights softmax(-d_l(i)/tau) over "
                                                      "each span"})
    termination: ChoiceEnum(list(C.TERMINATIONS)) = field(default="slot", metadata={  # type: ignore[valid-type]
        "help": "slot: empty spans target end-of-slot; sequence: empty spans are excluded and a complete canvas "
        "targets end-of-sequence (paper: Termination)"})
    label_smoothing: float = field(default=0.0, metadata={"help": "mix this much of a uniform content distribution "
                                                                  "into each slot's target"})
    tree_canvas_prob: float = field(default=0.0, metadata={
        "help": "with this probability a sentence's canvas is a state parallel decoding visits (the balanced-binary-"
        "tree canvas after a uniformly drawn number of iterations) instead of a uniformly random subset; binary_tree "
        "and uniform orders"})
    trajectory: ChoiceEnum(list(TRAJECTORIES)) = field(default="balanced", metadata={  # type: ignore[valid-type]
        "help": "with --cached-decoder, the insertion order its one pass over each target follows: balanced (each "
        "span's centre) or sampled (each span's token drawn from its binary-tree weights at --tau)"})
    canvases_per_sentence: int = field(default=1, metadata={
        "help": "sample K independent canvases per sentence, sharing one encoder pass; a sentence's loss is the mean "
        "over its K canvases"})


@register_criterion("insertion_loss", dataclass=InsertionLossConfig)
class InsertionLoss(FairseqCriterion):
    def __init__(self, task, order="binary_tree", tau=1.0, termination="slot", label_smoothing=0.0,
                 canvases_per_sentence=1, tree_canvas_prob=0.0, trajectory="balanced"):
        super().__init__(task)
        self.trajectory = str(trajectory)
        if not 0.0 <= tree_canvas_prob <= 1.0:
            raise ValueError(f"--tree-canvas-prob must be in [0, 1], got {tree_canvas_prob}")
        if tree_canvas_prob > 0 and order == "left_to_right":
            raise ValueError("--tree-canvas-prob needs --order binary_tree or uniform (left_to_right canvases are "
                             "prefixes)")
        self.tree_canvas_prob = float(tree_canvas_prob)
        if not (isinstance(canvases_per_sentence, int) and canvases_per_sentence >= 1):
            raise ValueError(f"--canvases-per-sentence must be an integer >= 1, got {canvases_per_sentence!r}")
        self.canvases_per_sentence = canvases_per_sentence
        if order == "binary_tree" and not tau > 0:
            raise ValueError(f"--tau must be > 0 for --order binary_tree, got {tau}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"--label-smoothing must be in [0, 1), got {label_smoothing}")
        self.order, self.tau = str(order), float(tau)
        self.termination, self.eps = str(termination), float(label_smoothing)
        d = task.target_dictionary
        self.bos, self.eos, self.pad = d.bos(), d.eos(), d.pad()

    def forward(self, model, sample, reduce: bool = True):
        target = sample["target"]  # (B, N+1): tokens, eos, padding
        lengths = target.ne(self.pad).sum(1) - target.eq(self.eos).any(1).long()  # (B,) n without eos
        N = target.size(1)
        real = torch.arange(N, device=target.device).unsqueeze(0) < lengths.unsqueeze(1)
        y = target.masked_fill(~real, self.pad)  # (B, N) eos removed
        B, R = target.size(0), self.canvases_per_sentence
        if R > 1:  # R canvases per sentence: canvas j of sentence b is row j B + b
            y, lengths = y.repeat(R, 1), lengths.repeat(R)  # (R B, N), (R B,)

        keep = C.sample_canvas(lengths, N, self.order)  # (R B, N)
        if self.tree_canvas_prob > 0:  # some canvases are states parallel decoding visits
            tree = torch.rand(keep.size(0), device=keep.device) < self.tree_canvas_prob  # (R B,)
            keep = torch.where(tree.unsqueeze(1), C.sample_tree_canvas(lengths, N), keep)
        canvas, k = L.gather_canvas(TORCH, y, keep, self.pad)  # (R B, K), (R B,)
        framed = L.frame(TORCH, canvas, k, self.bos, self.eos, self.pad)  # (R B, K+2)

        src_tokens, src_lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
        if getattr(model.decoder, "fractional", None) is not None:
            loss, nll, fill = self._trajectory(model, src_tokens, src_lengths, y, lengths)
        else:
            net_output = model(src_tokens, src_lengths, framed, canvases_per_sentence=R)  # one encoder pass, R canvases
            content_lp, location_lp = model.slot_log_probs(net_output, framed)  # (R B, K+1, V), (R B, K+1)
            loss, nll = C.insertion_loss(content_lp, location_lp, y, lengths, keep, self.order, self.termination,
                                         self.eos, self.tau, self.eps)  # (R B,) each
            fill = torch.where(lengths > 0, k.float() / lengths.clamp(min=1).float(),
                               torch.ones_like(k, dtype=torch.float))
            if R > 1:  # a sentence's loss is the mean over its R canvases: (R B,) -> (B,)
                loss, nll, fill = (x.view(R, B).mean(0) for x in (loss, nll, fill))
        logging_output = {"loss": loss.sum().data, "nll_loss": nll.sum().data, "fill": fill.sum().data,
                          "ntokens": sample["ntokens"], "nsentences": B, "sample_size": B}
        return (loss.sum() if reduce else loss), B, logging_output

    def _trajectory(self, model, src_tokens, src_lengths, y, lengths):
        """The cached decoder's loss (:mod:`fairseq_insertion.pass_decoder`): every pass of each target's balanced-tree
        decode in one decoder pass; (B,) each sentence's loss, nll and fill, the means over its passes."""
        if self.order == "left_to_right" or self.tree_canvas_prob > 0 or self.canvases_per_sentence > 1:
            raise ValueError(f"{CACHED_DECODER} trains on every pass of the balanced-tree order at once: train with "
                             "--order binary_tree or uniform, without --tree-canvas-prob and --canvases-per-sentence")
        B, N = y.shape
        framed = L.frame(TORCH, y, lengths, self.bos, self.eos, self.pad)  # (B, N+2)
        levels = framed_levels(lengths, N, self.trajectory, self.tau)  # (B, N+2)
        out = model(src_tokens, src_lengths, framed, levels=levels, target_lengths=lengths)
        slots = out.slots  # R rows: each one pass's canvas of one sentence
        location = out.location.float().masked_fill(~slots.real, float("-inf")).log_softmax(-1)  # (R, S)
        content = out.content.float().log_softmax(-1)  # (M, V)
        target, n = y[slots.sentence], lengths[slots.sentence]  # (R, N), (R,)
        rows, rows_nll = C.flat_insertion_loss(content, slots.real, location, target, n, slots.keep, self.order,
                                               self.termination, self.eos, self.tau, self.eps)  # (R,) each
        k = slots.keep.sum(1).float()  # (R,)
        fill = torch.where(n > 0, k / n.clamp(min=1).float(), torch.ones_like(k))
        passes = lengths.new_zeros(B).scatter_add_(0, slots.sentence, torch.ones_like(slots.sentence)).float()

        def mean(x):  # (R,) -> (B,) each sentence's mean over its passes
            return x.new_zeros(B).scatter_add_(0, slots.sentence, x) / passes

        return mean(rows), mean(rows_nll), mean(fill)

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        sample_size, nsentences = total("sample_size"), total("nsentences")
        metrics.log_scalar("loss", total("loss") / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", total("nll_loss") / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_scalar("fill", total("fill") / max(nsentences, 1), nsentences, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
