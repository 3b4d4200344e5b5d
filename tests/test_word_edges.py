"""Constraints come out as whole words: no subword piece glued onto a constraint's edge.

The models here are tiny and biased towards the glueing pieces (``x@@`` for subword-nmt,
a piece without ``▁`` for sentencepiece), so that without the word-edge rule a constraint
is glued in most outputs (checked: the same decodes with the rule off), and every output
with the rule on is checked token by token: on random constraints (a hypothesis property
test), greedy and parallel, candidates and reranking, fairseq-generate, fairseq-interactive
and the hub.
"""

import itertools
import random
from pathlib import Path

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.token_generation_constraints import pack_constraints
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_insertion import loop as L
from fairseq_insertion.decoding import TORCH, WordEdges
from fairseq_insertion.generator import InsertionGenerator
from fairseq_insertion.loop import bans
from tests.utils import (
    PLUGIN,
    build_task,
    generate_args,
    parse_generate,
    preprocess,
    random_source_batch,
    run,
    train_args,
    train_once,
)

GAP = 1  # a template gap inside an encoded constraint: the dictionary's pad index
SPACE = "\u2581"
# the corpora's vocabularies: whole words and pieces that glue onto a neighbour
SCHEMES = {"subword_nmt": [f"w{i}" for i in range(12)] + [f"p{i}@@" for i in range(12)],
           "sentencepiece": [f"{SPACE}w{i}" for i in range(12)] + [f"p{i}" for i in range(12)] + [".", ","]}


def _dict(symbols):
    d = Dictionary()
    for s in symbols:
        d.add_symbol(s)
    return d


# ---------------------------------------------------------------- the dictionary's scheme
def test_the_scheme_is_read_from_the_dictionary():
    bpe = WordEdges.from_dictionary(_dict(["Ein", "Fahr@@", "rad", "schö@@", "nen", "."]))
    assert bpe.scheme == "subword_nmt"
    d = _dict(["Ein", "Fahr@@", "rad", "schö@@", "nen", "."])
    assert [s for s, j in zip(d.symbols, bpe.joins_next.tolist()) if j] == ["Fahr@@", "schö@@"]
    assert not bpe.joins_prev.any()
    spm = _dict([f"{SPACE}Ein", f"{SPACE}Fahr", "rad", ".", "2", f"{SPACE}"])
    edges = WordEdges.from_dictionary(spm)
    assert edges.scheme == "sentencepiece" and not edges.joins_next.any()
    # a piece without the word marker continues a word when it holds a letter or digit; punctuation does not
    assert [s for s, j in zip(spm.symbols, edges.joins_prev.tolist()) if j] == ["rad", "2"]
    eow = _dict(["Ein_EOW", "Fahr", "rad_EOW"])
    edges = WordEdges.from_dictionary(eow)
    assert edges.scheme == "_EOW"
    assert [s for s, j in zip(eow.symbols, edges.joins_next.tolist()) if j] == ["Fahr"]
    words = WordEdges.from_dictionary(_dict(["Ein", "Fahrrad", "."]))
    assert words.scheme == "none" and not words.active
    for e in (bpe, WordEdges.from_dictionary(spm), words):  # bos, pad, eos, unk glue onto nothing
        assert not e.joins_next[:4].any() and not e.joins_prev[:4].any()
    assert WordEdges.from_dictionary(_dict(["a@@", "b"]), scheme="none").scheme == "none"
    with pytest.raises(ValueError, match="word scheme"):
        WordEdges.from_dictionary(_dict(["a"]), scheme="letters")


def _slots_reference(framed, given, joins_next, eos):
    """word_edge_slots, one slot at a time, from its documented rule."""
    B, W = framed.shape
    out = [[[False] * (W - 1) for _ in range(B)] for _ in range(3)]
    for b in range(B):
        g = [False] + given[b].tolist() + [False]
        for slot in range(W - 1):
            left, right = int(framed[b, slot]), int(framed[b, slot + 1])
            complete = g[slot] and bool(joins_next[left]) and (g[slot + 1] or right == eos)
            out[0][b][slot] = g[slot + 1] or complete
            out[1][b][slot] = g[slot]
            out[2][b][slot] = complete
    return [torch.tensor(o) for o in out]


def test_word_edge_slots_match_the_per_slot_rule():
    rng = random.Random(0)
    V, bos, pad, eos = 12, 0, 1, 2
    joins_next = torch.tensor([False] * 4 + [rng.random() < 0.5 for _ in range(V - 4)])
    for _ in range(50):
        B, K = rng.randint(1, 4), rng.randint(0, 6)
        lengths = torch.tensor([rng.randint(0, K) for _ in range(B)])
        canvas = torch.randint(4, V, (B, K))
        real = torch.arange(K).unsqueeze(0) < lengths.unsqueeze(1)
        canvas = canvas.masked_fill(~real, pad)
        given = torch.rand(B, K).lt(0.5) & real
        framed = L.frame(TORCH, canvas, lengths, bos, eos, pad)
        got = bans.word_edge_slots(TORCH, framed, given, joins_next, eos)
        want = _slots_reference(framed, given, joins_next, eos)
        real_slots = L.slot_mask(TORCH, lengths, K + 1)
        for g, w in zip(got, want):
            assert torch.equal(g & real_slots, w & real_slots)


# ---------------------------------------------------------------- checking an output
def _pieces(cs):
    """The flat constraint tokens, and the indices (in them) that start and end a piece (a constraint,
    or a template's part between gaps)."""
    flat, starts, ends = [], [], []
    for c in cs:
        for part in _split_gaps(c):
            starts.append(len(flat))
            flat += part
            ends.append(len(flat) - 1)
    return flat, starts, ends


def _split_gaps(c):
    parts, cur = [], []
    for t in c:
        if t == GAP:
            parts, cur = parts + ([cur] if cur else []), []
        else:
            cur.append(t)
    return parts + ([cur] if cur else [])


def edge_violations(tokens, scores, cs, edges, limit, ordered=True):
    """Where one output glues a subword piece onto a constraint's edge, or leaves a constraint's
    ``x@@`` last piece uncompleted (only while the output is shorter than its length limit).
    Constraint tokens are the ones with positional score exactly 0. Empty: whole words."""
    toks, sc = tokens[:-1].tolist(), scores[:-1].tolist()
    given_at = [i for i, s in enumerate(sc) if s == 0.0]
    orders = [cs] if ordered else [list(p) for p in itertools.permutations(cs)]
    found = [p for p in map(_pieces, orders) if [toks[i] for i in given_at] == p[0]]
    if not found:
        return [f"constraints {cs} not found in {toks}"] if len(_pieces(cs)[0]) <= limit else []
    flat, starts, ends = found[0]
    jn, jp = edges.joins_next.tolist(), edges.joins_prev.tolist()
    given, short, bad = set(given_at), len(toks) < limit, []
    for k in starts:
        p = given_at[k]
        if p > 0 and jn[toks[p - 1]] and (p - 1 not in given or short):
            bad.append(f"{toks[p - 1]} glued before the constraint token at {p} of {toks}")
    for k in ends:
        p = given_at[k]
        if p + 1 < len(toks) and jp[toks[p + 1]] and p + 1 not in given:  # a given start glues by itself
            bad.append(f"{toks[p + 1]} glued after the constraint token at {p} of {toks}")
        if jn[toks[p]] and short and all(jn[t] for t in toks[p:]):
            bad.append(f"the word of the constraint token at {p} is not completed in {toks}")
    return bad


# ---------------------------------------------------------------- tiny models biased towards glueing
def _corpus(directory: Path, vocab, seed: int = 0) -> None:
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 100), ("valid", 4), ("test", 12)):
        with open(directory / f"{split}.src", "w") as fs, open(directory / f"{split}.tgt", "w") as ft:
            for _ in range(n):
                s = rng.sample(vocab, rng.randint(3, 9))
                fs.write(" ".join(s) + "\n")
                ft.write(" ".join(reversed(s)) + "\n")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Per scheme: a data-bin and a checkpoint trained 3 updates on a corpus of its pieces."""
    out = {}
    for scheme, vocab in SCHEMES.items():
        root = tmp_path_factory.mktemp(scheme)
        _corpus(root / "raw", vocab)
        preprocess(root / "raw", root / "bin")
        train_once(train_args(root / "bin", root / "ckpt", "--max-update", "3", "--no-epoch-checkpoints"), root / "bin",
                   root / "ckpt")
        out[scheme] = root
    return out


def glue_bias(model, edges, strength: float = 4.0) -> None:
    """Make the glueing pieces (and not end-of-slot) the likely insertions of ``model``."""
    head_forward = model.decoder.head.forward
    bias = (edges.joins_next | edges.joins_prev).float() * strength

    def biased(*a, **k):
        content, location = head_forward(*a, **k)
        return content + bias.to(content.dtype), location

    model.decoder.head.forward = biased


MAX_POSITIONS = 24


@pytest.fixture(scope="module")
def tasks(corpora):
    return {s: build_task(root / "bin", "--max-target-positions", MAX_POSITIONS) for s, root in corpora.items()}


def _packed(constraints):
    return pack_constraints([[torch.tensor(c, dtype=torch.long) for c in cs] for cs in constraints])


class _RandomScorer:
    """A stand-in reranker: any order of the candidates."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def log_probs(self, src_tokens, src_lengths, target, per_source):
        return torch.rand(target.size(0), generator=self.g)


def _glue_constraints(d, edges, rng, n, unfinished=True):
    """Constraints that invite glueing: whole words between glueing pieces; with ``unfinished``, some
    end with an ``x@@`` piece."""
    glue = [i for i in range(d.nspecial, len(d)) if edges.joins_next[i] or edges.joins_prev[i]]
    words = [i for i in range(d.nspecial, len(d)) if i not in glue]
    out = []
    for _ in range(n):
        cs = []
        for _ in range(rng.randint(1, 3)):
            c = [rng.choice(words) for _ in range(rng.randint(1, 2))]
            if unfinished and edges.joins_next.any() and rng.random() < 0.4:
                c.append(rng.choice(glue))  # ends mid-word: the decode completes the word
            cs.append(c)
        out.append(cs)
    return out


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("decoding,termination", [("parallel", "slot"), ("greedy", "slot"), ("greedy", "sequence")])
def test_glueing_models_keep_constraints_whole_words(tasks, scheme, decoding, termination, monkeypatch):
    task, args = tasks[scheme]
    d = task.target_dictionary
    edges = WordEdges.from_dictionary(d)
    assert edges.scheme == scheme
    torch.manual_seed(0)
    model = task.build_model(args).eval()
    model.termination = termination
    glue_bias(model, edges)
    rng = random.Random(1)
    cons = _glue_constraints(d, edges, rng, 16)
    sample = random_source_batch(d, [rng.randint(2, 8) for _ in cons])
    options = dict(decoding=decoding, max_len_a=0, max_len_b=MAX_POSITIONS - 2)

    def violations():
        hypos = InsertionGenerator(d, **options).generate([model], sample, constraints=_packed(cons))
        return [v for [h], cs in zip(hypos, cons)
                for v in edge_violations(h["tokens"], h["positional_scores"], cs, edges, MAX_POSITIONS - 2)]

    assert violations() == []
    with monkeypatch.context() as m:  # the same decodes without the rule: glued constraints
        m.setattr(WordEdges, "from_dictionary", classmethod(lambda cls, d, scheme=None: _none(d)))
        assert len(violations()) >= 3


def _none(d):
    V = len(d)
    return WordEdges(scheme="none", joins_next=torch.zeros(V, dtype=torch.bool),
                     joins_prev=torch.zeros(V, dtype=torch.bool))


def test_an_unfinished_last_piece_is_completed_before_the_end_and_the_next_constraint(tasks):
    """``p@@`` as a constraint's last piece, followed by end-of-sentence or another constraint: the
    model (biased to end every slot) must still insert a piece that ends the word."""
    task, args = tasks["subword_nmt"]
    d = task.target_dictionary
    torch.manual_seed(0)
    model = task.build_model(args).eval()
    head_forward = model.decoder.head.forward

    def ending(*a, **k):
        content, location = head_forward(*a, **k)
        content[..., d.eos()] = 1e4
        return content, location

    model.decoder.head.forward = ending
    w, p = d.index("w1"), d.index("p2@@")
    cons = [[[w, p]], [[p], [w]], [[w, p], [p]], [[w, GAP, p, GAP]]]
    for decoding in ("parallel", "greedy"):
        hypos = InsertionGenerator(d, decoding=decoding, max_len_a=0, max_len_b=12).generate(
            [model], random_source_batch(d, [3] * len(cons)), constraints=_packed(cons))
        outs = [h["tokens"][:-1].tolist() for [h] in hypos]
        edges = WordEdges.from_dictionary(d)
        for out, cs in zip(outs, cons):
            flat = _pieces(cs)[0]
            assert len(out) == len(flat) + sum(t == p for t in flat), (out, cs)  # one token after each p@@
            assert not edges.joins_next[out[-1]], out
        assert outs[0][:2] == [w, p] and outs[1][0] == p and outs[1][2] == w


@settings(max_examples=20, deadline=None, derandomize=True)  # same examples every run
@given(seed=st.integers(0, 2**16), scheme=st.sampled_from(list(SCHEMES)),
       decoding=st.sampled_from(["parallel", "greedy"]), termination=st.sampled_from(["slot", "sequence"]),
       order=st.sampled_from(["ordered", "unordered"]), bias=st.sampled_from([0.0, 2.0, 6.0]),
       max_len_b=st.integers(0, 22), candidates=st.sampled_from([(), (0.0, 2.0), (0.0, 1.0, 4.0)]),
       rerank=st.booleans(),
       batch=st.lists(st.tuples(st.integers(1, 8), st.lists(
           st.lists(st.one_of(st.integers(0, 10**6), st.just(-1)), min_size=1, max_size=4), max_size=3)),
           min_size=1, max_size=4))
def test_random_constraints_stay_whole_words(tasks, seed, scheme, decoding, termination, order, bias, max_len_b,
                                             candidates, rerank, batch):
    task, args = tasks[scheme]
    d = task.target_dictionary
    edges = WordEdges.from_dictionary(d)
    torch.manual_seed(seed)
    model = task.build_model(args).eval()
    model.termination = termination
    if bias:
        glue_bias(model, edges, bias)
    words = len(d) - d.nspecial
    cons = [[[GAP if t < 0 else d.nspecial + t % words for t in c] for c in cs] for _, cs in batch]
    sample = random_source_batch(d, [n for n, _ in batch])
    gen = InsertionGenerator(d, decoding=decoding, max_len_a=0, max_len_b=max_len_b, constraint_order=order,
                             eos_penalties=candidates, rerank=_RandomScorer(seed) if rerank and candidates else None)
    hypos = gen.generate([model], sample, constraints=_packed(cons))
    limit = min(max_len_b, MAX_POSITIONS - 2)
    for cands, cs in zip(hypos, cons):
        anchored = _anchored(cs)
        for h in cands:  # every candidate, whichever the reranker chooses
            assert edge_violations(h["tokens"], h["positional_scores"], cs, edges, limit,
                                   ordered=order == "ordered" or anchored) == []


def _anchored(cs):
    """A line whose template closes the sentence start or end keeps the given order."""
    return bool(cs) and ((GAP in cs[0] and cs[0][0] != GAP) or (GAP in cs[-1] and cs[-1][-1] != GAP))


# ---------------------------------------------------------------- fairseq-generate, fairseq-interactive, the hub
def _cli_violations(stdout, lines, d, edges, limit):
    """Token-level check of H- (no --post-process) and P- lines: constraint tokens score 0.0000."""
    hyps, pos = parse_generate(stdout, "H"), parse_generate(stdout, "P")
    bad = []
    for i, constraints in lines.items():
        text = hyps[str(i)][1].split()
        scores = torch.tensor([0.0 if s == "0.0000" else -1.0 for s in pos[str(i)][0].split()])
        tokens = torch.tensor([d.index(t) for t in text] + [d.eos()])
        cs = [[d.index(t) if t != "___" else GAP for t in c.split()] for c in constraints]
        bad += edge_violations(tokens, scores, cs, edges, limit)
    return bad


def test_generate_and_interactive_keep_constraints_whole_words(corpora, tmp_path):
    root = corpora["subword_nmt"]
    d = Dictionary.load(str(root / "bin" / "dict.tgt.txt"))
    edges = WordEdges.from_dictionary(d)
    rng = random.Random(3)
    cons = _glue_constraints(d, edges, rng, 12)
    lines = {i: [" ".join(d[t] for t in c) for c in cs] for i, cs in enumerate(cons)}
    cfile = tmp_path / "constraints.txt"
    cfile.write_text("".join("\t".join(cs) + "\n" for cs in lines.values()))
    ckpt = root / "ckpt" / "checkpoint_last.pt"
    for decoding in ("parallel", "greedy"):
        proc = run(generate_args(root / "bin", ckpt, "--batch-size", "5", "--max-len-a", "0", "--max-len-b", "16",
                                 "--constraints-file", cfile, "--decoding", decoding, "--eos-penalty", "-2"))
        assert len(parse_generate(proc.stdout, "H")) == len(cons)
        assert _cli_violations(proc.stdout, lines, d, edges, 16) == []
    sources = (root / "raw" / "test.src").read_text().splitlines()
    stdin = "".join(f"{sources[i]}\t" + "\t".join(cs) + "\n" for i, cs in lines.items())
    proc = run(["fairseq-interactive", root / "bin", "--user-dir", PLUGIN, "--task", "insertion_translation",
                "--path", ckpt, "--cpu", "--source-lang", "src", "--target-lang", "tgt", "--constraints",
                "--max-len-a", "0", "--max-len-b", "16", "--eos-penalty", "-2", "--batch-size", "4",
                "--buffer-size", "4"], input=stdin)
    assert len(parse_generate(proc.stdout, "H")) == len(cons)
    assert _cli_violations(proc.stdout, lines, d, edges, 16) == []


def _whole_words(hyp: str, constraint: str) -> bool:
    return f" {constraint} " in f" {hyp} "


def test_hub_translations_hold_every_constraint_as_whole_words(corpora, monkeypatch):
    from fairseq_insertion.hub import from_pretrained

    root = corpora["subword_nmt"]
    hub = from_pretrained(str(root / "ckpt"), checkpoint_file="checkpoint_last.pt",
                          data_name_or_path=str(root / "bin"), max_len_a=0, max_len_b=16)
    d = hub.tgt_dict
    edges = WordEdges.from_dictionary(d)
    glue_bias(hub.models[0], edges)
    rng = random.Random(4)
    cons = [[" ".join(d[t] for t in c) for c in cs] for cs in _glue_constraints(d, edges, rng, 12, unfinished=False)]
    sources = (root / "raw" / "test.src").read_text().splitlines()[:len(cons)]

    def glued(**kwargs):
        outs = hub.translate(sources, constraints=cons, **kwargs)
        return [(o, c) for o, cs in zip(outs, cons) for c in cs if not _whole_words(_post(o), _post(c))]

    for kwargs in ({}, {"decoding": "greedy"}, {"eos_penalties": "0,1,3"}):
        assert glued(**kwargs) == []
    with monkeypatch.context() as m:  # the rule off: the same translations glue constraints
        m.setattr(WordEdges, "from_dictionary", classmethod(lambda cls, d, scheme=None: _none(d)))
        assert len(glued()) >= 3


def _post(text: str) -> str:
    """fairseq's subword_nmt post-processing: pieces joined, ``@@`` before the end dropped."""
    return (text + " ").replace("@@ ", "").rstrip()
