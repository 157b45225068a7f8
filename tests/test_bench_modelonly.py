"""The model-only figure: the bundle's session in process, one stream or several side by side."""

from __future__ import annotations

from pathlib import Path

from bench import modelonly
from bench.inputs import TextMaker, load_tokenizer
from bench.runner import Grid, RunOptions, plan
from bench.subjects import Subject
from container.machine import physical_cores
from tests.conftest import ModelFactory


def test_streams_side_by_side_each_record_their_calls(tiny_bundle: ModelFactory) -> None:
    bundle = tiny_bundle("text-classification")
    maker = TextMaker(load_tokenizer(bundle))
    one = modelonly.measure(bundle, maker, 8, 1, 1, warmup_s=0.05, duration_s=0.3)
    two = modelonly.measure(bundle, maker, 8, 1, 1, warmup_s=0.05, duration_s=0.3, streams=2)
    for streams, result in ((1, one), (2, two)):
        assert result.latencies_ms and min(result.latencies_ms) > 0 and result.cpu_s > 0
        # Every stream runs until the deadline (so the window holds at least the duration asked), and every
        # recorded call lies inside the window: however slow a loaded machine makes each call.
        assert result.window_s >= 0.3
        assert sum(result.latencies_ms) <= result.window_s * 1000 * streams + 1
        # Every stream calls back to back from the window's start to past its deadline, so the streams' call
        # times cover the duration asked once each, however slow each call: all but the call in flight at
        # the start, and the microseconds between calls. A stream that idles, or never runs, leaves its share.
        covered = sum(result.latencies_ms) / (streams * (300 - max(result.latencies_ms)))
        assert covered > 0.95, (streams, covered)


def test_model_only_is_planned_alone_and_with_as_many_streams_as_users_keep_busy(tmp_path: Path) -> None:
    subject = Subject("text-classification", bundle=tmp_path)
    options = RunOptions(subject=subject, grid=Grid(seq_lens=[8], concurrencies=[1, 16]))
    streams = sorted(p.concurrency for p in plan(options) if p.target == "model-only")
    assert streams == sorted({1, min(16, physical_cores())})


def test_a_mix_of_lengths_runs_in_process_for_ranking_too(tiny_bundle: ModelFactory) -> None:
    bundle = tiny_bundle("text-ranking")
    result = modelonly.measure(bundle, TextMaker(load_tokenizer(bundle)), "mix", 2, 1, warmup_s=0.05, duration_s=0.2)
    assert result.latencies_ms and result.window_s >= 0.2
