"""Learning test through the real CLIs: a tiny Insertion Transformer learns to
reverse random strings of distinct tokens (length 4-20) and decodes them in
parallel in about floor(log2 n) + 1 iterations."""

import statistics

import pytest

from fairseq_insertion.canvas import log2_bound
from tests.utils import generate_args, parse_generate, preprocess, run, train_args, write_reverse_corpus

UPDATES = 1200
VARIANTS = {
    "factorized": [],
    "joint+context_bias+mos2": ["--content-location", "joint", "--context-bias", "--mixture-components", "2"],
}


# each variant is minutes of training: its own work unit, so that the two run on both workers
@pytest.mark.heavy
@pytest.mark.parametrize("variant", [pytest.param(v, marks=pytest.mark.xdist_group(f"learning-{v}"))
                                     for v in sorted(VARIANTS)])
def test_tiny_model_learns_to_reverse(tmp_path, variant, record_property):
    write_reverse_corpus(tmp_path / "raw", sizes=(("train", 20000), ("valid", 64), ("test", 200)))
    preprocess(tmp_path / "raw", tmp_path / "bin")
    run(train_args(tmp_path / "bin", tmp_path / "ckpt", "--order", "binary_tree", "--tau", "1.0",
                   "--termination", "slot", "--max-update", str(UPDATES), "--lr", "2e-3", "--warmup-updates", "200",
                   "--max-tokens", "4096", "--disable-validation", "--no-epoch-checkpoints", "--log-interval", "100",
                   *VARIANTS[variant]),
        timeout=900)
    proc = run(generate_args(tmp_path / "bin", tmp_path / "ckpt" / "checkpoint_last.pt", "--decoding", "parallel",
                             "--batch-size", "64", "--print-step"))
    hyps, refs = parse_generate(proc.stdout, "H"), parse_generate(proc.stdout, "T")
    steps = parse_generate(proc.stdout, "I")
    assert len(hyps) == len(refs) == 200
    exact = sum(hyps[i][1] == refs[i][0] for i in refs) / len(refs)
    mean_iters = statistics.mean(int(steps[i][0]) for i in hyps)
    mean_bound = statistics.mean(log2_bound(len(hyps[i][1].split())) for i in hyps)
    record_property("exact_match", f"{exact:.3f}")
    record_property("mean_iterations", f"{mean_iters:.2f}")
    record_property("mean_log2_bound", f"{mean_bound:.2f}")
    assert exact >= 0.9, f"exact match {exact:.3f}"
    assert mean_iters <= mean_bound + 1.0, (mean_iters, mean_bound)
