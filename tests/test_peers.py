"""fairseq's other non-autoregressive models as the benchmark runs them (``--peers``): mask-predict
(CMLM) and the Levenshtein Transformer train with fairseq's documented flags through the one command
builder, decode with fairseq's iterative refinement at a given number of iterations (and length
candidates), and are read and scored by the one generate-output parser."""

import pytest

from benchmarks import run as B
from examples import steps
from examples.commands import FAIRSEQ_NAT, decoding_args, train_command
from tests.utils import reverse_data, run


def test_peer_systems_decode_as_asked():
    for name, (run_name, decoding, swept) in B.PEER_SYSTEMS.items():
        model = B.ALL_RUNS[run_name][0]
        assert model in FAIRSEQ_NAT and name.endswith("_distilled") and B.on_distilled(run_name) and not swept
        args = decoding_args(model, **decoding)
        i = args.index("--iter-decode-max-iter")
        assert int(args[i + 1]) == decoding["iterations"] - 1  # fairseq runs max-iter + 1 passes
        assert ("--iter-decode-with-beam" in args) == (decoding.get("length_beam", 1) > 1)
    assert {B.ALL_RUNS[r][0] for r, _, _ in B.PEER_SYSTEMS.values()} == {"fairseq_cmlm", "fairseq_levenshtein"}


@pytest.mark.parametrize("model,iterations,length_beam", [("fairseq_cmlm", 2, 3), ("fairseq_levenshtein", 3, 1)])
def test_peer_trains_and_decodes_every_test_line(tmp_path_factory, model, iterations, length_beam):
    root = reverse_data(tmp_path_factory, model, 200, 8, 10)
    cmd = train_command(root / "bin", root / "ckpt", model, B.Size(2, 32, 2, 64), updates=3, max_tokens=512)
    assert FAIRSEQ_NAT[model][0] in cmd and FAIRSEQ_NAT[model][1] in cmd
    run(cmd)
    refs = (root / "raw" / "test.tgt").read_text().splitlines()
    result = steps.decode(root / "bin", root / "ckpt" / "checkpoint_last.pt", tmp_path_factory.mktemp("out") / "t.out",
                          refs, None, model, "test", batch_size=4, iterations=iterations, length_beam=length_beam)
    assert result["sentences"] == len(refs) and 0.0 <= result["bleu"] <= 100.0
    # fairseq's I- lines: the refinement step the output was final at, counted from 0 (it stops early once
    # the output no longer changes)
    assert 0 <= result["mean_iterations"] <= iterations - 1
    with pytest.raises(Exception, match="iterations and length_beam must be >= 1"):
        decoding_args(model, iterations=0)
