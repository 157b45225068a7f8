"""The Benchmarks page's Run form: the settings of a `hare bench run`, checked before it starts.

The form keeps what the user typed, sent or not, across a run, a cancel and visits to other pages: its widgets
keep their values for the whole session (`persist_state="session"`), and start from the last form sent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import streamlit as st

from admin_ui import state
from admin_ui.benchjob import BASELINES, BenchConfig, bundle_for, in_range, parse_ints, parse_seq_lens

FORM = "hare.bench.form"  # the values of the last form sent in this session (the slot keeps the console's last)
DRAWN = "hare.bench.drawn"  # the appliance the form was last drawn for, and whether the user edited its bundle
REFUSAL = "hare.bench.refusal"  # why the last Start was refused, said under the button after the page redraws
DISMISSED = "hare.bench.dismissed"  # the finished job whose outcome a later Start put away (its process id)
DURATION, WARMUP, ROUNDS = (0.5, 600.0), (0.0, 60.0), (1, 20)  # what Start accepts in the number fields
WIDGET = "hare-bench-"  # the form's widget keys: WIDGET + field name
DEFAULTS: dict[str, Any] = {
    "name": "",
    "seq": "16, 64",
    "batches": "1",
    "conc": "1, 4",
    "duration": 3.0,
    "warmup": 1.0,
    "baselines": [],
    "model": "",
    "model_only": True,
    "rounds": 1,
}


def _served_bundle(url: str | None) -> str:
    """The bundle the selected appliance serves, when it sits in one of the console's bundle folders (found
    once per session and appliance: the page then draws without asking the appliance again)."""
    if not url:
        return ""
    found: dict[str, str] = state.remember("bench.served", {})
    if url not in found:
        p = state.describe(url)
        bundle = bundle_for(p.info, state.settings().bundle_dirs) if p.info else None
        if bundle is None:
            return ""  # asked again next time: the appliance may be starting
        found[url] = str(bundle)
    return found[url]


def _saved_form(slot: dict[str, Any]) -> dict[str, Any]:
    """What the form showed when it was last sent (this session's, else the console's last run's)."""
    saved = st.session_state.get(FORM) or slot.get("form") or {}
    return {**DEFAULTS, **saved}


def _start_values(url: str | None, slot: dict[str, Any]) -> None:
    """Give the widgets their first values: the last form sent, on the session's first drawing; the selected
    appliance and the bundle it serves, whenever another appliance is selected (or the one selected has
    started since, and the user has not typed a bundle of their own). Everything else the widgets keep
    themselves, drawn or not."""
    drawn: dict[str, Any] | None = st.session_state.get(DRAWN)
    if drawn is None:
        saved = _saved_form(slot)
        drawn = st.session_state[DRAWN] = {"url": saved.get("url"), "bundle_edited": False}
        for name in [*DEFAULTS, "target", "bundle"]:
            st.session_state.setdefault(WIDGET + name, saved.get(name, ""))
    if drawn["url"] != url:  # another appliance: measure it, with the bundle it serves
        drawn |= {"url": url, "bundle_edited": False}
        st.session_state[WIDGET + "target"] = url or ""
        st.session_state[WIDGET + "bundle"] = _served_bundle(url)
    elif not st.session_state.get(WIDGET + "bundle") and not drawn["bundle_edited"]:
        st.session_state[WIDGET + "bundle"] = _served_bundle(url)  # the appliance was starting


def _span(bounds: tuple[float, float]) -> str:
    return f"{bounds[0]:g} to {bounds[1]:g}"


def _bundle_edited() -> None:
    st.session_state[DRAWN]["bundle_edited"] = True


def _field(name: str, widget: Callable[..., Any], label: str, *args: Any, **kw: Any) -> Any:
    """A form widget that keeps its value for the session, drawn or not."""
    return widget(label, *args, key=WIDGET + name, persist_state="session", **kw)


@st.fragment
def form(db: Path, slot: dict[str, Any], start: Callable[[BenchConfig, Path], None]) -> None:
    """The run's settings (a fragment: an edit redraws the form, not the whole page) and the Start button,
    which hands `start` the checked settings. `slot` is the console's bench slot: it keeps the last form sent."""
    url = state.selected()
    _start_values(url, slot)
    # Rows that wrap: at 800 pixels a field moves to the next line instead of squeezing its label.
    with st.container(horizontal=True, vertical_alignment="bottom"):
        target = _field(
            "target",
            st.text_input,
            "Appliance URL or bundle folder",
            width=420,
            help="a URL is measured as it runs; for a bundle folder the bench starts `hare serve` itself",
        )
        name = _field("name", st.text_input, "Run name (optional)", width=260)
    with st.container(horizontal=True, vertical_alignment="bottom"):
        seq = _field(
            "seq",
            st.text_input,
            "Sequence lengths (tokens)",
            width=200,
            help="token counts, or a mix of lengths: `comet` (45-55 words), `mix` (3-140 words, most short)",
        )
        batches = _field("batches", st.text_input, "Batch sizes", width=130)
        conc = _field("conc", st.text_input, "Concurrency", width=130)
        # No min/max on the widgets: Streamlit put an out-of-range number back to the last one without a word,
        # and the run went ahead with it. Start refuses it instead, naming the range, as the fields above do.
        duration = _field(
            "duration", st.number_input, "Seconds per point", step=1.0, width=170, help=f"{_span(DURATION)} seconds"
        )
        warmup = _field(
            "warmup", st.number_input, "Warm-up seconds", step=0.5, width=170, help=f"{_span(WARMUP)} seconds"
        )
        rounds = _field(
            "rounds",
            st.number_input,
            "Rounds",
            step=1,
            width=110,
            help=f"{_span(ROUNDS)}: every target's points run this many times, every other round backwards, so that "
            "a slow spell of a shared machine falls on hare and the baselines alike; each point keeps its median round",
        )
    with st.container(horizontal=True, vertical_alignment="bottom"):
        chosen = st.session_state.get(WIDGET + "baselines", [])
        if any(b not in BASELINES for b in chosen):  # a saved form may name a baseline this console lacks
            st.session_state[WIDGET + "baselines"] = [b for b in chosen if b in BASELINES]
        baselines = _field("baselines", st.multiselect, "Baselines in the same run", BASELINES, width=260)
        bundle = _field(
            "bundle",
            st.text_input,
            "Bundle the URL serves (for exact token lengths)",
            width=460,
            on_change=_bundle_edited,
            help="exact token counts, the model-only figure, and the model folder the baselines load",
        )
        model = _field(
            "model",
            st.text_input,
            "Model folder for the baselines (optional)",
            width=340,
            help="default: the folder the bundle was built from",
        )
    if model.strip() and not baselines:  # the bench loads it for the baselines alone: say so, not nothing
        st.caption(f"The model folder {model.strip()} is not used: no baseline is picked.")
    model_only = _field(
        "model_only", st.checkbox,
        "Also measure the model alone, in process (adds points after the HTTP ones)",
        help="needs the bundle: its model called in the bench's own process, without HTTP, at each sequence "
        "length and batch size, with 1 stream and as many side by side as the concurrency asks, at most one "
        "per core of this machine. It shows what the server adds to the model's own time.",
    )  # fmt: skip
    pressed = st.button("Start benchmark", type="primary")
    refusal = st.session_state.pop(REFUSAL, None)
    if not pressed:
        if refusal:
            st.error(refusal)
        return
    job = slot.get("job")
    if job is not None and not job.running:  # a new attempt puts the last run's outcome and log away
        st.session_state[DISMISSED] = job.pid
    values = {
        "url": url, "target": target, "name": name, "seq": seq, "batches": batches, "conc": conc,
        "duration": float(duration), "warmup": float(warmup), "baselines": list(baselines), "bundle": bundle,
        "model": model, "model_only": bool(model_only), "rounds": int(rounds),
    }  # fmt: skip
    st.session_state[FORM] = values
    slot["form"] = values
    try:
        config = BenchConfig(
            target=target.strip(),
            bundle=bundle.strip(),
            model=model.strip(),
            seq_lens=parse_seq_lens(seq),
            batches=parse_ints(batches, "batch sizes", 1, 1024),
            concurrency=parse_ints(conc, "concurrency", 1, 1024),
            duration_s=in_range(float(duration), "seconds per point", *DURATION),
            warmup_s=in_range(float(warmup), "warm-up seconds", *WARMUP),
            baselines=tuple(baselines),
            name=name.strip(),
            model_only=bool(model_only),
            rounds=int(in_range(int(rounds), "rounds", *ROUNDS)),
        )
        if not config.target:
            raise ValueError("give the appliance URL or bundle folder to measure")
        if config.baselines and not (config.model or config.bundle or not _is_url(config.target)):
            raise ValueError("baselines load the original model: give the bundle or the model folder")
        if config.baselines and config.model and not Path(config.model).is_dir():
            raise ValueError(f"model folder for the baselines: {config.model} is not a folder on this machine")
        config = _with_task(config)
    except ValueError as exc:
        # Redrawn whole, so that the last run's outcome above goes: the refusal was said under an old failure.
        st.session_state[REFUSAL] = f"Cannot start: {exc}"
        st.rerun()
    start(config, db)


def _is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def _with_task(config: BenchConfig) -> BenchConfig:
    """A URL's task comes from its /info, which also proves the appliance is there before the bench starts."""
    if not _is_url(config.target):
        if not Path(config.target).is_dir():
            raise ValueError(f"{config.target} is neither a URL nor a folder on this machine")
        return config
    p = state.describe(config.target)
    if p.error or p.info is None:
        raise ValueError(p.error or f"{config.target} did not describe itself")
    return replace(config, target=p.url, task=str(p.info["task"]))
