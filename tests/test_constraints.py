"""Hard lexical constraints and templates (infilling): the initial canvas and
its closed slots against a per-sentence reference, decoding rules on forced
scores, a property test with random tiny models, and the CLIs and hub API."""

import itertools
import logging
import random

import pytest
import torch
from fairseq.token_generation_constraints import pack_constraints
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_insertion import loop as L
from fairseq_insertion.decoding import TORCH
from fairseq_insertion.generator import InsertionGenerator
from fairseq_insertion.loop import geometry
from tests.test_decoding import OracleModel, batch_for, make_dict, random_targets
from tests.utils import (
    PLUGIN,
    REPO,
    build_task,
    generate_args,
    never_end_slot,
    parse_generate,
    random_source_batch,
    reverse_data,
    run,
    train_args,
    train_once,
)

GAP = 1  # the gap marker inside an encoded constraint: the dictionary's pad index


def reference_canvas(constraints):
    """Per-sentence reference from the documented rule: tokens of one
    constraint are glued unless ``___`` separates them; a template (holds a
    gap) as first/last constraint closes the sentence start/end unless it
    starts/ends with the gap."""
    tokens, closed_before = [], []
    for c in constraints:
        prev = False
        for t in c:
            if t == GAP:
                prev = False
                continue
            tokens.append(t)
            closed_before.append(prev)
            prev = True
    if constraints and GAP in constraints[0] and constraints[0][0] != GAP:
        closed_before[0] = True
    closed_end = bool(constraints) and GAP in constraints[-1] and constraints[-1][-1] != GAP
    return tokens, closed_before, closed_end


def test_constraint_canvas_matches_the_per_sentence_rule():
    rng = random.Random(0)
    for _ in range(30):
        batch = [[[rng.choice([GAP, 4, 5, 6, 7, 8, 9]) for _ in range(rng.randint(0, 4))]
                  for _ in range(rng.randint(0, 3))] for _ in range(rng.randint(1, 5))]
        packed = pack_constraints([[torch.tensor(c, dtype=torch.long) for c in cs] for cs in batch])
        canvas, lengths, closed_before, closed_end, _ = L.constraint_canvas(TORCH, packed, gap=GAP, pad=GAP)
        for b, cs in enumerate(batch):
            tokens, ref_closed, ref_end = reference_canvas(cs)
            n = int(lengths[b])
            assert canvas[b, :n].tolist() == tokens, cs
            assert closed_before[b, :n].tolist() == ref_closed, cs
            assert not closed_before[b, n:].any() and bool(closed_end[b]) == ref_end, cs
            closed = geometry.closed_slots(TORCH, closed_before, closed_end, lengths, canvas.size(1) + 1)
            slots = closed[b, : n + 1].tolist()
            assert slots == ref_closed + [ref_end]


# ---------------------------------------------------------------- forced scores
def _packed(constraints):
    return pack_constraints([[torch.tensor(c, dtype=torch.long) for c in cs] for cs in constraints])


def test_the_loops_constraint_order_is_the_frozen_torch_codes_on_numpy_and_torch():
    """``loop.arrange_constraints`` against the torch code it replaced (tests/reference_generator.py), on random
    constraints (templates among them) and random translations holding some of their first tokens."""
    import numpy as np

    from fairseq_insertion.loop.starts import arrange_constraints
    from tests.reference_generator import _reorder_constraints

    rng = random.Random(5)
    for trial in range(40):
        B = rng.randint(1, 6)
        cons = [[[rng.randint(4, 12) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(0, 4))]
                for _ in range(B)]
        for cs in cons:  # some templates: a gap inside, at an end, or anchoring
            if cs and rng.random() < 0.4:
                cs[rng.randrange(len(cs))].insert(rng.randint(0, 1) * len(cs[0]), GAP)
        packed = _packed(cons)
        T = rng.randint(0, 9)
        hyp = torch.tensor([[rng.randint(4, 12) for _ in range(T)] for _ in range(B)], dtype=torch.long).reshape(B, T)
        lengths = torch.tensor([rng.randint(0, T) for _ in range(B)])
        start = L.constraint_canvas(TORCH, packed, gap=GAP, pad=GAP)
        if start.tokens.size(1) == 0:
            continue
        expected = _reorder_constraints(start, hyp, lengths)
        on_torch = arrange_constraints(TORCH, L.Start(*start), hyp, lengths)
        on_numpy = arrange_constraints(L.NUMPY, L.constraint_canvas(L.NUMPY, packed.numpy(), GAP, GAP), hyp.numpy(),
                                       lengths.numpy())
        for name, e, t, n in zip(L.Start._fields, expected, on_torch, on_numpy):
            assert torch.equal(e, t), (trial, name)
            np.testing.assert_array_equal(e.numpy(), n, err_msg=f"{trial} {name}")


@pytest.mark.parametrize("decoding,termination", [("parallel", "slot"), ("greedy", "slot"), ("greedy", "sequence")])
def test_constraints_from_the_target_decode_to_the_target(decoding, termination):
    """The oracle completes any canvas to its target, so n-grams of the target
    as constraints must give exactly the target, in fewer iterations."""
    d = make_dict()
    targets = random_targets(d, [9, 12, 5, 1, 7], seed=5)
    y0, y1, y2, y3, _ = targets
    constraints = [[y0[2:4], y0[6:7]], [y1[0:3], y1[10:12]], [y2[4:5]], [y3[0:1]], []]
    gen = InsertionGenerator(d, decoding=decoding)
    hypos = gen.generate([OracleModel(d, targets, termination=termination)], batch_for(d, targets),
                         constraints=_packed(constraints))
    free = InsertionGenerator(d, decoding=decoding).generate([OracleModel(d, targets, termination=termination)],
                                                             batch_for(d, targets))
    for y, cs, [h], [f] in zip(targets, constraints, hypos, free):
        assert h["tokens"].tolist() == y + [d.eos()]
        given_ = sum(len(c) for c in cs)
        assert h["steps"] <= f["steps"]
        if decoding == "greedy":
            assert h["steps"] == len(y) - given_  # one insertion per iteration, constraints are not inserted


def test_template_inserts_only_into_open_slots():
    """The oracle wants the whole target; a template anchored at both ends
    (``y1 ___ y5``) lets it fill only the gap, so the output is y[1..5]."""
    d = make_dict()
    targets = random_targets(d, [8, 8, 8], seed=6)
    y0, y1, y2 = targets
    constraints = [[[y0[1], GAP, y0[5]]],  # infill between y1 and y5, both ends closed
                   [[y1[0], y1[1], GAP]],  # completion: starts with y0 y1, open end
                   [[GAP, y2[6]], [y2[7]]]]  # open start; the last constraint is plain, so the end is open
    for decoding in ("parallel", "greedy"):
        hypos = InsertionGenerator(d, decoding=decoding).generate(
            [OracleModel(d, targets)], batch_for(d, targets), constraints=_packed(constraints))
        out = [h["tokens"].tolist()[:-1] for [h] in hypos]
        assert out == [y0[1:6], y1, y2]


def test_unordered_follows_the_unconstrained_translation():
    d = make_dict()
    targets = random_targets(d, [10, 6], seed=7)
    y0, y1 = targets
    constraints = [[y0[7:9], y0[1:2], y0[4:5]], [[y1[5]], [y1[0]]]]  # given out of target order
    for decoding in ("parallel", "greedy"):
        hypos = InsertionGenerator(d, decoding=decoding, constraint_order="unordered").generate(
            [OracleModel(d, targets)], batch_for(d, targets), constraints=_packed(constraints))
        assert [h["tokens"].tolist()[:-1] for [h] in hypos] == targets
    ordered = InsertionGenerator(d).generate([OracleModel(d, targets)], batch_for(d, targets),
                                             constraints=_packed(constraints))
    h = ordered[1][0]
    given_ = h["tokens"][:-1][h["positional_scores"][:-1].eq(0)].tolist()
    assert given_ == [y1[5], y1[0]]  # ordered keeps the given order


def test_constraints_over_the_length_limit_give_an_empty_line_and_an_error(caplog):
    d = make_dict()
    targets = random_targets(d, [6, 6, 6], seed=8)
    constraints = [[targets[0][:2]], [targets[1][:5], targets[1][5:]], [targets[2][3:4]]]
    sample = batch_for(d, targets)
    sample["id"] = torch.tensor([10, 11, 12])
    with caplog.at_level(logging.ERROR):
        hypos = InsertionGenerator(d, max_len_a=0, max_len_b=5).generate([OracleModel(d, targets)], sample,
                                                            constraints=_packed(constraints))
    assert hypos[1][0]["tokens"].tolist() == [d.eos()]  # 6 constraint tokens > 5
    assert "sentence 11: its constraints hold 6 tokens, over the length limit 5" in caplog.text
    assert "sentence 10" not in caplog.text and "sentence 12" not in caplog.text
    assert hypos[0][0]["tokens"].tolist()[:-1] == targets[0][:5]  # the others translate, up to the limit
    assert targets[2][3] in hypos[2][0]["tokens"].tolist()


def test_empty_source_with_constraints_is_decoded_from_them():
    """An empty source with constraints: decoded from the canvas holding them (the model fills in around
    them; a limit below their length is raised to it); without constraints: an empty output."""
    d = make_dict()
    targets = random_targets(d, [4, 4, 4], seed=9)
    sample = batch_for(d, targets)
    sample["net_input"]["src_tokens"][:] = d.eos()
    sample["net_input"]["src_lengths"][:] = 1  # each line empty: its end-of-sentence marker only
    constraints = _packed([[targets[0][1:3]], [], [targets[2][:3]]])
    hypos = InsertionGenerator(d, max_len_a=0, max_len_b=2).generate([OracleModel(d, targets)], sample,
                                                                     constraints=constraints)
    assert [h["tokens"].tolist()[:-1] for [h] in hypos] == [targets[0][1:3], [], targets[2][:3]]
    eos_only = {"net_input": {"src_tokens": torch.full((1, 1), d.eos()), "src_lengths": torch.ones(1).long()}}
    [[h]] = InsertionGenerator(d).generate([OracleModel(d, targets[:1])], eos_only, constraints=constraints[:1])
    assert h["tokens"].tolist() == targets[0] + [d.eos()] and h["steps"] >= 1


# ---------------------------------------------------------------- random models
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = reverse_data(tmp_path_factory, "constraints", 100, 4, 6)
    train_once(train_args(root / "bin", root / "ckpt", "--max-update", "3", "--no-epoch-checkpoints"), root / "bin",
               root / "ckpt")
    return root


MAX_POSITIONS = 16


@pytest.fixture(scope="module")
def tiny(trained):
    return build_task(trained / "bin", "--max-target-positions", MAX_POSITIONS)


def _given_ok(tokens, scores, cs, limit, anchors=True) -> bool:
    """Constraint tokens are the tokens with positional score exactly 0 (the
    model's inserted ones have log p < 0); they must be the constraints in
    order, each glued piece contiguous, templates anchored as documented."""
    tokens, scores = tokens[:-1].tolist(), scores[:-1].tolist()
    flat, closed_before, closed_end = reference_canvas(cs)
    if not anchors:
        closed_before, closed_end = [c and k > 0 for k, c in enumerate(closed_before)], False
    if len(flat) > limit:
        return tokens == []
    given_at = [i for i, s in enumerate(scores) if s == 0.0]
    return (len(tokens) <= limit and [tokens[i] for i in given_at] == flat
            and all(given_at[k] == given_at[k - 1] + 1 for k in range(1, len(flat)) if closed_before[k])
            and not (flat and closed_before[0] and given_at[0] != 0)
            and not (closed_end and given_at[-1] != len(tokens) - 1))


constraint = st.lists(st.one_of(st.integers(4, 27), st.just(GAP)), min_size=0, max_size=4)


@settings(max_examples=15, deadline=None, derandomize=True)  # same examples every run
@given(seed=st.integers(0, 2**16), decoding=st.sampled_from(["parallel", "greedy"]),
       termination=st.sampled_from(["slot", "sequence"]), order=st.sampled_from(["ordered", "unordered"]),
       never_stop=st.booleans(), max_len_b=st.integers(0, 20),
       batch=st.lists(st.tuples(st.integers(1, 10), st.lists(constraint, max_size=3)), min_size=1, max_size=4))
def test_every_constraint_appears_for_random_models(tiny, seed, decoding, termination, order, never_stop, max_len_b,
                                                    batch):
    task, args = tiny
    torch.manual_seed(seed)
    model = task.build_model(args).eval()
    model.termination = termination
    d = task.target_dictionary
    if never_stop:
        never_end_slot(model, d)
    sample = random_source_batch(d, [n for n, _ in batch])
    cons = [cs for _, cs in batch]
    gen = InsertionGenerator(d, decoding=decoding, max_len_a=0, max_len_b=max_len_b, constraint_order=order)
    hypos = gen.generate([model], sample, constraints=_packed(cons))
    limit = min(max_len_b, MAX_POSITIONS - 2)
    for [h], cs in zip(hypos, cons):
        flat, closed_before, closed_end = reference_canvas(cs)
        if order == "ordered" or (flat and closed_before[0]) or closed_end:  # anchored lines keep the given order
            assert _given_ok(h["tokens"], h["positional_scores"], cs, limit), (cs, h["tokens"])
        else:  # whole constraints, glued, in some order
            assert any(_given_ok(h["tokens"], h["positional_scores"], list(p), limit, anchors=False)
                       for p in itertools.permutations(cs)), (cs, h["tokens"])
    # empty constraint lists decode exactly like no constraints
    empty = gen.generate([model], sample, constraints=_packed([[] for _ in batch]))
    free = InsertionGenerator(d, decoding=decoding, max_len_a=0, max_len_b=max_len_b).generate([model], sample)
    for [a], [b] in zip(empty, free):
        assert a["tokens"].tolist() == b["tokens"].tolist() and a["steps"] == b["steps"]
        assert torch.equal(a["positional_scores"], b["positional_scores"])


# ---------------------------------------------------------------- CLIs and hub
def _holds(hyp: str, constraint: str) -> bool:
    return f" {constraint} " in f" {hyp} "


def test_generate_with_a_constraints_file(trained, tmp_path):
    refs = (trained / "raw" / "test.tgt").read_text().splitlines()
    long = " ".join(["w1"] * 9)  # over --max-len-b 8
    lines = [" ".join(refs[0].split()[1:3]),
             "\t".join(refs[1].split()[i] for i in (3, 0)),
             "",
             f"zz9 {refs[3].split()[0]}",
             f"{refs[4].split()[0]} ___ {refs[4].split()[-1]}",
             long]
    cfile = tmp_path / "constraints.txt"
    cfile.write_text("\n".join(lines) + "\n")
    proc = run(generate_args(trained / "bin", trained / "ckpt" / "checkpoint_last.pt", "--batch-size", "4",
                             "--max-len-b", "8", "--constraints-file", cfile))
    log = proc.stdout + proc.stderr
    hyps = {int(i): text for i, (_score, text) in parse_generate(proc.stdout, "H").items()}
    assert sorted(hyps) == list(range(6))
    assert _holds(hyps[0], lines[0])
    w3, w0 = lines[1].split("\t")
    assert _holds(hyps[1], w3) and _holds(hyps[1], w0)
    assert hyps[1].split().index(w3) < len(hyps[1].split()) - 1 - hyps[1].split()[::-1].index(w0)  # in order
    assert _holds(hyps[3], f"<unk> {refs[3].split()[0]}")
    assert "sentence 3" in log and "not in the target dictionary" in log and "'zz9'" in log
    template = hyps[4].split()
    assert template[0] == refs[4].split()[0] and template[-1] == refs[4].split()[-1]
    assert hyps[5] == ""
    assert "sentence 5: its constraints hold 9 tokens, over the length limit 8" in log
    assert "insertion decoding (parallel): 6 sentences" in log


def test_constraints_file_with_the_wrong_line_count_is_named(trained, tmp_path):
    """What fairseq-generate does before decoding: load the test set, then build the generator."""
    cfile = tmp_path / "short.txt"
    cfile.write_text("w1\nw2\n")
    task, args = build_task(trained / "bin", "--constraints-file", cfile)
    task.load_dataset("test")
    with pytest.raises(ValueError, match=f"--constraints-file {cfile} has 2 lines, but the test set has .*test: 6"):
        task.build_generator([task.build_model(args)], args)
    with pytest.raises(ValueError, match="for fairseq-generate"):  # no test set: fairseq-interactive
        build_task(trained / "bin", "--constraints-file", cfile)[0].build_generator([], args)


def test_multi30k_constraints_script_end_to_end(trained, tmp_path):
    """examples/multi30k/constraints.py on a prepare.py-shaped directory (no BPE here)."""
    import json
    import sys

    data = tmp_path / "data"
    for sub in ("tok", "raw"):
        (data / sub).mkdir(parents=True)
        (data / sub / "test.tgt").write_text((trained / "raw" / "test.tgt").read_text())
    (data / "data-bin").symlink_to(trained / "bin")
    proc = run([sys.executable, REPO / "examples" / "multi30k" / "constraints.py", "run", "--data", data,
                "--checkpoint", trained / "ckpt" / "checkpoint_last.pt", "--out", tmp_path / "out", "--cpu",
                "--max-len-b", "10"])
    assert "| 1-2 reference n-grams | 100.0% (" in proc.stdout
    refs = (trained / "raw" / "test.tgt").read_text().splitlines()
    drawn = [line.split("\t") for line in (tmp_path / "out" / "constraints.txt").read_text().splitlines()]
    assert len(drawn) == len(refs) and all(1 <= len(cs) <= 2 for cs in drawn)
    for ref, cs in zip(refs, drawn):
        assert all(_holds(ref, c) and 1 <= len(c.split()) <= 3 for c in cs)
        if len(cs) == 2:  # non-overlapping, in reference order (the reference's words are distinct)
            words = ref.split()
            assert words.index(cs[0].split()[-1]) < words.index(cs[1].split()[0])
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    constrained = results["1-2 reference n-grams"]
    assert constrained["usage_rate"] == 1.0 and constrained["constraints"] == sum(map(len, drawn))
    assert constrained["sentences"] == len(refs) and constrained["mean_iterations"] is not None
    assert results["none"]["constraints"] == constrained["constraints"]


def test_interactive_constraints_and_templates(trained):
    lines = ["w1 w2 w3\tw3 w2\tw9",
             "w4 w5 w6 w7\tw7 ___ w4",
             "w1 w2\tzz9 w2",
             "w1 w2 w3\t" + " ".join(["w5"] * 9),
             "w5 w6"]
    proc = run(["fairseq-interactive", trained / "bin", "--user-dir", PLUGIN, "--task", "insertion_translation",
                "--path", trained / "ckpt" / "checkpoint_last.pt", "--cpu", "--source-lang", "src",
                "--target-lang", "tgt", "--constraints", "unordered", "--tokenizer", "moses", "--max-len-b", "8",
                "--buffer-size", "8", "--batch-size", "8"], input="\n".join(lines) + "\n")
    log = proc.stdout + proc.stderr
    hyps = {int(i): text for i, (_score, text) in parse_generate(proc.stdout, "H").items()}
    assert sorted(hyps) == list(range(5))
    assert _holds(hyps[0], "w3 w2") and _holds(hyps[0], "w9")
    assert hyps[1].split()[0] == "w7" and hyps[1].split()[-1] == "w4"  # the template, through Moses, anchored
    assert _holds(hyps[2], "<unk> w2") and "'zz9'" in log
    assert hyps[3] == "" and "source line 'w1 w2 w3': its constraints hold 9 tokens" in log
    assert "source line 'w5 w6'" not in log  # no constraints, nothing to report


def test_hub_translate_with_constraints(trained):
    from fairseq.hub_utils import GeneratorHubInterface

    from fairseq_insertion.hub import InsertionHubInterface, from_pretrained
    from fairseq_insertion.model import InsertionTransformerModel

    kwargs = dict(checkpoint_file="checkpoint_last.pt", data_name_or_path=str(trained / "bin"), max_len_b=10)
    hub = from_pretrained(str(trained / "ckpt"), **kwargs)
    assert isinstance(hub, InsertionHubInterface)
    free = hub.translate(["w1 w2 w3", "w4 w5"])
    assert hub.translate(["w1 w2 w3", "w4 w5"], constraints=[[], []]) == free
    assert hub.translate("w1 w2 w3", constraints=[]) == free[0]
    out = out_ordered = hub.translate("w1 w2 w3", constraints=["w3 w2", "w9"])
    assert _holds(out, "w3 w2") and _holds(out, "w9") and out.index("w3 w2") < out.rindex("w9")
    out = hub.translate(["w1 w2 w3", "w4 w5"], constraints=[["w7 ___ w8"], ["w6"]], constraint_order="unordered")
    assert out[0].split()[0] == "w7" and out[0].split()[-1] == "w8" and _holds(out[1], "w6")
    direct = InsertionTransformerModel.from_pretrained(str(trained / "ckpt"), **kwargs)
    assert isinstance(direct, InsertionHubInterface)
    assert direct.translate("w1 w2 w3", constraints=["w3 w2", "w9"]) == out_ordered
    plain = GeneratorHubInterface(direct.cfg, direct.task, list(direct.models))
    with pytest.raises(ValueError, match="insertion hub interface"):
        plain.translate("w1 w2", constraints=["w3"])
