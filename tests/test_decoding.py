"""Decoding rules on hand-built scores: a stand-in model whose slot scores force
a known target, so the generator's insertion, stopping and counting rules can be
checked exactly."""

import argparse
import math

import pytest
import torch
from fairseq.data import Dictionary

from fairseq_insertion.canvas import log2_bound
from fairseq_insertion.generator import InsertionGenerator
from fairseq_insertion.model import SlotPass

V_WORDS = 40


def make_dict() -> Dictionary:
    d = Dictionary()
    for i in range(V_WORDS):
        d.add_symbol(f"t{i}")
    return d


class _Encoder:
    def __call__(self, src_tokens, src_lengths=None):
        return {"ids": torch.arange(src_tokens.size(0))}

    def reorder_encoder_out(self, encoder_out, new_order):
        return {"ids": encoder_out["ids"][new_order]}


class OracleModel:
    """Forces ``targets[b]`` (distinct tokens per sentence).

    In every slot the highest content score goes to the centre token of the
    slot's missing span (left centre for even spans, so parallel decoding
    follows a balanced binary tree), or to end-of-slot when the span is empty.
    ``eos_bonus`` raises the end-of-slot score in non-empty slots;
    ``never_stop`` puts the best score on a fixed token in every slot.
    """

    def __init__(self, d: Dictionary, targets, termination="slot", eos_bonus=0.0, never_stop=False, max_pos=1024):
        self.d, self.targets = d, targets
        self.termination, self.eos_bonus, self.never_stop, self.max_pos = termination, eos_bonus, never_stop, max_pos
        self.encoder = _Encoder()
        self.decoder = self._decode

    training = False

    def eval(self):
        return self

    def max_decoder_positions(self):
        return self.max_pos

    def _decode(self, framed, encoder_out=None):
        B, L = framed.shape
        V = len(self.d)
        content = torch.zeros(B, L - 1, V)
        for r, b in enumerate(encoder_out["ids"].tolist()):
            y = self.targets[b]
            canvas = [t for t in framed[r, 1:].tolist() if t not in (self.d.pad(), self.d.eos())]
            if self.never_stop:
                content[r, : len(canvas) + 1, self.d.index("t7")] = 10.0
                continue
            kept = [y.index(t) for t in canvas]  # tokens are distinct
            bounds = [-1] + kept + [len(y)]
            for slot in range(len(canvas) + 1):
                i, j = bounds[slot] + 1, bounds[slot + 1] - 1
                if i > j:
                    if self.termination == "slot" or len(canvas) == len(y):
                        content[r, slot, self.d.eos()] = 10.0
                else:
                    content[r, slot, y[(i + j) // 2]] = 10.0
                    content[r, slot, self.d.eos()] = 10.0 + self.eos_bonus if self.eos_bonus else 0.0
        return content, torch.zeros(B, L - 1)

    def slot_log_probs(self, net_output, framed):
        content, location = net_output
        real = framed[:, 1:].ne(self.d.pad())
        return content.log_softmax(-1), location.masked_fill(~real, float("-inf")).log_softmax(-1)

    # the decoding interface of InsertionTransformerModel (the encoder output stands in for its cache)
    def decoding_cache(self, encoder_out):
        return encoder_out

    def reorder_decoding_cache(self, cache, order):
        return self.encoder.reorder_encoder_out(cache, order)

    def decode_slots(self, framed, cache, select, may_close=None, fresh=None):
        content, location = self.slot_log_probs(self.decoder(framed, encoder_out=cache), framed)
        return SlotPass(content[select], location)


def batch_for(d, targets):
    B = len(targets)
    src = torch.full((B, 3), d.index("t0"))
    return {"net_input": {"src_tokens": src, "src_lengths": torch.full((B,), 3)}}


def random_targets(d, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    words = torch.arange(d.nspecial, len(d))
    return [words[torch.randperm(len(words), generator=g)[:n]].tolist() for n in lengths]


def decode(model, d, targets, **kwargs):
    """The oracle's targets are longer than any source-tied limit: none unless asked for."""
    gen = InsertionGenerator(d, **{"max_len_a": 0, "max_len_b": 200, **kwargs})
    return gen, gen.generate([model], batch_for(d, targets))


def test_parallel_binary_tree_takes_floor_log2_n_plus_1_iterations():
    d = make_dict()
    lengths = list(range(0, 21)) + [31, 32, 33]
    targets = random_targets(d, lengths)
    gen, hypos = decode(OracleModel(d, targets), d, targets, decoding="parallel")
    for y, [h] in zip(targets, hypos):
        assert h["tokens"].tolist() == y + [d.eos()]
        assert h["steps"] == log2_bound(len(y)) == (math.floor(math.log2(len(y))) + 1 if y else 0)
        assert h["positional_scores"].shape == (len(y) + 1,)
        assert math.isclose(float(h["score"]), float(h["positional_scores"].mean()), rel_tol=1e-6)
    assert gen.stats["sentences"] == len(targets)
    assert gen.stats["iterations"] == gen.stats["log2_bound"]


@pytest.mark.parametrize("termination", ["slot", "sequence"])
def test_greedy_inserts_one_token_per_iteration(termination):
    d = make_dict()
    targets = random_targets(d, [0, 1, 2, 5, 9, 13], seed=1)
    _, hypos = decode(OracleModel(d, targets, termination=termination), d, targets, decoding="greedy")
    for y, [h] in zip(targets, hypos):
        assert h["tokens"].tolist() == y + [d.eos()]
        assert h["steps"] == len(y)


def test_history_records_each_iteration():
    d = make_dict()
    targets = random_targets(d, [7], seed=2)
    _, [[h]] = decode(OracleModel(d, targets), d, targets, decoding="parallel", retain_history=True)
    sizes = [len(e["tokens"]) - 1 for e in h["history"]]
    assert sizes == [1, 3, 7]  # [] -> [D] -> [B, D, F] -> [A .. G], the paper's example


def test_eos_penalty_overrides_premature_end_of_slot():
    d = make_dict()
    targets = random_targets(d, [6, 11], seed=3)
    model = OracleModel(d, targets, eos_bonus=1.5)  # end-of-slot beats the right token by 1.5 nats
    _, hypos = decode(model, d, targets, decoding="parallel")
    assert all(h["tokens"].tolist() == [d.eos()] for [h] in hypos)
    for decoding in ("parallel", "greedy"):
        _, hypos = decode(model, d, targets, decoding=decoding, eos_penalty=2.0)
        assert [h["tokens"].tolist()[:-1] for [h] in hypos] == targets


@pytest.mark.parametrize("decoding", ["parallel", "greedy"])
def test_decoding_is_bounded_when_the_model_never_stops(decoding):
    d = make_dict()
    targets = [[5], [6, 7]]
    model = OracleModel(d, targets, never_stop=True, max_pos=12)  # t7 everywhere: allowed to copy it
    _, hypos = decode(model, d, targets, decoding=decoding, max_len_b=200)
    for [h] in hypos:
        assert len(h["tokens"]) - 1 == 10  # max target positions minus the two boundary markers
    _, hypos = decode(model, d, targets, decoding=decoding, max_len_b=7)
    assert all(len(h["tokens"]) - 1 == 7 for [h] in hypos)
    _, hypos = decode(model, d, targets, decoding=decoding, max_len_b=200, max_iterations=2)
    assert all(h["steps"] == 2 for [h] in hypos)


def test_special_tokens_are_never_inserted():
    d = make_dict()
    targets = random_targets(d, [4], seed=4)

    class Hostile(OracleModel):
        def _decode(self, framed, encoder_out=None):
            content, location = super()._decode(framed, encoder_out)
            content[..., d.bos()] = 50.0
            content[..., d.pad()] = 50.0
            return content, location

    _, [[h]] = decode(Hostile(d, targets), d, targets, decoding="parallel")
    assert h["tokens"].tolist() == targets[0] + [d.eos()]


def test_bad_options_are_named():
    d = make_dict()
    with pytest.raises(ValueError, match="decoding"):
        InsertionGenerator(d, decoding="beam")
    with pytest.raises(ValueError, match="max-iterations"):
        InsertionGenerator(d, max_iterations=-1)


def test_summary_counts_the_log2_bound_exactly():
    from types import SimpleNamespace

    from fairseq_insertion import loop as L

    lengths = torch.tensor([0, 1, 2, 3, 4, 7, 8, 1023, 1024])
    stats = L.new_stats()
    canvases = SimpleNamespace(lengths=lengths, iterations=torch.zeros_like(lengths))
    L.tally(stats, L.Decoded(canvases, None, None, None, torch.zeros(9, 1, dtype=torch.long), 1))
    assert stats["log2_bound"] == sum(log2_bound(int(n)) for n in lengths) == 0 + 1 + 2 + 2 + 3 + 3 + 4 + 10 + 11
    assert (stats["sentences"], stats["tokens"], stats["passes"]) == (9, int(lengths.sum()), 1)


def test_fairseq_default_length_limit_is_tied_to_the_source():
    from fairseq_insertion.config import DecodingConfig

    def limit(a, b):
        c = DecodingConfig.from_options(argparse.Namespace(), argparse.Namespace(max_len_a=a, max_len_b=b))
        return c.max_len_a, c.max_len_b

    assert limit(0, 200) == (2.0, 10)  # fairseq's defaults: 2 x source + 10 instead
    assert limit(0.0, 150) == (0.0, 150) and limit(1.2, 10) == (1.2, 10)
