"""The step and loop graphs: a whole decoding pass, and a batch's whole decode in an ONNX ``Loop``, with
:mod:`fairseq_insertion.loop`'s own functions emitted as nodes (:class:`~fairseq_insertion.graph_ops.GraphOps`)
around the pass."""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import onnx
from torch import nn

from .. import loop as LOOP
from ..config import DecodingConfig
from ..graph_ops import GraphArray, GraphOps
from .graph import ExportError, Graph
from .layers import _pass, _source_inputs


def _state_inputs(xp: GraphOps, dec: nn.Module, close_ended: bool, whole: bool
                  ) -> Tuple[LOOP.Canvases, GraphArray]:
    """Declare the loop state's graph inputs (:func:`~fairseq_insertion.export_format.step_io`): ``canvas`` (A, K)
    int64, ``scores`` (A, K) float, ``lengths``, ``iterations`` (A,) int64, for the whole loop (``whole``)
    ``final_eos`` (A,) float, ``max_len`` (A,) int64, ``eos_penalty`` (A,) float (each row's beta),
    ``max_iterations`` () int64, with close-ended slots ``closed_before`` (A, K) and ``closed_end`` (A,) bool, then
    the source side (:func:`_source_inputs`). Returns the state and ``max_iterations``."""
    canvas = xp.input("canvas", np.int64, ["rows", "width"])  # (A, K)
    scores = xp.input("scores", np.float32, ["rows", "width"])  # (A, K)
    lengths, iterations = (xp.input(name, np.int64, ["rows"]) for name in ("lengths", "iterations"))  # (A,) each
    final_eos = xp.input("final_eos", np.float32, ["rows"]) if whole else None  # (A,)
    max_len = xp.input("max_len", np.int64, ["rows"])  # (A,)
    eos_penalty = xp.input("eos_penalty", np.float32, ["rows"])  # (A,)
    max_iterations = xp.input("max_iterations", np.int64, [])  # ()
    closed_before = xp.input("closed_before", np.bool_, ["rows", "width"]) if close_ended else None  # (A, K)
    closed_end = xp.input("closed_end", np.bool_, ["rows"]) if close_ended else None  # (A,)
    xp.inputs.extend(_source_inputs(dec))
    return LOOP.Canvases(rows=None, tokens=canvas, scores=scores, closed_before=closed_before, closed_end=closed_end,
                         lengths=lengths, iterations=iterations, final_eos=final_eos, max_len=max_len,
                         eos_penalty=eos_penalty), max_iterations


def _step(g: Graph, xp: GraphOps, dec: nn.Module, config: DecodingConfig, termination: str, state: LOOP.Canvases,
          max_iter: GraphArray, active: Optional[GraphArray] = None) -> LOOP.Pass:
    """One decoding pass from ``state`` emitted into ``g``, the loop's own functions through ``xp``: the framing, the
    open slots, their inputs to the slot rule (the repetition rules of ``config``; no given tokens, no shortlist),
    the pass (:func:`_pass`), the slot scores, the step rule (``config.decoding`` with the model's ``termination``),
    the room cap and :func:`~fairseq_insertion.loop.step` with the iteration bound ``max_iter`` (). ``active`` (A,):
    the rows that take part; the others' slots stay shut (they insert nothing and keep their ``final_eos``)."""
    d = dec.dictionary
    bos, eos, pad = d.bos(), d.eos(), d.pad()
    bounds = LOOP.Bounds.build(xp, config, termination, eos, pad)

    def score(framed: GraphArray, open_: GraphArray, inputs: LOOP.SlotInputs) -> Tuple[GraphArray, ...]:
        open_slots = LOOP.flat_indices(xp, open_)  # (N,)
        N = open_slots.shape[0]
        blocked = xp.full((N, 1), pad, like=open_slots) if inputs.blocked is None else inputs.blocked  # (N, M)
        _pass(g, dec, framed.name, open_slots.name, xp.full((N,), 0, like=open_slots).name, blocked.name,
              inputs.eos_penalty[:, None].name, xp.full((N, 1), False, like=open_).name, xp.constant([1]).name)
        tokens, log_probs, eos_log_probs = (GraphArray(xp, name, dtype, [N, 1]).reshape(-1) for name, dtype in (
            ("tokens", np.int64), ("log_probs", np.float32), ("eos_log_probs", np.float32)))  # (N,) each
        A, S = state.tokens.shape[0], state.tokens.shape[1] + 1
        return tokens, log_probs, eos_log_probs, GraphArray(xp, "location", np.float32, [A, S])  # (A, S)

    p = LOOP.predict(xp, state, bounds, config, None, bos, score, active)
    if active is not None:
        p = p._replace(final_eos=xp.where(active, p.final_eos, state.final_eos))
    return LOOP.step(xp, state, p, bounds.rule(p, state.max_len - state.lengths), max_iter, bounds)


def _check_step(config: DecodingConfig) -> None:
    """Refuse the options the step and loop graphs do not apply."""
    if config.unkpen:
        raise ExportError(f"unkpen {config.unkpen}: the exported pass applies no unknown-word penalty; export with "
                          "unkpen 0")


def _step_inputs(model: nn.Module, config: DecodingConfig, name: str, whole: bool
                 ) -> Tuple[Graph, GraphOps, nn.Module, str, bool, LOOP.Canvases, GraphArray]:
    """A step or loop graph's start (the options refused first): the builder ``name``, its GraphOps, the decoder,
    the model's termination, whether slots close at end-of-slot, and the state's inputs (:func:`_state_inputs`)."""
    _check_step(config)
    dec, termination = model.decoder, model.termination
    g = Graph(name)
    xp = GraphOps(g)
    close_ended = LOOP.Bounds.build(xp, config, termination, dec.dictionary.eos(), dec.dictionary.pad()).close_ended
    state, max_iterations = _state_inputs(xp, dec, close_ended, whole)
    return g, xp, dec, termination, close_ended, state, max_iterations


def step_graph(model: nn.Module, config: DecodingConfig) -> "onnx.ModelProto":
    """A whole decoding pass from the active rows' state to the next (``step.onnx``), the loop's own functions
    (:mod:`fairseq_insertion.loop`) emitted as nodes (:class:`~fairseq_insertion.graph_ops.GraphOps`) around
    :func:`pass_graph`'s pass (:func:`_step`), for unconstrained decoding without a shortlist with ``config``'s
    decoding rule and repetition rules.

    Inputs (:func:`_state_inputs`; ``max_iterations``: the loop's iteration bound). Outputs: ``next_canvas``,
    ``next_scores`` (A, K'), ``next_lengths``, ``next_iterations`` (A,), ``final_eos`` (A,), ``keep`` (A,) the rows
    that go on, ``n_keep`` () their number, ``kept_width`` () the longest of their canvases, and with close-ended
    slots ``next_closed_before`` (A, K'), ``next_closed_end`` (A,)."""
    g, xp, dec, termination, close_ended, state, max_iterations = _step_inputs(model, config, "insertion_step",
                                                                               whole=False)
    after = _step(g, xp, dec, config, termination, state, max_iterations)
    new = after.state
    for name, value in (("next_canvas", new.tokens), ("next_scores", new.scores), ("next_lengths", new.lengths),
                        ("next_iterations", new.iterations), ("final_eos", new.final_eos), ("keep", after.keep),
                        ("n_keep", after.n_keep), ("kept_width", after.kept_width)):
        xp.output(name, value)
    if close_ended:
        xp.output("next_closed_before", new.closed_before)
        xp.output("next_closed_end", new.closed_end)
    return g.model(xp.inputs, xp.outputs, vocab_size=len(dec.dictionary))


def loop_graph(model: nn.Module, config: DecodingConfig) -> "onnx.ModelProto":
    """The whole decoding loop of a batch (``loop.onnx``): :func:`step_graph`'s pass as the body of an ONNX ``Loop``
    that runs while some row goes on, at most the iteration bound + 1 times, as
    :func:`fairseq_insertion.loop.run`: the rows that start (:func:`~fairseq_insertion.loop.starting`) take part, a
    row that stops stays in the batch and inserts nothing more.

    Inputs (:func:`_state_inputs` with ``final_eos``; ``max_iterations``: the option, 0 for each batch's room).
    Outputs: every row's final ``next_canvas``, ``next_scores`` (A, K'), ``next_lengths``, ``next_iterations``,
    ``next_final_eos`` (A,), in batch order, and ``passes`` () the passes run."""
    g, xp, dec, termination, close_ended, state, max_iterations = _step_inputs(model, config, "insertion_loop",
                                                                               whole=True)
    start, room = LOOP.starting(xp, state)  # (A,) each
    bound = xp.where(max_iterations > 0, max_iterations, room.max())  # () as run's
    carried = [state.tokens, state.scores, state.lengths, state.iterations, state.final_eos, start, xp.constant(0)]
    if close_ended:
        carried += [state.closed_before, state.closed_end]
    trips, going = bound + 1, start.any()
    mark = g.mark()
    body = GraphOps(g)  # the body's nodes, moved into its graph below; outer values are read by name
    body.input("iteration", np.int64, [])
    body.input("going", np.bool_, [])
    canvas, scores = (body.input(f"body_{name}", dtype, ["rows", "width"]) for name, dtype in (
        ("canvas", np.int64), ("scores", np.float32)))  # (A, K) each
    lengths, iterations = (body.input(f"body_{name}", np.int64, ["rows"]) for name in ("lengths", "iterations"))
    final_eos = body.input("body_final_eos", np.float32, ["rows"])  # (A,)
    active = body.input("body_active", np.bool_, ["rows"])  # (A,)
    passes = body.input("body_passes", np.int64, [])  # ()
    closed_before = body.input("body_closed_before", np.bool_, ["rows", "width"]) if close_ended else None
    closed_end = body.input("body_closed_end", np.bool_, ["rows"]) if close_ended else None
    outer = LOOP.Canvases(rows=None, tokens=canvas, scores=scores, closed_before=closed_before, closed_end=closed_end,
                          lengths=lengths, iterations=iterations, final_eos=final_eos,
                          max_len=GraphArray(body, state.max_len.name, np.int64, [None]),
                          eos_penalty=GraphArray(body, state.eos_penalty.name, np.float32, [None]))
    after = _step(g, body, dec, config, termination, outer, GraphArray(body, bound.name, np.int64, []), active)
    new = after.state
    body.output("body_going_out", after.keep.any())
    for name, value in (("canvas", new.tokens), ("scores", new.scores), ("lengths", new.lengths),
                        ("iterations", new.iterations), ("final_eos", new.final_eos), ("active", after.keep),
                        ("passes", passes + 1), *((("closed_before", new.closed_before), ("closed_end", new.closed_end))
                                                  if close_ended else ())):
        body.output(f"body_{name}_out", value)
    step = g.cut(mark, "insertion_step", body.inputs, body.outputs)  # (iteration, going, carried) -> (going, carried)
    final = g.op("Loop", trips.name, going.name, *(x.name for x in carried), body=step, outputs=len(carried))
    names = ("next_canvas", "next_scores", "next_lengths", "next_iterations", "next_final_eos", None, "passes")
    for name, value, like in zip(names, final, carried):
        if name is not None:
            xp.output(name, GraphArray(xp, value, like.dtype, [None] * like.ndim))
    return g.model(xp.inputs, xp.outputs, vocab_size=len(dec.dictionary))
