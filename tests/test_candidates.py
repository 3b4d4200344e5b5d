"""Candidate decoding (--eos-penalties) and reranking with an autoregressive
transformer (--rerank-with): the chosen hypothesis is the candidate with the
best score under the chosen scorer, each candidate is the decode under its own
EOS penalty, the transformer's score equals fairseq's own SequenceScorer, and
--nbest prints the candidates."""

import pytest
import torch
from fairseq.sequence_scorer import SequenceScorer

from fairseq_insertion.checkpoints import dictionary_files
from fairseq_insertion.generator import InsertionGenerator
from fairseq_insertion.rerank import AutoregressiveScorer
from tests.test_decoding import OracleModel, batch_for, make_dict, random_targets
from tests.test_warm_start import train_teacher
from tests.utils import build_task, generate_args, parse_generate, reverse_data, run, train_args, train_once

BETAS = (0.0, 1.0, 2.0, 3.0)


def test_each_candidate_is_the_decode_under_its_penalty_and_the_best_scored_comes_first():
    d = make_dict()
    targets = random_targets(d, [3, 6, 11], seed=5)
    model = OracleModel(d, targets, eos_bonus=1.5)  # end-of-slot beats the right token by 1.5 nats
    hypos = InsertionGenerator(d, eos_penalties=BETAS).generate([model], batch_for(d, targets))
    for b, cands in enumerate(hypos):
        assert sorted(h["eos_penalty"] for h in cands) == list(BETAS)
        for h in cands:
            [[alone]] = InsertionGenerator(d, eos_penalty=h["eos_penalty"]).generate(
                [OracleModel(d, [targets[b]], eos_bonus=1.5)], batch_for(d, [targets[b]]))
            assert h["tokens"].tolist() == alone["tokens"].tolist() and h["steps"] == alone["steps"]
        scores = [float(h["score"]) for h in cands]
        assert scores == sorted(scores, reverse=True)
        outputs = {tuple(h["tokens"].tolist()) for h in cands}
        assert outputs == {(d.eos(),), tuple(targets[b] + [d.eos()])}  # beta 0 and 1: nothing; 2 and 3: the target


class _ShortestFirst:
    """A stand-in scorer that prefers short hypotheses and records what it was asked."""

    def __init__(self, pad: int):
        self.calls, self.pad = [], pad

    def log_probs(self, src_tokens, src_lengths, target, per_source):
        self.calls.append((src_tokens.size(0), target.size(0), per_source))
        return -target.ne(self.pad).sum(1).float() ** 2  # normalised by (n + 1): -(n + 1)


def test_rerank_chooses_the_candidate_the_scorer_likes_best_in_one_call():
    d = make_dict()
    targets = random_targets(d, [4, 9], seed=6)
    scorer = _ShortestFirst(d.pad())
    hypos = InsertionGenerator(d, eos_penalties=BETAS, rerank=scorer).generate(
        [OracleModel(d, targets, eos_bonus=1.5)], batch_for(d, targets))
    assert scorer.calls == [(len(targets), len(targets) * len(BETAS), len(BETAS))]  # one batch, sources once
    for cands in hypos:
        assert [h["rerank_score"] for h in cands] == sorted((h["rerank_score"] for h in cands), reverse=True)
        assert cands[0]["tokens"].tolist() == [d.eos()]  # the shortest: the empty output of beta 0


def load_scorer(teacher, task) -> AutoregressiveScorer:
    """--rerank-with ``teacher`` for ``task``'s dictionaries."""
    return AutoregressiveScorer.load(str(teacher), task.source_dictionary, task.target_dictionary, "cpu",
                                     dictionaries=dictionary_files(task.cfg))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = reverse_data(tmp_path_factory, "candidates", 300, 8, 12)
    train_once(train_args(root / "bin", root / "ckpt", "--max-update", "20", "--no-epoch-checkpoints"), root / "bin",
               root / "ckpt")
    teacher = train_teacher(root / "bin", root / "teacher", "--share-all-embeddings")
    return root, teacher


def test_transformer_score_equals_fairseqs_sequence_scorer(setup):
    root, teacher = setup
    task, _ = build_task(root / "bin")
    task.load_dataset("test")
    sample = next(iter(task.get_batch_iterator(task.dataset("test"), max_sentences=12).next_epoch_itr(shuffle=False)))
    scorer = load_scorer(teacher, task)
    pad = task.target_dictionary.pad()
    hyps = [t[t.ne(pad)] for t in sample["target"]]  # the references, each ending with eos
    ours = scorer.score(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"], hyps)
    theirs = SequenceScorer(task.target_dictionary).generate([scorer.model], sample)
    want = torch.tensor([h[0]["positional_scores"].mean().item() for h in theirs])
    torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-5)


def _trained(setup):
    from fairseq import checkpoint_utils

    root, teacher = setup
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(root / "ckpt" / "checkpoint_last.pt")], arg_overrides={"data": str(root / "bin")})
    task.load_dataset("test")
    sample = next(iter(task.get_batch_iterator(task.dataset("test"), max_sentences=12).next_epoch_itr(shuffle=False)))
    return models[0].eval(), task, sample, teacher


def test_candidates_from_one_encoder_output_equal_each_beta_decoded_alone(setup):
    """A trained model: the candidates of a batch (each source encoded once, its encoder output expanded
    to every beta, rows leaving as they finish) are the decodes of each beta on its own, scores included."""
    model, task, sample, _ = _trained(setup)
    d = task.target_dictionary
    together = InsertionGenerator(d, eos_penalties=BETAS, src_dict=task.source_dictionary).generate([model], sample)
    for beta in BETAS:
        alone = InsertionGenerator(d, eos_penalty=beta, src_dict=task.source_dictionary).generate([model], sample)
        for cands, [h] in zip(together, alone):
            [c] = [c for c in cands if c["eos_penalty"] == beta]
            assert c["tokens"].tolist() == h["tokens"].tolist() and c["steps"] == h["steps"]
            torch.testing.assert_close(c["positional_scores"], h["positional_scores"], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(c["score"], h["score"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("weight,lenpen", [(0.0, 1.0), (0.7, 1.0), (2.0, 0.5)])
def test_rerank_score_is_teacher_plus_weight_times_model_score(setup, weight, lenpen):
    """rerank_score = the teacher's log p(y | x) / (n + 1) ** lenpen (from fairseq's SequenceScorer on
    each candidate alone) + weight x the candidate's score replayed by decoding its beta alone."""
    model, task, sample, teacher = _trained(setup)
    d = task.target_dictionary
    scorer = AutoregressiveScorer.load(str(teacher), task.source_dictionary, d, "cpu", lenpen=lenpen,
                                       dictionaries=dictionary_files(task.cfg))
    gen = InsertionGenerator(d, eos_penalties=BETAS, rerank_weight=weight, lenpen=lenpen,
                             src_dict=task.source_dictionary, rerank=scorer)
    hypos = gen.generate([model], sample)
    sequence_scorer = SequenceScorer(d)
    for b, cands in enumerate(hypos):
        assert [h["rerank_score"] for h in cands] == sorted((h["rerank_score"] for h in cands), reverse=True)
        for h in cands:
            prev = torch.cat([h["tokens"].new_tensor([d.eos()]), h["tokens"][:-1]]).unsqueeze(0)  # teacher forcing
            one = {"net_input": {"src_tokens": sample["net_input"]["src_tokens"][b:b + 1],
                                 "src_lengths": sample["net_input"]["src_lengths"][b:b + 1],
                                 "prev_output_tokens": prev},
                   "target": h["tokens"].unsqueeze(0), "id": sample["id"][b:b + 1], "ntokens": len(h["tokens"])}
            [[ref]] = sequence_scorer.generate([scorer.model], one)
            teacher_score = ref["positional_scores"].sum() / len(h["tokens"]) ** lenpen
            [[alone]] = InsertionGenerator(d, eos_penalty=h["eos_penalty"], lenpen=lenpen,
                                           src_dict=task.source_dictionary).generate([model], one)
            assert alone["tokens"].tolist() == h["tokens"].tolist()
            want = teacher_score + weight * alone["score"]
            assert h["rerank_score"] == pytest.approx(float(want), abs=1e-4)


def test_generate_prints_nbest_candidates_and_reranks(setup):
    root, teacher = setup
    ckpt = root / "ckpt" / "checkpoint_last.pt"
    for extra in ((), ("--rerank-with", teacher)):
        proc = run(generate_args(root / "bin", ckpt, "--eos-penalties", "0,1,2", "--nbest", "3", *extra))
        lines = [ln.split("\t")[0] for ln in proc.stdout.splitlines() if ln.startswith("H-")]
        assert sorted(lines) == sorted(f"H-{i}" for i in range(12) for _ in range(3))
    hyps = parse_generate(proc.stdout, "H")
    assert len(hyps) == 12
    proc = run(generate_args(root / "bin", ckpt, "--eos-penalty", "1", "--first-insertions", "3", "--nbest", "3",
                             "--rerank-with", teacher))
    lines = [ln.split("\t")[0] for ln in proc.stdout.splitlines() if ln.startswith("H-")]
    assert sorted(lines) == sorted(f"H-{i}" for i in range(12) for _ in range(3))


def test_rerank_model_with_another_dictionary_is_refused_by_name(setup, tmp_path_factory):
    root, _ = setup
    other = tmp_path_factory.mktemp("other")
    from tests.utils import preprocess, write_reverse_corpus

    write_reverse_corpus(other / "raw", sizes=(("train", 200), ("valid", 16), ("test", 4)), seed=3)
    preprocess(other / "raw", other / "bin")  # the same 24 words, counted in another order
    teacher = train_teacher(other / "bin", other / "teacher", "--share-all-embeddings")
    task, _ = build_task(root / "bin")
    with pytest.raises(ValueError, match=rf"--rerank-with {teacher}: its source dictionary "
                                         rf"{other / 'bin'}/dict.src.txt differs from {root / 'bin'}/dict.src.txt "
                                         r"at line \d+"):
        load_scorer(teacher, task)
    bigger = tmp_path_factory.mktemp("bigger")
    write_reverse_corpus(bigger / "raw", sizes=(("train", 200), ("valid", 16), ("test", 4)), vocab=30)
    preprocess(bigger / "raw", bigger / "bin")
    teacher = train_teacher(bigger / "bin", bigger / "teacher", "--share-all-embeddings")
    n = len(task.source_dictionary)
    with pytest.raises(ValueError, match=rf"--rerank-with {teacher}: encoder.embed_tokens.weight has (?!{n} )\d+ "
                                         rf"rows, but the source dictionary {root / 'bin'}/dict.src.txt gives {n} "
                                         "entries"):
        load_scorer(teacher, task)
    with pytest.raises(ValueError, match=r"--eos-penalties \(eos_penalties=\) takes comma-separated numbers"):
        run_task = build_task(root / "bin", "--eos-penalties", "0,x")[0]
        run_task.build_generator([], type("A", (), {})())


def test_the_hub_keeps_no_generator_nor_reranker_after_translate(setup):
    """fairseq's hub builds a generator (and here the --rerank-with teacher) on every call: none of
    them may outlive its call, however many calls there are."""
    import gc

    from fairseq.models.transformer import TransformerModel

    from fairseq_insertion.hub import from_pretrained

    root, teacher = setup
    hub = from_pretrained(str(root / "ckpt"), "checkpoint_last.pt", str(root / "bin"))
    lines = (root / "raw" / "test.src").read_text().splitlines()[:3]

    def live() -> dict:
        gc.collect()
        objects = gc.get_objects()
        return {"generators": sum(isinstance(o, InsertionGenerator) for o in objects),
                "rerankers": sum(isinstance(o, AutoregressiveScorer) for o in objects),
                "teachers": sum(type(o) is TransformerModel for o in objects)}

    counts = []
    for _ in range(4):
        out = hub.translate(lines, eos_penalties="0,1,2", rerank_with=str(teacher))
        assert len(out) == len(lines)
        counts.append(live())
    assert counts == [{"generators": 0, "rerankers": 0, "teachers": 0}] * 4
