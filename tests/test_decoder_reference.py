"""The optimised decoding loop against a frozen copy of the previous one
(tests/reference_generator.py), on a small trained model's test set: the same
hypotheses for parallel and greedy, slot and sequence finalization, with and
without constraints; batch invariance in-process and through fairseq-generate,
fairseq-interactive and the hub; and the opt-in --close-ended-slots rule.
The reference has no repetition rule, so the new loop runs without it here
(tests/test_repetition.py covers the rule). Its scores are a log-probability of
the decode (log p(c, l) per token), checked against a per-sentence replay."""

import random

import pytest
import torch
from fairseq.token_generation_constraints import pack_constraints

from fairseq_insertion.generator import InsertionGenerator
from tests.reference_generator import ReferenceInsertionGenerator
from tests.test_decoding import OracleModel, batch_for, make_dict
from tests.utils import PLUGIN, generate_args, parse_generate, run, trained_reverse_model

TEST_LINES = 40


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_reverse_model(tmp_path_factory, "reference", TEST_LINES)


def _batches(task, size: int):
    itr = task.get_batch_iterator(task.dataset("test"), max_sentences=size, required_batch_size_multiple=1,
                                  disable_iterator_cache=True)  # fairseq would reuse the first size's batches
    return list(itr.next_epoch_itr(shuffle=False))


def _constraints(sample, d, seed: int = 0) -> torch.Tensor:
    """One or two n-grams of each reference (the target without eos), packed."""
    rng = random.Random(seed)
    per_line = []
    for tgt in sample["target"]:
        y = tgt[tgt.ne(d.pad()) & tgt.ne(d.eos())].tolist()
        cs = []
        for _ in range(rng.randint(1, 2)):
            i = rng.randrange(len(y))
            cs.append(torch.tensor(y[i:i + rng.randint(1, 3)]))
        per_line.append(cs)
    return pack_constraints(per_line)


def _decode_all(gen_cls, model, task, batch_size: int, constrained: bool, **kwargs) -> dict:
    gen = gen_cls(task.target_dictionary, src_dict=task.source_dictionary, **kwargs)
    out = {}
    for sample in _batches(task, batch_size):
        constraints = _constraints(sample, task.target_dictionary) if constrained else None
        for i, [h] in zip(sample["id"].tolist(), gen.generate([model], sample, constraints=constraints)):
            out[i] = h
    return out


@pytest.mark.parametrize("decoding,termination", [("parallel", "slot"), ("greedy", "slot"), ("greedy", "sequence"),
                                                  ("parallel", "sequence")])
@pytest.mark.parametrize("constrained", [False, True])
def test_hypotheses_equal_the_previous_decoder(trained, decoding, termination, constrained, monkeypatch):
    _, model, task = trained
    monkeypatch.setattr(model, "termination", termination)
    # sequence finalization on a slot-trained model stops early unless end-of-sequence is penalised more
    kwargs = dict(decoding=decoding, eos_penalty=0.5 if termination == "slot" else 3.0, max_len_a=1.0, max_len_b=6,
                  constraint_order="unordered" if constrained and decoding == "parallel" else "ordered")
    ref = _decode_all(ReferenceInsertionGenerator, model, task, 16, constrained, **kwargs)
    new = _decode_all(InsertionGenerator, model, task, 16, constrained, block_neighbour_copies=False, **kwargs)
    assert sorted(new) == sorted(ref) == list(range(TEST_LINES))
    lengths = set()
    for i in ref:
        assert new[i]["tokens"].tolist() == ref[i]["tokens"].tolist(), i
        assert new[i]["steps"] == ref[i]["steps"], i
        # constraint tokens score 0 in both; inserted tokens: log p(c, l) here, log p(c | l) there
        given = ref[i]["positional_scores"][:-1].eq(0)
        assert torch.equal(new[i]["positional_scores"][:-1].eq(0), given), i
        assert (new[i]["positional_scores"][:-1][~given] <= ref[i]["positional_scores"][:-1][~given] + 1e-5).all()
        lengths.add(len(ref[i]["tokens"]))
    assert len(lengths) > 3  # the comparison covers outputs of many lengths


def test_batch_one_equals_batch_sixteen(trained):
    _, model, task = trained
    assert {len(b["id"]) for b in _batches(task, 1)} == {1}
    one = _decode_all(InsertionGenerator, model, task, 1, False)
    many = _decode_all(InsertionGenerator, model, task, 16, False)
    assert {i: h["tokens"].tolist() for i, h in one.items()} == {i: h["tokens"].tolist() for i, h in many.items()}


def test_generate_interactive_and_hub_agree_at_every_batch_size(trained):
    root, _, _ = trained
    ckpt = root / "ckpt" / "checkpoint_last.pt"
    by_batch = {}
    for batch in (1, 64):
        proc = run(generate_args(root / "bin", ckpt, "--batch-size", batch))
        by_batch[batch] = {int(i): text for i, (_, text) in parse_generate(proc.stdout, "H").items()}
    assert by_batch[1] == by_batch[64] and len(by_batch[1]) == TEST_LINES
    closed = run(generate_args(root / "bin", ckpt, "--batch-size", 64, "--close-ended-slots"))
    assert len(parse_generate(closed.stdout, "H")) == TEST_LINES
    sources = (root / "raw" / "test.src").read_text().splitlines()
    # fairseq-generate orders by length; interactive and the hub keep the input order
    want = [by_batch[1][i] for i in range(TEST_LINES)]
    for batch in (1, 16):
        proc = run(["fairseq-interactive", root / "bin", "--user-dir", PLUGIN, "--task", "insertion_translation",
                    "--path", ckpt, "--cpu", "--source-lang", "src", "--target-lang", "tgt", "--batch-size", batch,
                    "--buffer-size", batch], input="\n".join(sources) + "\n")
        got = [text for _, (_, text) in sorted(parse_generate(proc.stdout, "H").items(), key=lambda kv: int(kv[0]))]
        assert got == want, batch
    from fairseq_insertion.model import InsertionTransformerModel

    hub = InsertionTransformerModel.from_pretrained(str(ckpt.parent), "checkpoint_last.pt", str(root / "bin"),
                                                    source_lang="src", target_lang="tgt", cpu=True)
    assert hub.translate(sources, batch_size=7) == want
    assert [hub.translate(s) for s in sources[:5]] == want[:5]


class _Flip(OracleModel):
    """[] -> slot 0: t5; [t5] -> end-of-slot, t6; [t5 t6] -> t7, end-of-slot, end-of-slot; then
    end-of-slot everywhere. Slot 0 chooses end-of-slot in the second pass and a token in the third."""

    def _decode(self, framed, encoder_out=None):
        B, L = framed.shape
        d = self.d
        content = torch.zeros(B, L - 1, len(d))
        plan = {(): ["t5"], ("t5",): [None, "t6"], ("t5", "t6"): ["t7", None, None]}
        for r in range(B):
            canvas = tuple(d[t] for t in framed[r, 1:].tolist() if t not in (d.pad(), d.eos()))
            for slot, word in enumerate(plan.get(canvas, [None] * (len(canvas) + 1))):
                content[r, slot, d.eos() if word is None else d.index(word)] = 10.0
        return content, torch.zeros(B, L - 1)


def test_close_ended_slots_keeps_a_slot_closed_once_it_chose_end_of_slot():
    d = make_dict()
    model = _Flip(d, [[0]])
    free = InsertionGenerator(d).generate([model], batch_for(d, [[0]]))[0][0]
    assert [d[t] for t in free["tokens"][:-1]] == ["t7", "t5", "t6"]
    closed = InsertionGenerator(d, close_ended_slots=True).generate([model], batch_for(d, [[0]]))[0][0]
    assert [d[t] for t in closed["tokens"][:-1]] == ["t5", "t6"]  # slot 0 closed in the second pass


def test_close_ended_slots_decodes_an_oracle_in_the_same_iterations():
    """Where end-of-slot means the span is empty (a perfect model), closing those slots changes nothing."""
    d = make_dict()
    g = torch.Generator().manual_seed(0)
    words = torch.arange(d.nspecial, len(d))
    targets = [words[torch.randperm(len(words), generator=g)[:n]].tolist() for n in (0, 1, 2, 5, 8, 13, 21)]
    model = OracleModel(d, targets)
    for decoding in ("parallel", "greedy"):
        a = InsertionGenerator(d, decoding=decoding).generate([model], batch_for(d, targets))
        b = InsertionGenerator(d, decoding=decoding, close_ended_slots=True).generate([model], batch_for(d, targets))
        assert [h["tokens"].tolist() for [h] in a] == [h["tokens"].tolist() for [h] in b]
        assert [h["steps"] for [h] in a] == [h["steps"] for [h] in b]


def test_a_sentence_decoded_beside_a_finished_wider_one_is_decoded_as_alone(trained):
    """A line whose constraints already fill its length limit never enters the loop; the line
    decoded beside it must not see that line's wider canvas as padding."""
    _, model, task = trained
    d = task.target_dictionary
    sample = _batches(task, 2)[0]
    words = sample["target"][0][:3]
    gen = InsertionGenerator(d, src_dict=task.source_dictionary, max_len_a=0, max_len_b=3)
    both = gen.generate([model], sample, constraints=pack_constraints([[words], []]))
    assert both[0][0]["tokens"][:-1].tolist() == words.tolist()
    alone = {k: v[1:] if torch.is_tensor(v) else v for k, v in sample["net_input"].items()}
    [[h]] = gen.generate([model], {"net_input": alone})
    assert both[1][0]["tokens"].tolist() == h["tokens"].tolist()
    torch.testing.assert_close(both[1][0]["positional_scores"], h["positional_scores"])


def _inserted(old, new):
    """Where ``old`` sits in ``new`` (a subsequence): the slot of ``old`` each other token of ``new`` went
    into, or None when the embedding is not unique (leftmost and rightmost embeddings differ)."""
    def embed(a, b):
        pos, j = [], 0
        for t in a:
            while b[j] != t:
                j += 1
            pos.append(j)
            j += 1
        return pos

    left = embed(old, new)
    right = [len(new) - 1 - p for p in embed(old[::-1], new[::-1])][::-1]
    if left != right:
        return None
    kept = set(left)
    return [(sum(p < j for p in left), new[j]) for j in range(len(new)) if j not in kept]


@pytest.mark.parametrize("lenpen", [1.0, 0.5])
def test_scores_are_the_log_probability_of_the_decode(trained, lenpen):
    """Replay every sentence's decode alone through the model's training forward pass: each inserted token
    scores log p(l) + log p(c | l) on the canvas it went into, the final end-of-slot decisions sum
    log p(eos, l) over the slots of the final canvas, and score = log_prob / (n + 1) ** lenpen."""
    _, model, task = trained
    d = task.target_dictionary
    gen = InsertionGenerator(d, src_dict=task.source_dictionary, eos_penalty=0.5, retain_history=True,
                             lenpen=lenpen, block_neighbour_copies=True)  # fewer ambiguous replays
    checked = 0
    for sample in _batches(task, 16)[:2]:
        src, src_len = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
        for b, [h] in enumerate(gen.generate([model], sample)):
            n = len(h["tokens"]) - 1
            canvases = [[]] + [x["tokens"][:-1].tolist() for x in h["history"]]
            steps = [_inserted(a, c) for a, c in zip(canvases, canvases[1:])]
            if any(s is None for s in steps) or n >= int(src_len[b]) * gen.config.max_len_a + gen.config.max_len_b:
                continue  # an ambiguous alignment, or stopped by the length limit
            want = []
            for canvas, step in zip(canvases, steps + [None]):
                framed = torch.tensor([[d.bos()] + canvas + [d.eos()]])
                with torch.no_grad():
                    content, location = model.slot_log_probs(model(src[b:b + 1], src_len[b:b + 1], framed), framed)
                joint = content[0] + location[0].unsqueeze(-1)  # (S, V) log p(c, l)
                if step is None:  # the final canvas: every slot chose end-of-slot
                    want.append(joint[:, d.eos()].sum())
                else:
                    want += [joint[slot, tok] for slot, tok in step]
            got = h["positional_scores"]
            assert got.shape == (n + 1,)
            # the replay lists tokens in insertion order; compare each step's tokens as a multiset via the total
            torch.testing.assert_close(h["log_prob"], torch.stack(want).sum(), atol=1e-3, rtol=1e-4)
            torch.testing.assert_close(got[-1], want[-1], atol=1e-3, rtol=1e-4)
            torch.testing.assert_close(h["score"], h["log_prob"] / (n + 1) ** lenpen)
            assert sorted(got[:-1].tolist()) == pytest.approx(sorted(t.item() for t in want[:-1]), abs=1e-3)
            checked += 1
    assert checked >= 20
