"""Classifiers and rankers are gated on their scores, not only their order: a candidate whose probabilities
drift from PyTorch's is refused even when every label and every ranking is intact, so a user who thresholds
`score > 0.5` gets the answers transformers gives. The gates' flags come from the tasks' declarations."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from container.bundle import read_manifest
from container.optimize import cli as optimize_cli
from container.optimize import validate
from container.optimize.errors import ValidationFailed
from container.optimize.stages import by_accuracy
from hare.cli import main
from tasks.base import Array, ParityInput, TaskSpec
from tasks.registry import TASKS, get_task
from tests.api_helpers import serve
from tests.conftest import ModelFactory, quick_bundle
from tests.tiny_models import make_model

QUICK = ["--tune-lengths", "8", "--tune-batches", "1", "--tune-seconds", "0.02"]


def logit(p: np.ndarray[Any, Any]) -> Array:
    return np.log(p / (1 - p)).astype(np.float32)


def verdicts(task: TaskSpec, reference: list[Array], candidate: list[Array], **kw: Any) -> dict[str, bool]:
    """Each of the task's gates (at its default threshold) on the candidate's metrics."""
    groups = kw.pop("groups", [0] * len(reference))
    metrics = task.parity(ParityInput(reference, candidate, groups, "mean", **kw))
    return {g.metric: g.passes(metrics[g.metric]) for g in task.gates}


# Three texts' label probabilities; the candidates keep every text's top label.
PROBS = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.15, 0.75]])


@pytest.mark.parametrize(("shift", "passes"), [(0.05, False), (0.01, True)])
def test_a_classifier_whose_probabilities_drift_fails_with_every_top_label_intact(shift: float, passes: bool) -> None:
    moved = PROBS + np.array([shift, -shift, 0.0])  # the top label keeps its lead (0.6 -> 0.65, 0.5 -> 0.45 ...)
    assert (moved.argmax(-1) == PROBS.argmax(-1)).all()
    ref = [np.log(p).astype(np.float32) for p in PROBS]
    cand = [np.log(p).astype(np.float32) for p in moved]
    assert verdicts(get_task("text-classification"), ref, cand) == {"top1_agreement": True, "max_score_diff": passes}


def test_a_multi_label_classifiers_scores_are_its_sigmoids() -> None:
    """Every logit raised by the same 0.3: softmax does not move, each label's sigmoid (what a multi-label
    model serves) moves by up to 0.075."""
    task = get_task("text-classification")
    ref = [np.log(p).astype(np.float32) for p in PROBS]
    cand = [r + np.float32(0.3) for r in ref]
    assert verdicts(task, ref, cand)["max_score_diff"]
    assert not verdicts(task, ref, cand, multi_label=True)["max_score_diff"]
    # A one-logit head is scored by its sigmoid whatever problem_type says (softmax of one logit is always 1).
    one = [r[:1] for r in ref]
    assert not verdicts(task, one, [c[:1] for c in cand])["max_score_diff"]


# Two queries, five documents each: relevance probabilities, best first for no reason but readability.
RELEVANCE = np.array([[0.9, 0.7, 0.5, 0.3, 0.1], [0.8, 0.6, 0.45, 0.35, 0.2]])
GROUPS = [g for g in range(2) for _ in range(5)]


@pytest.mark.parametrize(("shift", "passes"), [(0.05, False), (0.01, True)])
def test_a_ranker_whose_probabilities_drift_fails_with_every_ranking_intact(shift: float, passes: bool) -> None:
    task = get_task("text-ranking")
    ref, cand = logit(RELEVANCE.ravel()), logit(RELEVANCE.ravel() + shift)
    # One-logit heads (a cross-encoder, or an LM reranker's graph: logit(yes) - logit(no)).
    one = verdicts(task, [r[None] for r in ref], [c[None] for c in cand], groups=GROUPS)
    assert one == {"spearman_min": True, "max_score_diff": passes}
    # Two-label heads: the score is the last label's softmax probability.
    two = verdicts(task, [np.array([0, r], np.float32) for r in ref], [np.array([1, c + 1], np.float32) for c in cand])
    assert two == {"spearman_min": True, "max_score_diff": passes}


def test_a_ranker_that_scores_every_document_of_a_query_alike_is_refused() -> None:
    """A graph that lost the documents scores each of a query's documents the same: it ranks nothing, so its
    Spearman correlation is 0 (not the 1 of two constant rankings), though its scores stay within
    max_score_diff of PyTorch's close ones."""
    task = get_task("text-ranking")
    ref, cand = logit(np.array([0.50, 0.505, 0.51, 0.515, 0.52])), logit(np.full(5, 0.51))
    assert verdicts(task, [r[None] for r in ref], [c[None] for c in cand]) == {
        "spearman_min": False,
        "max_score_diff": True,
    }


def test_every_gate_has_a_flag_whose_default_is_the_tasks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    optimize_cli.configure(parser)
    flags = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    for _, gate in optimize_cli.declared_gates():
        action = flags[optimize_cli.gate_flag(gate)]
        assert action.default is None and action.help and gate.help in action.help
        assert f"{gate.threshold:g}" in action.help
    assert optimize_cli.gate_flag(TASKS["text-ranking"].gates[1]) == "--max-score-diff"

    seen: dict[str, float] = {}

    def optimize(options: Any, console: Any = None) -> None:
        seen.update(options.thresholds)
        raise SystemExit(0)

    monkeypatch.setattr("container.optimize.pipeline.optimize", optimize)
    # The flags that predate the generated ones still set their metrics; unset gates keep the task's default.
    args = [str(tmp_path), "--task", "text-ranking", "--max-fp32-diff", "1e-3", "--min-spearman", "0.5"]
    with pytest.raises(SystemExit):
        optimize_cli.main(parser.parse_args([*args, "--max-score-diff", "0.1"]))
    assert seen == {"max_abs_diff": 1e-3, "spearman_min": 0.5, "max_score_diff": 0.1}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize("task", ["text-classification", "text-ranking"])
async def test_int8_is_refused_on_its_scores_and_fp32_ships(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str], task: str
) -> None:
    """A tiny random model's int8 scores are 1e-4 to 1e-2 from PyTorch's, its fp32 ones about 1e-7: a 1e-5
    bound refuses every int8 variant on the new gate, with its figures kept, and fp32 ships."""
    out = tmp_path / "bundle"
    args = ["--task", task, "--out", out, "--variants", "fp32,int8,fused-int8", "--max-score-diff", "1e-5"]
    assert main(["optimize", str(tiny_model(task)), *map(str, args), *QUICK]) == 0
    manifest = read_manifest(out)
    variants = {v["name"]: v for v in manifest.variants}
    assert manifest.variant == "fp32" and variants["fp32"]["gates"]["max_score_diff"]["passed"]
    for name in ("int8", "fused-int8"):
        v = variants[name]
        gate = v["gates"]["max_score_diff"]
        assert not v["passed"] and not gate["passed"] and gate["threshold"] == 1e-5
        assert gate["value"] == v["metrics"]["max_score_diff"] > 1e-5
    assert "max_score_diff=" in capsys.readouterr().err  # the table printed at the end
    async with serve(out) as client:
        info = (await client.get("/info")).json()
    served = {v["name"]: v["gates"]["max_score_diff"] for v in info["variants"]}
    assert served == {name: v["gates"]["max_score_diff"] for name, v in variants.items()}


def test_a_multi_label_checkpoint_is_validated_on_sigmoids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """problem_type multi_label_classification reaches the parity function, which then scores by sigmoid."""
    seen: list[bool] = []

    def recorded(*args: Any) -> ParityInput:
        seen.append(ParityInput(*args).multi_label)
        return ParityInput(*args)

    monkeypatch.setattr(validate, "ParityInput", recorded)
    model = make_model(tmp_path / "model", "text-classification", problem_type="multi_label_classification")
    quick_bundle(model, "text-classification", tmp_path / "bundle")
    assert seen == [True]


@pytest.mark.anyio
async def test_a_regression_checkpoint_answers_its_logits_as_transformers_does(tmp_path: Path) -> None:
    """problem_type regression: transformers' pipeline applies no function to the head's logit (its rule puts
    regression first); hare answered the sigmoid of it, as for any one-logit head."""
    from transformers import pipeline

    model = make_model(
        tmp_path / "model", "text-classification", problem_type="regression", num_labels=1, initializer_range=0.5
    )
    assert read_manifest(quick_bundle(model, "text-classification", tmp_path / "bundle")).regression
    texts = ["I like you. I love you", "The weather in Paris is cold today."]
    expected = [r["score"] for r in pipeline("text-classification", model=str(model))(texts)]
    async with serve(tmp_path / "bundle") as client:
        got = (await client.post("/predict", json={"inputs": texts})).json()
        assert np.allclose([answer[0]["score"] for answer in got], expected, atol=1e-4)
        squashed = (
            await client.post("/predict", json={"inputs": texts, "parameters": {"function_to_apply": "sigmoid"}})
        ).json()
        assert np.allclose(
            [answer[0]["score"] for answer in squashed], 1 / (1 + np.exp(-np.array(expected))), atol=1e-4
        )


@pytest.mark.anyio
@pytest.mark.parametrize(
    "config",
    [
        {"problem_type": "multi_label_classification"},
        {"id2label": {0: "relevant"}, "label2id": {"relevant": 0}},  # one logit, no problem_type
    ],
    ids=["multi-label", "one-logit"],
)
async def test_multi_label_and_one_logit_heads_answer_sigmoids_by_default(
    tmp_path: Path, config: dict[str, Any]
) -> None:
    """transformers' default function: sigmoid for a multi-label head and for any one-logit head (softmax would
    answer a one-logit head 1.0 whatever the text, and a multi-label head's scores summing to 1)."""
    from transformers import pipeline

    model = make_model(tmp_path / "model", "text-classification", initializer_range=0.5, **config)
    quick_bundle(model, "text-classification", tmp_path / "bundle")
    texts = ["I like you. I love you", "The weather in Paris is cold today."]
    expected: Any = pipeline("text-classification", model=str(model), top_k=None)(texts)
    async with serve(tmp_path / "bundle") as client:
        got = (await client.post("/predict", json={"inputs": texts, "parameters": {"top_k": None}})).json()
    for ref, answer in zip(expected, got, strict=True):
        assert [r["label"] for r in ref] == [a["label"] for a in answer]
        assert np.allclose([r["score"] for r in ref], [a["score"] for a in answer], atol=1e-4)
        assert all(0 < a["score"] < 1 for a in answer)


@pytest.mark.parametrize(("off", "passes"), [(0.2, False), (0.05, True)])
def test_a_regression_heads_values_are_judged_on_their_own_scale(off: float, passes: bool) -> None:
    """A similarity regressor answering 0-5: 4.2 for 4.0 is a miss a user sees (4% of the range), which the
    sigmoid of the logit, judged before, flattened to 0.003; 0.05 (1%) is within the gate."""
    task = get_task("text-classification")
    ref = [np.array([v], dtype=np.float32) for v in (0.3, 1.5, 2.5, 4.0, 4.8)]
    cand = [(r + np.float32(off) * (r > 3)).astype(np.float32) for r in ref]
    assert verdicts(task, ref, cand, regression=True) == {"top1_agreement": True, "max_score_diff": passes}
    assert verdicts(task, ref, cand)["max_score_diff"]  # the one-logit rule: its sigmoid hides either


@pytest.mark.parametrize(
    ("magnitude", "off", "passes"), [(0.5, 5e-5, True), (0.5, 5e-4, False), (100.0, 5e-3, True), (0.25, 8e-5, True)]
)
def test_the_fp32_gate_is_per_unit_of_the_outputs_magnitude(magnitude: float, off: float, passes: bool) -> None:
    """float32 rounds relative to a value's size: hidden states that run to 100 are as exact at 5e-3 as
    outputs under 1 are at 5e-5; a miss of 5e-4 on small outputs is a different computation. Below 1 the gate
    stays 1e-4 (ONNX Runtime's fused kernels sum in another order whatever the outputs' size): vectors of 0.25
    are not held to 2.5e-5."""
    task = get_task("feature-extraction")
    spread = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8) * np.float32(min(1.0, magnitude))
    ref = [np.full((4, 8), magnitude, dtype=np.float32), spread]
    cand = [r + np.float32(off) for r in ref]
    _, verdicts = validate.judge(task, "fp32", ref, cand, [0, 0], "mean", False, {})
    assert verdicts["max_abs_diff"]["passed"] is passes
    assert verdicts["max_abs_diff"]["threshold"] == pytest.approx(1e-4 * max(1.0, magnitude))


def test_a_tie_in_speed_goes_to_the_most_accurate_variant() -> None:
    """autotune gives a tie to the first of by_accuracy's list: the wider type, then the variant further inside
    the task's first gate (higher agreement, not lower), then the smaller difference from PyTorch."""

    def report(name: str, precision: str, agreement: float, diff: float) -> validate.VariantReport:
        gate = {"value": agreement, "threshold": 0.9, "passed": True}
        return validate.VariantReport(name, precision, {"max_abs_diff": diff}, {"top1_agreement": gate}, True, 1.0)

    reports = [
        report("int8-a", "int8", 0.98, 0.01),
        report("int8-b", "int8", 1.0, 0.05),
        report("int8-c", "int8", 1.0, 0.02),
        report("bf16", "bf16", 0.97, 0.1),
        report("fp32", "fp32", 1.0, 1e-6),
    ]
    assert by_accuracy(reports, get_task("text-classification")) == ["fp32", "bf16", "int8-c", "int8-b", "int8-a"]


def test_the_build_is_refused_only_when_every_fp32_graph_departs_naming_the_closest() -> None:
    """One fp32 graph inside the fp32 gate is the model, and the build goes on with it (a fusion that departs
    only drops that variant); when every one misses, the refusal names the closest and the length it missed at.
    A graph that failed to build was never measured and counts for neither."""

    def fp32(name: str, diff: float, at: float = 128) -> validate.VariantReport:
        gate = {"value": diff, "threshold": 1e-4, "passed": diff <= 1e-4}
        metrics = {"max_abs_diff": diff, validate.WORST_AT: at}
        return validate.VariantReport(name, "fp32", metrics, {"max_abs_diff": gate}, diff <= 1e-4, 1.0)

    broken = validate.VariantReport.failed_build("fused-fp32", "fp32", "the fusion failed")
    validate.refuse_departing_graphs([fp32("fp32", 3e-6), fp32("fused-fp32", 0.2), broken])
    validate.refuse_departing_graphs([broken])  # nothing measured: the variants' own gates decide
    with pytest.raises(ValidationFailed, match="fp32 graph departs from PyTorch") as refused:
        validate.refuse_departing_graphs([fp32("fused-fp32", 0.3, 700), fp32("fp32", 0.02, 513), broken])
    assert "fp32's max |output difference| is 0.02 (gate 0.0001) at 513 tokens" in str(refused.value)


def test_the_gate_sees_each_sample_alone_and_in_a_served_batch_its_rankings_apart() -> None:
    """served_outputs: every sample once alone and once right-padded in the batch the server would form (with
    the pad id, its mask 0), its token rows trimmed to its own length; the second pass's ranking groups are
    new ones, so that a query's documents alone and batched are never one ranking of duplicates."""
    seen: list[dict[str, np.ndarray]] = []

    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        seen.append(feeds)
        return (feeds["input_ids"] * feeds["attention_mask"])[..., None].astype(np.float32)

    feeds = [
        {"input_ids": np.arange(1, n + 1, dtype=np.int64)[None], "attention_mask": np.ones((1, n), np.int64)}
        for n in (3, 5, 4)
    ]
    refs = [np.zeros(1, np.float32)] * 3
    served = validate.served_outputs(run, feeds, 99, refs, [0, 0, 1])
    assert served.groups == [0, 0, 1, 2, 2, 3]
    assert len(served.references) == len(served.outputs) == 6
    for i, n in enumerate((3, 5, 4)):
        expected = np.arange(1, n + 1, dtype=np.float32)[:, None]
        np.testing.assert_array_equal(served.outputs[i], expected)  # alone
        np.testing.assert_array_equal(served.outputs[3 + i], expected)  # batched, trimmed
    batch = seen[-1]
    assert batch["input_ids"].shape == (3, 5)
    np.testing.assert_array_equal(batch["input_ids"][0], [1, 2, 3, 99, 99])
    np.testing.assert_array_equal(batch["attention_mask"][0], [1, 1, 1, 0, 0])
