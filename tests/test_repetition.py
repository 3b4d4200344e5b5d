"""The repetition rules of insertion decoding: loop.repeated_tokens against a
brute-force reading of its definition, and the generator never inserting a
neighbour's token (nor, with --no-repeat-ngram-size, repeating an n-gram), in
plain and constrained decoding."""

import random

import numpy as np
import pytest
import torch
from fairseq.token_generation_constraints import pack_constraints

from fairseq_insertion import loop as L
from fairseq_insertion.decoding import TORCH
from fairseq_insertion.generator import InsertionGenerator
from fairseq_insertion.loop import bans
from tests.test_decoding import OracleModel, batch_for, make_dict, random_targets

BOS, PAD, EOS = 0, 1, 2
WORDS = [4, 5, 6]  # a small vocabulary: plenty of repeats


def brute_force(framed_row, n, neighbours, words=WORDS):
    """Per slot, the set of tokens the rules block, from their definition: after inserting c into slot l,
    an n-gram holding c equals an n-gram not holding c (those are the ones that survive from the canvas)."""
    seq = [t for t in framed_row if t != PAD]
    out = []
    for slot in range(len(seq) - 1):
        blocked = set()
        for c in words:
            if neighbours and c in (seq[slot], seq[slot + 1]):
                blocked.add(c)
            if n >= 2:
                new = seq[:slot + 1] + [c] + seq[slot + 1:]
                pos = slot + 1
                grams = [(tuple(new[j:j + n]), j <= pos < j + n) for j in range(len(new) - n + 1)]
                if {g for g, has in grams if has} & {g for g, has in grams if not has}:
                    blocked.add(c)
        out.append(blocked)
    return out


@pytest.mark.parametrize("n,neighbours", [(0, True), (2, False), (3, False), (4, True), (3, True)])
def test_repeated_tokens_match_the_definition(n, neighbours):
    rng = random.Random(n * 10 + neighbours)
    for _ in range(30):
        B = 4
        lengths = [rng.randint(0, 9) for _ in range(B)]
        K = max(lengths)
        framed = torch.full((B, K + 2), PAD)
        for b, k in enumerate(lengths):
            framed[b, :k + 2] = torch.tensor([BOS] + [rng.choice(WORDS) for _ in range(k)] + [EOS])
        got = bans.repeated_tokens(TORCH, framed, n, neighbours, (BOS, EOS), PAD)  # (B, S, M)
        assert got.shape[:2] == (B, K + 1)
        for b, k in enumerate(lengths):
            want = brute_force(framed[b].tolist(), n, neighbours)
            have = [set(got[b, slot].tolist()) - {PAD} for slot in range(k + 1)]
            assert have == want, (framed[b].tolist(), n)
        assert not got.eq(EOS).any() and not got.eq(BOS).any()


@pytest.mark.parametrize("n,neighbours", [(2, False), (3, True), (4, False)])
@pytest.mark.parametrize("xp,wrap", [(L.NUMPY, np.asarray), (TORCH, torch.tensor)], ids=["numpy", "torch"])
def test_canvases_that_repeat_no_token_or_one(n, neighbours, xp, wrap):
    """Rows of distinct tokens (the n-gram rule blocks nothing: numpy skips it) beside rows that repeat one token or
    an (n-1)-gram, in the same batch and alone: the definition's sets, and the same array on both backends."""
    rng = random.Random(n)
    words = list(range(4, 30))
    for trial in range(40):
        B = 3
        lengths = [rng.randint(1, 12) for _ in range(B)]
        rows = []
        for k in lengths:
            row = rng.sample(words, k)
            if trial % 4 == 1 and k > 1:  # one token twice
                row[rng.randrange(1, k)] = row[0]
            if trial % 4 == 3 and k >= 2 * n - 1:  # the first n - 1 tokens again at the end
                row[k - n + 1:] = row[:n - 1]
            rows.append(row)
        K = max(lengths)
        framed = np.full((B, K + 2), PAD)
        for b, row in enumerate(rows):
            framed[b, :len(row) + 2] = [BOS, *row, EOS]
        for batch in (framed, framed[:1]):
            got = np.asarray(bans.repeated_tokens(xp, wrap(batch), n, neighbours, (BOS, EOS), PAD))  # (B, S, M)
            M = (2 if neighbours else 0) + n * (batch.shape[1] - n + 1)
            assert got.shape == (len(batch), batch.shape[1] - 1, M)
            assert np.array_equal(got, bans.repeated_tokens(TORCH, torch.tensor(batch), n, neighbours, (BOS, EOS),
                                                         PAD).numpy())
            for b in range(len(batch)):
                want = brute_force(batch[b].tolist(), n, neighbours, words)
                have = [set(got[b, slot].tolist()) - {PAD} for slot in range(len(want))]
                assert have == want, (batch[b].tolist(), n)
        if trial % 2 == 0:  # no row repeats a token: the n-gram rule blocks nothing
            assert not L.NUMPY.might(bans.repeats_a_token(L.NUMPY, framed, PAD))


def test_no_rule_blocks_nothing():
    framed = torch.tensor([[BOS, 4, 4, EOS]])
    assert bans.repeated_tokens(TORCH, framed, 0, False, (BOS, EOS), PAD).shape == (1, 3, 0)


def _neighbour_copies(tokens):
    return sum(a == b for a, b in zip(tokens, tokens[1:]))


@pytest.mark.parametrize("decoding", ["parallel", "greedy"])
def test_a_model_that_always_wants_one_token_inserts_it_once(decoding):
    """Every slot's best token is t7: unblocked, the canvas fills with t7 up to the length limit; with the
    neighbour rule, t7 goes in once and every later slot ends (end-of-slot beats the other tokens)."""
    d = make_dict()
    targets = random_targets(d, [5, 9], seed=2)
    t7 = d.index("t7")
    free = InsertionGenerator(d, decoding=decoding, max_len_a=0, max_len_b=12).generate(  # the default: no rule
        [OracleModel(d, targets, never_stop=True)], batch_for(d, targets))
    ruled = InsertionGenerator(d, decoding=decoding, block_neighbour_copies=True, max_len_a=0, max_len_b=12).generate(
        [OracleModel(d, targets, never_stop=True)], batch_for(d, targets))
    for [f], [r] in zip(free, ruled):
        assert f["tokens"][:-1].tolist() == [t7] * 12
        assert r["tokens"].tolist() == [t7, d.eos()]


class _Repeater(OracleModel):
    """Forces its target, except that every slot next to a token x also likes x (and the token two to its
    right) a little more than the target: without the rules, neighbours get copied and bigrams repeated."""

    def _decode(self, framed, encoder_out=None):
        content, location = super()._decode(framed, encoder_out)
        for r in range(framed.size(0)):
            row = framed[r].tolist()
            for slot in range(len(row) - 1):
                for t in (row[slot], row[slot + 1]) + tuple(row[slot + 2:slot + 3]):
                    if t not in (self.d.bos(), self.d.eos(), self.d.pad()):
                        content[r, slot, t] = 11.0
        return content, location


def _ngrams(tokens, n):
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


@pytest.mark.parametrize("decoding", ["parallel", "greedy"])
@pytest.mark.parametrize("constrained", [False, True])
def test_decodes_never_copy_a_neighbour_nor_repeat_an_ngram(decoding, constrained):
    d = make_dict()
    targets = random_targets(d, [4, 7, 10, 13], seed=4)
    constraints = None
    if constrained:  # distinct tokens from the middle of each target
        constraints = pack_constraints([[torch.tensor(y[len(y) // 2:len(y) // 2 + 2])] for y in targets])
    sample = batch_for(d, targets)
    free = InsertionGenerator(d, decoding=decoding, max_len_a=0, max_len_b=16).generate(  # the default: no rule
        [_Repeater(d, targets)], sample, constraints=constraints)
    assert sum(_neighbour_copies(h["tokens"][:-1].tolist()) for [h] in free) > 0  # the model does copy
    ruled = InsertionGenerator(d, decoding=decoding, block_neighbour_copies=True, max_len_a=0, max_len_b=16).generate(
        [_Repeater(d, targets)], sample, constraints=constraints)
    for [h] in ruled:
        assert _neighbour_copies(h["tokens"][:-1].tolist()) == 0, h["tokens"]
    both = InsertionGenerator(d, decoding=decoding, block_neighbour_copies=True, no_repeat_ngram_size=2,
                              max_len_a=0, max_len_b=16).generate(
        [_Repeater(d, targets)], sample, constraints=constraints)
    repeats = {}
    for name, hypos in (("free", free), ("both", both)):
        grams = [_ngrams([d.bos()] + h["tokens"].tolist(), 2) for [h] in hypos]
        repeats[name] = sum(len(g) - len(set(g)) for g in grams)
    assert repeats["free"] > 0
    if decoding == "greedy":  # one insertion per pass: no bigram ever occurs twice
        assert repeats["both"] == 0
    else:  # a slot is judged against the canvas before its pass, not against its neighbours' insertions
        assert repeats["both"] < repeats["free"]
    for [h], y in zip(both, targets):
        out = h["tokens"][:-1].tolist()
        assert _neighbour_copies(out) == 0
        if constrained:
            c = y[len(y) // 2:len(y) // 2 + 2]
            assert any(out[i:i + 2] == c for i in range(len(out))), (out, c)


def test_bad_ngram_size_is_refused():
    with pytest.raises(ValueError, match=r"--no-repeat-ngram-size \(no_repeat_ngram_size=\) must be 0 \(off\) or >= 2"):
        InsertionGenerator(make_dict(), no_repeat_ngram_size=1)
