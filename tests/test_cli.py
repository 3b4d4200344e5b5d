"""End to end through fairseq's CLIs: preprocess a tiny generated corpus, train a
tiny model for a few updates, generate with both decodings, interactive, and
resume training from the checkpoint."""

import math
import re

import pytest
import torch

from tests.utils import (
    PLUGIN,
    generate_args,
    parse_generate,
    reverse_data,
    run,
    train_args,
)

TEST_LINES = 29  # not a multiple of 8: fairseq would drop the final partial batch


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = reverse_data(tmp_path_factory, "cli", 400, 21, TEST_LINES)
    proc = run(train_args(root / "bin", root / "ckpt", "--order", "binary_tree", "--tau", "1.0",
                          "--termination", "slot", "--label-smoothing", "0.1", "--max-update", "12",
                          "--required-batch-size-multiple", "8"))
    return root, proc


def test_train_logs_loss_nll_and_fill(trained):
    root, proc = trained
    log = proc.stdout + proc.stderr
    assert "replaced fairseq's built-in model 'insertion_transformer'" in log
    m = re.findall(r"\| train \| .*loss ([\d.]+) \| nll_loss ([\d.]+) \| fill ([\d.]+)", log)
    assert m, log[-2000:]
    loss, nll, fill = map(float, m[-1])
    assert math.isfinite(loss) and nll > 0 and 0.3 < fill < 0.7  # k ~ U{0..n}: mean fill about 1/2
    assert (root / "ckpt" / "checkpoint_last.pt").exists()


@pytest.mark.parametrize("decoding", ["parallel", "greedy"])
def test_generate_translates_every_line(trained, decoding):
    root, _ = trained
    proc = run(generate_args(root / "bin", root / "ckpt" / "checkpoint_last.pt", "--decoding", decoding,
                             "--batch-size", "8", "--print-step", "--retain-iter-history", "--eos-penalty", "0.5"))
    hyps = parse_generate(proc.stdout, "H")
    assert sorted(map(int, hyps)) == list(range(TEST_LINES))
    steps = parse_generate(proc.stdout, "I")
    pos = parse_generate(proc.stdout, "P")
    history = [line for line in proc.stdout.splitlines() if line.startswith("E-")]
    for i, (_score, text) in hyps.items():
        n = len(text.split())
        assert len(pos[i][0].split()) == n + 1  # one score per token plus the final end-of-slot
        iters = int(steps[i][0])
        assert iters == sum(1 for h in history if h.startswith(f"E-{i}_"))
        if decoding == "greedy":
            assert iters == n  # one insertion per iteration
        else:
            assert (n > 0) <= iters <= n
    summary = re.search(r"insertion decoding \(" + decoding + r"\): (\d+) sentences, mean iterations ([\d.]+), "
                        r"mean floor\(log2 n\)\+1 ([\d.]+)", proc.stdout + proc.stderr)
    assert summary and int(summary.group(1)) == TEST_LINES


def test_interactive(trained):
    root, _ = trained
    lines = "w1 w2 w3 w4\nw5 w6 w7 w8 w9\nw3 w3 w3 w3\n"
    proc = run(["fairseq-interactive", root / "bin", "--user-dir", PLUGIN, "--task", "insertion_translation",
                "--path", root / "ckpt" / "checkpoint_last.pt", "--decoding", "greedy", "--cpu",
                "--source-lang", "src", "--target-lang", "tgt", "--buffer-size", "2", "--batch-size", "2"],
               input=lines)
    assert sorted(parse_generate(proc.stdout, "H")) == ["0", "1", "2"]


def test_resume_continues_from_checkpoint(trained, tmp_path):
    root, _ = trained
    save = tmp_path / "ckpt"
    save.mkdir()
    (save / "checkpoint_last.pt").write_bytes((root / "ckpt" / "checkpoint_last.pt").read_bytes())
    proc = run(train_args(root / "bin", save, "--order", "binary_tree", "--max-update", "16"))
    log = proc.stdout + proc.stderr
    assert re.search(r"Loaded checkpoint .*\(epoch \d+ @ 12 updates\)", log), log[-3000:]
    assert "num_updates 16" in log


def test_checkpoint_loads_with_the_safe_loader(trained):
    root, _ = trained
    import fairseq_insertion  # noqa: F401  registers the safe globals

    state = torch.load(root / "ckpt" / "checkpoint_last.pt", weights_only=True)
    assert "model" in state and state["cfg"]["model"].arch == "insertion_transformer_tiny"


def test_hub_interface_translates(trained):
    root, _ = trained
    from fairseq_insertion.model import InsertionTransformerModel

    hub = InsertionTransformerModel.from_pretrained(str(root / "ckpt"), checkpoint_file="checkpoint_last.pt",
                                                    data_name_or_path=str(root / "bin"), decoding="greedy")
    out = hub.translate(["w1 w2 w3 w4", "w5 w6"])
    assert len(out) == 2 and all(isinstance(s, str) for s in out)
    assert all(tok in hub.task.target_dictionary.symbols for s in out for tok in s.split())
