"""Bad and hostile input on every interface: one output per input in input order (hub and
fairseq-interactive, any batch and buffer size, over-long, empty, unknown-word-only lines, with
and without constraints), nonsense decoding options refused naming the option, unsafe archives
and files that are not checkpoints refused naming them, invalid UTF-8 in input files read as
unknown words. Two property tests (hypothesis) share one tiny trained model."""

import io
import json
import logging
import math
import os
import subprocess
import sys
import tarfile

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fairseq_insertion.config import DecodingError
from tests.utils import PLUGIN, REPO, build_task, parse_generate, run, trained_reverse_model

pytestmark = pytest.mark.heavy  # dozens of fairseq CLI runs: minutes

LIMIT = 30  # --max-source-positions of every decode here
LONG = " ".join(f"w{i % 24}" for i in range(40))  # 41 tokens with eos: over LIMIT
WORDS = [f"w{i}" for i in range(24)]
PROPERTY = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
# each example runs fairseq-interactive (seconds): few, and no shrinking
CLI_PROPERTY = settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck),
                        phases=(Phase.explicit, Phase.reuse, Phase.generate))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root, _, _ = trained_reverse_model(tmp_path_factory, "hostile", 4, updates=100)
    return root


@pytest.fixture(scope="module")
def hub(trained):
    from fairseq_insertion.hub import from_pretrained

    return from_pretrained(str(trained / "ckpt"), "checkpoint_last.pt", str(trained / "bin"),
                           max_source_positions=LIMIT)


def interactive(trained, lines, *flags, input_file=None):
    """fairseq-interactive on ``lines`` (standard input, or ``input_file``): {output number: hypothesis}
    in output order, and the log."""
    cmd = ["fairseq-interactive", trained / "bin", "--user-dir", PLUGIN, "--task", "insertion_translation",
           "--path", trained / "ckpt" / "checkpoint_last.pt", "--cpu", "--source-lang", "src",
           "--target-lang", "tgt", "--max-source-positions", LIMIT, *flags]
    if input_file is not None:
        proc = run([*cmd, "--input", input_file])
    else:
        proc = run(cmd, input="\n".join(lines) + "\n")
    hyps = [line.split("\t")[2] if line.count("\t") >= 2 else "" for line in proc.stdout.splitlines()
            if line.startswith("H-")]
    return hyps, proc.stdout + proc.stderr


# ---------------------------------------------------------------- one output per input, in order
sentences = st.one_of(
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=8, unique=True).map(" ".join),
    st.just(""), st.just(LONG), st.just("zz1 zz2"))
constraint_lists = st.lists(st.sampled_from(WORDS), max_size=2)


@PROPERTY
@given(lines=st.lists(sentences, min_size=1, max_size=7),
       constraints=st.one_of(st.none(), st.lists(constraint_lists, min_size=7, max_size=7)),
       batch=st.sampled_from([1, 2, 5]))
def test_hub_gives_one_result_per_input_each_as_if_alone(hub, lines, constraints, batch):
    cs = constraints[:len(lines)] if constraints is not None else None
    hub.cfg.dataset.batch_size = batch
    together = hub.translate(lines, constraints=cs)
    hub.cfg.dataset.batch_size = 1
    alone = [hub.translate(x, constraints=cs[i] if cs is not None else None) for i, x in enumerate(lines)]
    assert together == alone
    assert all(out == "" for x, out in zip(lines, together) if x == LONG)


@CLI_PROPERTY
@given(lines=st.lists(sentences, min_size=2, max_size=6), buffer=st.sampled_from([1, 3, 8]),
       batch=st.sampled_from([1, 2, 8]), constrained=st.booleans())
def test_interactive_gives_one_output_per_line_each_as_if_alone(trained, hub, lines, buffer, batch, constrained):
    constraints = [[WORDS[(i * 7) % 24]] if constrained and i % 2 else [] for i in range(len(lines))]
    text = [x + "".join("\t" + c for c in cs) for x, cs in zip(lines, constraints)]  # "\tw7": only constraints
    flags = ("--buffer-size", buffer, "--batch-size", min(batch, buffer),  # fairseq: batch <= buffer
             *(("--constraints", "ordered") if constrained else ()))
    hyps, log = interactive(trained, text, *flags)
    hub.cfg.dataset.batch_size = 1
    alone = [hub.translate(x, constraints=cs) for x, cs in zip(lines, constraints)]
    assert hyps == alone, log[-3000:]


def test_over_long_lines_are_named_by_input_line(trained, hub, caplog):
    hyps, log = interactive(trained, ["w1 w2", "w3", "w4 w5", LONG, "w6"], "--buffer-size", 2)
    assert len(hyps) == 5 and hyps[3] == ""
    assert "input line 4 ('w0 w1 w2 w3 w4 w5' ...): 41 source tokens exceed" in log
    with caplog.at_level(logging.WARNING):
        assert hub.translate(LONG) == ""
        results = hub.generate([hub.encode(x) for x in ["w1 w2", LONG, "w3"]], beam=1)
    assert len(results) == 3 and results[1][0]["tokens"].tolist() == [hub.tgt_dict.eos()]
    assert "sentence 0 ('w0 w1 w2 w3 w4 w5' ...): 41 source tokens exceed" in caplog.text
    # a model whose limit is below the task's: fairseq's batching skips the line, the hub keeps its place
    task_limit = hub.task.cfg.max_source_positions
    hub.task.cfg.max_source_positions = 1000
    try:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert hub.translate(["w1 w2", LONG, "w3"]) == [hub.translate("w1 w2"), "", hub.translate("w3")]
            assert hub.generate([hub.encode(LONG)], beam=1) == [[]]
        assert "input 1: 41 tokens, too long for the model" in caplog.text
    finally:
        hub.task.cfg.max_source_positions = task_limit


# ---------------------------------------------------------------- nonsense decoding options
NUMERIC = {  # option: (hub keyword, command-line flag)
    "eos_penalty": "--eos-penalty", "max_len_a": "--max-len-a", "max_len_b": "--max-len-b",
    "max_iterations": "--max-iterations", "no_repeat_ngram_size": "--no-repeat-ngram-size",
    "lenpen": "--lenpen", "eos_penalties": "--eos-penalties",
}
values = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 1.0, 2.5, 3.0, 1e9]),
                   st.floats(allow_nan=True, allow_infinity=True, width=32))


def _valid(name, value):
    """Whether ``value`` means something for the option ``name`` (what the tests expect to be decoded)."""
    if not math.isfinite(value):
        return False
    if name in ("max_len_b", "max_iterations", "no_repeat_ngram_size"):
        return value >= 0 and value == int(value) and (name != "no_repeat_ngram_size" or value != 1)
    return value >= 0 if name == "max_len_a" else True


@PROPERTY
@given(name=st.sampled_from(sorted(NUMERIC)), value=values)
def test_every_numeric_option_through_the_hub_decodes_or_is_refused(hub, name, value):
    keyword = f"{value!r},1" if name == "eos_penalties" else value
    hub.cfg.dataset.batch_size = 2
    lines = ["w1 w2 w3", "w4 w5"]
    if not _valid(name, value):
        with pytest.raises(DecodingError, match=NUMERIC[name]):
            hub.translate(lines, **{name: keyword})
        return
    out = hub.translate(lines, **{name: keyword})
    assert len(out) == 2
    limit = (2.0 if name != "max_len_a" else value) * 3 + (10 if name != "max_len_b" else value)
    if name in ("eos_penalty", "eos_penalties") and value >= 3 and limit >= 1:
        assert all(out)  # end-of-slot penalised: never empty (NaN used to empty every line silently)


@CLI_PROPERTY
@given(name=st.sampled_from(sorted(NUMERIC)), value=st.sampled_from([math.nan, math.inf, -1.0, 3.0]))
def test_every_numeric_option_on_the_command_line_decodes_or_is_named(trained, name, value):
    integral = math.isfinite(value) and value == int(value)
    text = f"{value!r},1" if name == "eos_penalties" else str(int(value)) if integral else repr(value)
    cmd = ["fairseq-interactive", trained / "bin", "--user-dir", PLUGIN, "--task", "insertion_translation",
           "--path", trained / "ckpt" / "checkpoint_last.pt", "--cpu", "--source-lang", "src", "--target-lang",
           "tgt", f"{NUMERIC[name]}={text}"]
    proc = run(cmd, input="w1 w2 w3\nw4 w5\n", check=False)
    if _valid(name, value):
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert sum(line.startswith("H-") for line in proc.stdout.splitlines()) == 2
    else:
        flag = NUMERIC[name]  # refused by DecodingConfig, or by fairseq's parser (an integer option): one line
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert last.startswith((f"fairseq-interactive: error: {flag} ", f"fairseq-interactive: error: argument "
                                f"{flag}: invalid")) and text.split(",")[0] in last, last
        assert "H-" not in proc.stdout


# ---------------------------------------------------------------- fairseq's generation options
def _cli(trained, command, *flags, stdin="w1 w2 w3\nw4 w5\n"):
    """fairseq-generate (the test set, 4 lines) or fairseq-interactive (``stdin``), with ``flags``."""
    cmd = [command, trained / "bin", "--user-dir", PLUGIN, "--task", "insertion_translation", "--path",
           trained / "ckpt" / "checkpoint_last.pt", "--cpu", "--source-lang", "src", "--target-lang", "tgt",
           "--batch-size", 2, *flags]
    if command == "fairseq-interactive":
        return run([*cmd, "--buffer-size", 2], input=stdin, check=False)
    return run(cmd, check=False)


def _refused_in_one_line(proc, command, message):
    errors = [line for line in proc.stderr.splitlines() if ": error:" in line]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors == [f"{command}: error: {message}"] == proc.stderr.strip().splitlines()[-1:], errors
    assert "H-" not in proc.stdout


@pytest.mark.parametrize("command", ["fairseq-generate", "fairseq-interactive"])
def test_a_refused_option_ends_the_command_in_one_line(trained, command):
    """argparse's way: `prog: error: ...` naming the option and the value, status 2, no traceback; for
    fairseq's generation options (before the model is loaded), those that need what insertion decoding
    does not give (--print-alignment, after the model is loaded) and fairseq's own checks of its options
    (--sampling); the plugin's own (--eos-penalty nan, ...): the property test above."""
    alone = {"fairseq-generate": (["--print-alignment"], "--print-alignment needs attention alignments, which "
                                                          "insertion decoding does not have; got 'hard'"),
             "fairseq-interactive": (["--sampling"], "--sampling requires --nbest to be equal to --beam")}  # fairseq's
    for flags, message in [(["--max-len-b=-5"], "--max-len-b must be an integer >= 0, got -5"),
                           (["--nbest", 0], "--nbest must be an integer >= 1, got 0"), alone[command]]:
        _refused_in_one_line(_cli(trained, command, *flags), command, message)


def test_generation_options_are_honoured_or_named_as_ignored(trained, hub, caplog):
    """--nbest prints up to its number of candidates (one per EOS penalty), saying when there are fewer;
    --beam (other than 1 and fairseq's 5), --sampling and friends are named as ignored."""
    ignored = ("insertion decoding does not read --beam 2 (insertion decoding: --eos-penalties), --sampling, "
               "--temperature 0.5: ignored")
    proc = _cli(trained, "fairseq-generate", "--nbest", 2, "--beam", 2, "--sampling", "--temperature", 0.5)
    h = [line for line in proc.stdout.splitlines() if line.startswith("H-")]
    assert proc.returncode == 0 and len(h) == len(parse_generate(proc.stdout)) == 4, proc.stderr[-2000:]  # 1 each
    assert ignored in proc.stderr
    assert "--nbest 2: insertion decoding gives one hypothesis per EOS penalty, 1 here" in proc.stderr
    proc = _cli(trained, "fairseq-interactive", "--nbest", 2, "--beam", 2, "--sampling", "--temperature", 0.5,
                "--eos-penalties", "0,2")
    assert proc.returncode == 0 and sum(line.startswith("H-") for line in proc.stdout.splitlines()) == 4
    assert ignored in proc.stderr and "--nbest 2:" not in proc.stderr
    hub.cfg.dataset.batch_size = 2
    for keywords, message in [({"max_len_b": -5}, "--max-len-b (max_len_b=) must be an integer >= 0, got -5"),
                              ({"nbest": 0}, "--nbest (nbest=) must be an integer >= 1, got 0")]:
        with pytest.raises(DecodingError) as refused:
            hub.translate(["w1 w2", "w3"], **keywords)
        assert str(refused.value) == message
    with pytest.raises(DecodingError, match=r"--score-reference \(score_reference=\) needs a model that scores"):
        hub.score("w1 w2")
    with caplog.at_level(logging.WARNING, logger="fairseq_insertion.task"):
        assert hub.translate("w1 w2", sampling=True, sampling_topk=3) == hub.translate("w1 w2")
    assert "insertion decoding does not read --sampling, --sampling-topk 3: ignored" in caplog.text
    assert len(hub.generate(hub.encode("w1 w2"), beam=1, eos_penalties="0,1,2")) == 3


def test_only_option_errors_end_a_command_line_in_one_line(tmp_path):
    """The hook is installed in fairseq's command-line processes only; any other exception (an assertion
    outside fairseq's option checks too) keeps its traceback and status 1."""
    script = tmp_path / "fairseq-generate"
    script.write_text("import sys\n"
                      "from fairseq_insertion.config import DecodingError\n"
                      "from fairseq_insertion.fairseq_fixes import exit_on_option_errors\n"
                      "assert exit_on_option_errors((DecodingError,), DecodingError.command_line) == "
                      "(sys.argv[0].endswith('fairseq-generate'))\n"
                      "raise eval(sys.argv[1])\n")
    other = tmp_path / "translate.py"
    other.write_text(script.read_text())
    refused = "DecodingError('--nbest (nbest=) must be an integer >= 1, got 0')"
    proc = run([sys.executable, script, refused], check=False)
    _refused_in_one_line(proc, "fairseq-generate", "--nbest must be an integer >= 1, got 0")
    proc = run([sys.executable, script, "AssertionError('a genuine failure')"], check=False)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "AssertionError: a genuine failure" in proc.stderr
    proc = run([sys.executable, other, refused], check=False)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "DecodingError: --nbest (nbest=)" in proc.stderr


# ---------------------------------------------------------------- constraints
def test_unordered_constraints_over_the_length_limit_at_batch_1_and_n(trained):
    lines = ["w1 w2\t" + " ".join(["w5"] * 9), "w3 w4\tw4", "w6\t" + " ".join(["w7"] * 9)]
    for batch in (1, 3):
        hyps, log = interactive(trained, lines, "--constraints", "unordered", "--max-len-b", 8,
                                "--batch-size", batch, "--buffer-size", 3)
        assert len(hyps) == 3 and hyps[0] == hyps[2] == "" and "w4" in hyps[1].split(), log[-2000:]
        assert "source line 'w1 w2': its constraints hold 9 tokens, over the length limit" in log


def test_special_symbols_are_refused_as_constraints(trained, hub):
    for symbol in ("</s>", "<s>", "<pad>"):
        with pytest.raises(ValueError, match=f"sentence 1 .*constraint 'w1 {symbol}' holds the special symbol"):
            hub.translate(["w1", "w2"], constraints=[[], [f"w1 {symbol}"]])
    proc = run(["fairseq-interactive", trained / "bin", "--user-dir", PLUGIN, "--task", "insertion_translation",
                "--path", trained / "ckpt" / "checkpoint_last.pt", "--cpu", "--constraints", "ordered"],
               input="w1 w2\tw3 </s>\n", check=False)
    assert proc.returncode != 0 and "constraint 'w3 </s>' holds the special symbol(s) </s>" in proc.stderr


def _holds(hypothesis: str, constraint: str) -> bool:
    words, c = hypothesis.split(), constraint.split()
    return any(words[i:i + len(c)] == c for i in range(len(words)))


def test_empty_source_with_constraints_and_unknown_constraint_words_are_named(trained, hub, tmp_path):
    """A line of constraints only (an empty source) is decoded from a canvas holding them, through the
    encoder with an empty source: its output holds them, on every interface."""
    path = tmp_path / "in.txt"
    path.write_text("w1 w2\tw3\n\tw5 w6\nw7\tzz9\n")
    hyps, log = interactive(trained, None, "--constraints", "ordered", input_file=path)
    assert len(hyps) == 3 and _holds(hyps[1], "w5 w6") and "w3" in hyps[0].split()
    assert f"--input {path} line 2: an empty source with constraints ('w5 w6'): decoded from them" in log
    assert "source line '': empty source line; decoded from its constraints" in log
    assert "source line 'w7': its constraints hold 1 word(s) not in the target dictionary" in log
    # the same lines on standard input, and in the hub
    again, log = interactive(trained, ["w1 w2\tw3", "\tw5 w6", "w7\tzz9"], "--constraints", "ordered")
    assert again == hyps
    assert "standard input line 2: an empty source with constraints ('w5 w6'): decoded from them" in log
    hub.cfg.dataset.batch_size = 2
    assert hub.translate(["w1 w2", "", "w7"], constraints=[["w3"], ["w5 w6"], ["zz9"]]) == hyps
    # fairseq-generate: an empty test sentence with a --constraints-file line
    raw = tmp_path / "raw"
    raw.mkdir()
    for side in ("src", "tgt"):
        (raw / f"test.{side}").write_text("w1 w2\n\nw7\n")
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--testpref", raw / "test",
         "--destdir", tmp_path / "bin", "--srcdict", trained / "bin" / "dict.src.txt", "--tgtdict",
         trained / "bin" / "dict.tgt.txt", "--workers", "1"])
    (tmp_path / "constraints.txt").write_text("w3\nw5 w6\nzz9\n")
    proc = run(["fairseq-generate", tmp_path / "bin", "--user-dir", PLUGIN, "--task", "insertion_translation",
                "--path", trained / "ckpt" / "checkpoint_last.pt", "--cpu", "--batch-size", 2,
                "--constraints-file", tmp_path / "constraints.txt"])
    assert {k: v[1] for k, v in parse_generate(proc.stdout).items()} == dict(zip("012", hyps))


# ---------------------------------------------------------------- invalid UTF-8 in input files
def test_invalid_utf8_in_input_files_is_an_unknown_word(trained, tmp_path, caplog):
    path = tmp_path / "in.txt"
    path.write_bytes(b"w1 w2\nw3 \xff w4\nw5\n")
    hyps, log = interactive(trained, None, "--eos-penalty", 4, input_file=path)
    assert len(hyps) == 3 and all(hyps)  # end-of-slot penalised: every line says something
    assert f"--input {path} line 2: invalid UTF-8" in log
    assert "source line 'w3 <unk> w4': 1 unknown source word(s)" in log
    assert path.read_bytes() == b"w1 w2\nw3 \xff w4\nw5\n"  # the user's file as it was

    from fairseq_insertion.constraints import ConstraintsFile
    cfile = tmp_path / "constraints.txt"
    cfile.write_bytes("w1 \ufffd\n".encode() + b"w2 \xfe\n")  # line 1: a real U+FFFD, line 2: an invalid byte
    with caplog.at_level(logging.WARNING):
        assert ConstraintsFile(str(cfile)).lines == [["w1 \ufffd"], ["w2 \ufffd"]]
    assert f"--constraints-file {cfile} line 2: invalid UTF-8" in caplog.text and "line 1" not in caplog.text


def test_score_script_names_bad_files_and_writes_json_through_a_closed_pipe(tmp_path):
    gen, ref = tmp_path / "gen.out", tmp_path / "ref.txt"
    gen.write_text("S-0\tw1 w2\nH-0\t-0.5\tw2 w1\nD-0\t-0.5\tw2 w1\nP-0\t-0.1 -0.2 -0.2\n")
    ref.write_bytes(b"w2 \xff w1\n")
    score = [sys.executable, REPO / "examples" / "multi30k" / "score.py", "--generate-output", gen,
             "--reference", ref, "--lang", "de", "--json", tmp_path / "s.json"]
    proc = run(score)
    assert f"--reference {ref} line 1: invalid UTF-8" in proc.stderr and "sentences: 1" in proc.stdout
    ref.write_text("w2 w1\n")
    piped = subprocess.Popen([str(c) for c in score], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=dict(os.environ, PYTHONUNBUFFERED="1"))  # each print reaches the pipe at once
    piped.stdout.close()  # as `score.py ... | head -0`
    assert piped.wait(timeout=120) == 0 and b"BrokenPipeError" not in piped.stderr.read()
    assert json.loads((tmp_path / "s.json").read_text())["sentences"] == 1


# ---------------------------------------------------------------- archives and checkpoints
def _tar(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_archives_extract_safely_and_stay_as_they_were(trained, tmp_path):
    from fairseq_insertion.hub import from_pretrained

    ckpt = (trained / "ckpt" / "checkpoint_last.pt").read_bytes()
    dicts = [(f"model/dict.{s}.txt", (trained / "bin" / f"dict.{s}.txt").read_bytes(), "file") for s in ("src", "tgt")]
    good = tmp_path / "model.tar.gz"
    _tar(good, [("model/checkpoint_last.pt", ckpt, "file"), *dicts])
    before = good.read_bytes()
    hub = from_pretrained(str(good), "checkpoint_last.pt", ".", source_lang="src", target_lang="tgt")
    assert hub.translate("w1 w2 w3") is not None and good.is_file() and good.read_bytes() == before
    for name, member in (("escape", ("../escape", b"x", "file")), ("link", ("model/evil", "../../outside", "link"))):
        bad = tmp_path / f"{name}.tar.gz"
        _tar(bad, [("model/checkpoint_last.pt", b"", "file"), member])
        with pytest.raises(ValueError, match=f"{bad}: member '{member[0]}' is a"):
            from_pretrained(str(bad), "checkpoint_last.pt", ".")
        assert bad.is_file() and not (tmp_path / "escape").exists()


def test_files_that_are_not_insertion_checkpoints_get_one_clear_error(trained, tmp_path):
    from fairseq_insertion.hub import from_pretrained

    (tmp_path / "checkpoint.pt").write_bytes(bytes(range(256)) * 8)
    with pytest.raises(ValueError, match=f"{tmp_path / 'checkpoint.pt'}: cannot be read as a fairseq checkpoint") \
            as refused:
        from_pretrained(str(tmp_path), "checkpoint.pt", str(trained / "bin"))
    assert "weights_only=False" not in str(refused.value)
    proc = run(["fairseq-generate", trained / "bin", "--user-dir", PLUGIN, "--task", "insertion_translation",
                "--path", tmp_path / "checkpoint.pt", "--cpu", "--batch-size", "2"], check=False)
    assert proc.returncode != 0 and "weights_only" not in proc.stderr
    assert f"--path {tmp_path / 'checkpoint.pt'}: cannot be read as a fairseq checkpoint" in proc.stderr
    proc = run(["fairseq-generate", trained / "bin", "--user-dir", PLUGIN, "--task", "translation", "--path",
                trained / "ckpt" / "checkpoint_last.pt", "--cpu", "--batch-size", "2"], check=False)
    last = proc.stderr.splitlines()[-1]
    assert proc.returncode != 0 and "--task insertion_translation" in last
    assert f"{trained / 'ckpt' / 'checkpoint_last.pt'}: an Insertion Transformer" in last


def test_an_autoregressive_model_says_which_insertion_options_it_ignores(trained, caplog):
    from fairseq.models.transformer import TransformerModel

    task, args = build_task(trained / "bin", "--eos-penalty", 2, "--decoding", "greedy")
    args.arch = "transformer"
    for k, v in dict(encoder_layers=1, decoder_layers=1, encoder_embed_dim=16, decoder_embed_dim=16,
                     encoder_ffn_embed_dim=16, decoder_ffn_embed_dim=16, encoder_attention_heads=2,
                     decoder_attention_heads=2).items():
        setattr(args, k, v)
    model = TransformerModel.build_model(args, task)
    with caplog.at_level(logging.WARNING, logger="fairseq_insertion.task"):
        generator = task.build_generator([model], args)
    assert "--decoding, --eos-penalty apply to insertion models only and are not used" in caplog.text
    assert type(generator).__name__ == "SequenceGenerator"
    assert torch.is_tensor(next(model.parameters()))
