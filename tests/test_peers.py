"""fairseq's other non-autoregressive models as the benchmark measures them: mask-predict (CMLM) and the
Levenshtein Transformer train with fairseq's documented flags through the one command builder, and decode
in this process with fairseq's iterative refinement generator (the harness's ``fairseq`` engine) at a given
number of passes and length candidates, scored by the harness."""

import pytest

from benchmarks import harness as H
from examples.commands import FAIRSEQ_NAT, Size, decoding_args, train_command
from tests.utils import reverse_data, run


@pytest.mark.parametrize("model,iterations,length_beam", [("fairseq_cmlm", 2, 3), ("fairseq_levenshtein", 3, 1)])
def test_peer_trains_and_decodes_every_test_line(tmp_path_factory, model, iterations, length_beam):
    root = reverse_data(tmp_path_factory, model, 200, 8, 10)
    cmd = train_command(root / "bin", root / "ckpt", model, Size(2, 32, 2, 64), updates=3, max_tokens=512)
    assert FAIRSEQ_NAT[model][0] in cmd and FAIRSEQ_NAT[model][1] in cmd
    run(cmd)
    # fairseq runs --iter-decode-max-iter + 1 passes
    system = H.System(model, root / "ckpt" / "checkpoint_last.pt",
                      options={"iter_decode_max_iter": iterations - 1, "iter_decode_with_beam": length_beam})
    engine = H.Fairseq(system, H.Where(root / "bin", root / "work"))
    assert type(engine.model).__module__.startswith("fairseq.models.nat.")
    refs = (root / "raw" / "test.tgt").read_text().splitlines()
    timed = H.rounds({model: engine}, H.Inputs(H.pieces(root / "bin", "test"), refs), 4, 1)[model]
    result = H.scored(timed, refs, None)
    assert result["sentences"] == len(refs) and 0.0 <= result["bleu"] <= 100.0
    # the refinement step each output was final at, counted from 0 (it stops early once the output no longer
    # changes); at most `iterations` batched passes for each of the 3 batches
    assert 0 <= result["mean_iterations"] <= iterations - 1
    assert 3 <= timed.passes <= 3 * iterations
    with pytest.raises(Exception, match="iterations and length_beam must be >= 1"):
        decoding_args(model, iterations=0)
