"""``--init-from-transformer``: warm start from a plain fairseq ``transformer``
checkpoint trained on the same data directory."""

import logging
import re
import shutil
import subprocess
import sys

import pytest
import torch

from tests.utils import (
    REPO,
    build_task,
    generate_args,
    parse_generate,
    preprocess,
    reverse_data,
    run,
    train_args,
    train_once,
    write_reverse_corpus,
)

TINY = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
        "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256", "--encoder-attention-heads", "4",
        "--decoder-attention-heads", "4"]
NEW = ["decoder.slot_proj.weight", "decoder.slot_proj.bias", "decoder.head.location_query"]


def train_teacher(data, save_dir, *extra):
    train_once(["fairseq-train", data, "--task", "translation", "--arch", "transformer", *TINY, "--criterion",
                "label_smoothed_cross_entropy", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "2000",
                "--max-update", "3", "--save-dir", save_dir, "--no-epoch-checkpoints", "--cpu", "--seed", "1", *extra],
               data, save_dir)
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return reverse_data(tmp_path_factory, "warm", 200, 16, 11)


@pytest.fixture(scope="module")
def teacher(data):
    """A transformer trained for 3 updates with --share-all-embeddings."""
    return train_teacher(data / "bin", data / "teacher", "--share-all-embeddings")


def teacher_weights(path):
    import fairseq_insertion  # noqa: F401  registers the safe globals

    return torch.load(path, weights_only=True)["model"]


def build(data, tmp_path, *flags):
    task, args = build_task(data / "bin", "--save-dir", tmp_path / "ckpt", *flags)
    torch.manual_seed(0)
    return task.build_model(args)


def test_encoder_decoder_layers_and_embeddings_come_from_the_teacher(data, teacher, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="fairseq_insertion.checkpoints")
    model = build(data, tmp_path, "--share-all-embeddings", "--init-from-transformer", teacher,
                  "--warm-start-slots", "random")
    cold = build(data, tmp_path, "--share-all-embeddings")
    theirs, own = teacher_weights(teacher), model.state_dict()
    shared = [k for k in own if k in theirs]
    assert any(k.startswith("encoder.layers.") for k in shared) and any(k.startswith("decoder.layers.") for k in shared)
    assert {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"} <= set(
        shared)
    for k in shared:
        assert torch.equal(own[k], theirs[k]), k
    assert sorted(k for k in own if k not in theirs) == sorted(NEW)
    for k in NEW:  # fresh initialisation, the same as without warm start
        assert torch.equal(own[k], cold.state_dict()[k]), k
    assert not torch.equal(own["encoder.layers.0.fc1.weight"], cold.state_dict()["encoder.layers.0.fc1.weight"])
    lines = [r.getMessage() for r in caplog.records if "copied" in r.getMessage()]
    assert len(lines) == 1 and str(teacher) in lines[0]
    assert lines[0].split("freshly initialised: ")[1].split(", ") == [k for k in own if k in NEW]


def test_slots_start_as_the_teachers_next_token_predictor(data, teacher, tmp_path):
    """--warm-start-slots left (the default), before any update: a slot's content scores are the teacher's
    output layer applied to its left neighbour's decoder state, and p(l) is uniform."""
    model = build(data, tmp_path, "--share-all-embeddings", "--init-from-transformer", teacher).eval()
    theirs = teacher_weights(teacher)
    d = model.decoder.dictionary
    g = torch.Generator().manual_seed(3)
    src = torch.randint(d.nspecial, len(d), (3, 7), generator=g)
    canvas = torch.randint(d.nspecial, len(d), (3, 5), generator=g)
    framed = torch.cat([torch.full((3, 1), d.bos()), canvas, torch.full((3, 1), d.eos())], 1)  # (3, 7)
    framed[2, 4:] = torch.tensor([d.eos(), d.pad(), d.pad()])  # a shorter canvas
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=torch.full((3,), 7))
        x, _ = model.decoder.extract_features(framed, enc, full_context_alignment=True)  # (3, 7, C)
        content, location = model.decoder(framed, encoder_out=enc)  # (3, 6, V), (3, 6)
        content_lp, location_lp = model.slot_log_probs((content, location), framed)
    want = x[:, :-1].matmul(theirs["decoder.output_projection.weight"].t())  # (3, 6, V) left neighbour's state
    torch.testing.assert_close(content, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(content_lp, want.log_softmax(-1), atol=1e-5, rtol=1e-5)
    real = framed[:, 1:].ne(d.pad())
    uniform = -real.sum(1, keepdim=True).float().log().expand_as(location_lp)
    torch.testing.assert_close(location_lp[real], uniform[real])
    assert torch.isinf(location_lp[~real]).all()
    # the random start differs
    cold = build(data, tmp_path, "--share-all-embeddings", "--init-from-transformer", teacher,
                 "--warm-start-slots", "random").eval()
    with torch.no_grad():
        other, _ = cold.decoder(framed, encoder_out=cold.encoder(src, src_lengths=torch.full((3,), 7)))
    assert not torch.allclose(other, want, atol=1e-3)


def test_teacher_without_shared_embeddings(data, teacher, tmp_path, caplog):
    """A teacher with three embedding tables (fairseq's default); the insertion model with --share-all-embeddings
    has one. Made from the shared teacher by giving each table its own values (a plain transformer's state dict
    has the same three names, shared or not), to save a second fairseq-train run."""
    import fairseq_insertion  # noqa: F401  registers the safe globals

    state = torch.load(teacher, weights_only=True)
    names = ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"]
    for i, k in enumerate(names):
        state["model"][k] = state["model"][k] + i
    path = tmp_path / "unshared.pt"
    torch.save(state, path)
    caplog.set_level(logging.INFO, logger="fairseq_insertion.checkpoints")
    model = build(data, tmp_path, "--share-all-embeddings", "--init-from-transformer", path)
    assert torch.equal(model.encoder.embed_tokens.weight, state["model"]["encoder.embed_tokens.weight"])
    assert model.decoder.output_projection.weight is model.encoder.embed_tokens.weight
    assert torch.equal(model.decoder.layers[1].fc2.weight, state["model"]["decoder.layers.1.fc2.weight"])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"{', '.join(names)} are one tensor in the insertion model but differ in the teacher; initialised "
               "from the teacher's encoder.embed_tokens.weight" in w for w in warnings), warnings


def test_mismatched_sizes_are_listed(data, teacher, tmp_path):
    with pytest.raises(ValueError) as e:
        build(data, tmp_path, "--share-all-embeddings", "--init-from-transformer", teacher,
              "--decoder-ffn-embed-dim", "128")
    msg = str(e.value)
    for layer in (0, 1):
        assert f"decoder.layers.{layer}.fc1.weight: teacher (256, 64), insertion model (128, 64)" in msg
        assert f"decoder.layers.{layer}.fc1.bias: teacher (256,), insertion model (128,)" in msg
        assert f"decoder.layers.{layer}.fc2.weight: teacher (64, 256), insertion model (64, 128)" in msg
    assert "6 tensor(s) differ in shape" in msg and "encoder.layers" not in msg


def test_other_dictionary_is_refused_naming_the_embeddings(data, teacher, tmp_path):
    write_reverse_corpus(tmp_path / "raw", sizes=(("train", 50), ("valid", 4), ("test", 4)), vocab=30)
    preprocess(tmp_path / "raw", tmp_path / "bin")
    task, args = build_task(tmp_path / "bin", "--save-dir", tmp_path / "ckpt", "--share-all-embeddings",
                            "--init-from-transformer", teacher)
    with pytest.raises(ValueError, match=rf"--init-from-transformer {teacher}: encoder.embed_tokens.weight has "
                                         rf"\d+ rows, but the source dictionary {tmp_path}/bin/dict.src.txt gives "
                                         r"\d+ entries"):
        task.build_model(args)


def test_missing_or_wrong_file_is_refused(data, teacher, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"--init-from-transformer {tmp_path}/nope.pt: no such file"):
        build(data, tmp_path, "--init-from-transformer", tmp_path / "nope.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="junk.pt: cannot be read as a fairseq checkpoint"):
        build(data, tmp_path, "--init-from-transformer", tmp_path / "junk.pt")
    with pytest.raises(ValueError, match="and --finetune-from-model .* both set the initial weights"):
        build(data, tmp_path, "--init-from-transformer", teacher, "--finetune-from-model", teacher)


def test_trained_checkpoint_needs_no_teacher_and_resume_does_not_reapply(data, teacher, tmp_path):
    """Warm-started training (with 2 canvases per sentence), then generate, hub, the closure heads' training and
    resume with the teacher gone."""
    own_teacher = tmp_path / "teacher.pt"
    shutil.copy(teacher, own_teacher)
    save = tmp_path / "ckpt"
    cmd = train_args(data / "bin", save, "--init-from-transformer", own_teacher, "--canvases-per-sentence", "2",
                     "--no-epoch-checkpoints")
    log = (lambda p: p.stdout + p.stderr)(run([*cmd, "--max-update", "4"]))
    assert re.search(rf"--init-from-transformer {own_teacher}: copied \d+ tensors .*at the left neighbour.*: "
                     r"decoder.slot_proj.weight, decoder.slot_proj.bias, decoder.head.location_query", log), log[-3000:]
    assert "num_updates 4" in log
    own_teacher.unlink()

    proc = run(generate_args(data / "bin", save / "checkpoint_last.pt", "--batch-size", "4"))
    assert sorted(map(int, parse_generate(proc.stdout))) == list(range(11))

    from fairseq_insertion.model import InsertionTransformerModel

    hub = InsertionTransformerModel.from_pretrained(str(save), checkpoint_file="checkpoint_last.pt",
                                                    data_name_or_path=str(data / "bin"))
    assert len(hub.translate(["w1 w2 w3", "w4 w5"])) == 2
    closure = subprocess.run(
        [sys.executable, "-m", "examples.train_closure", "--path", str(save / "checkpoint_last.pt"), "--data",
         str(data / "bin"), "--out", str(tmp_path / "heads.pt"), "--eos-penalty", "0.5", "--sentences", "20",
         "--threshold", "0.6", "--no-lookahead", "--post-process", "none"], cwd=REPO, capture_output=True, text=True)
    assert closure.returncode in (0, 3) and "slots of 20 sentences" in closure.stderr, closure.stderr[-3000:]

    log = (lambda p: p.stdout + p.stderr)(run([*cmd, "--max-update", "6"]))
    assert f"--init-from-transformer {own_teacher} not applied: resuming from {save}/checkpoint_last.pt" in log
    assert re.search(r"Loaded checkpoint .*\(epoch \d+ @ 4 updates\)", log) and "num_updates 6" in log

    # an insertion checkpoint is not a transformer checkpoint
    with pytest.raises(ValueError, match=r"trained with --arch insertion_transformer_tiny \(model "
                                         r"'insertion_transformer'\), not fairseq's autoregressive transformer"):
        build(data, tmp_path, "--init-from-transformer", save / "checkpoint_last.pt", "--save-dir", tmp_path / "new")
