"""The Benchmarks page's Run form: the settings of a `hare bench run`, checked before it starts.

The form keeps what the user typed, sent or not, across a run, a cancel and visits to other pages: Streamlit
forgets a widget's value once a page without it has been shown, so each edit is copied to a draft of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import streamlit as st

from admin_ui import state
from admin_ui.benchjob import BASELINES, BenchConfig, bundle_for, parse_ints, parse_seq_lens

FORM = "hare.bench.form"  # the values of the last form sent in this session (the slot keeps the console's last)
DRAFT = "hare.bench.draft"  # the form as the user left it, sent or not
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


def _draft(url: str | None, slot: dict[str, Any]) -> dict[str, Any]:
    """The form as the user left it, sent or not. Streamlit forgets a widget's value once a page without it
    has been shown (and while a run hides the form), so every edit is copied here, under a key of its own, and
    the widgets start from it: a visit to another page, a run or a cancel leaves the form as it was."""
    draft: dict[str, Any] | None = st.session_state.get(DRAFT)
    if draft is None:
        draft = st.session_state[DRAFT] = dict(_saved_form(slot))
    if draft.get("url") != url:  # another appliance: measure it, with the bundle it serves
        draft |= {"url": url, "target": url or "", "bundle": _served_bundle(url)}
        for name in ("target", "bundle"):
            st.session_state[WIDGET + name] = draft[name]
    elif not draft["bundle"] and "bundle" not in draft.get("edited", ()):
        draft["bundle"] = st.session_state[WIDGET + "bundle"] = _served_bundle(url)  # the appliance was starting
    return draft


def _field(draft: dict[str, Any], name: str, widget: Callable[..., Any], label: str, *args: Any, **kw: Any) -> Any:
    """A form widget that starts from the draft and copies every edit back to it."""
    key = WIDGET + name
    if key not in st.session_state:
        st.session_state[key] = draft[name]

    def keep() -> None:
        draft[name] = st.session_state[key]
        draft.setdefault("edited", set()).add(name)

    value = widget(label, *args, key=key, on_change=keep, **kw)
    draft[name] = value
    return value


@st.fragment
def form(db: Path, slot: dict[str, Any], start: Callable[[BenchConfig, Path], None]) -> None:
    """The run's settings (a fragment: an edit redraws the form, not the whole page) and the Start button,
    which hands `start` the checked settings. `slot` is the console's bench slot: it keeps the last form sent."""
    url = state.selected()
    draft = _draft(url, slot)
    # Rows that wrap: at 800 pixels a field moves to the next line instead of squeezing its label.
    with st.container(horizontal=True, vertical_alignment="bottom"):
        target = _field(
            draft,
            "target",
            st.text_input,
            "Appliance URL or bundle folder",
            width=420,
            help="a URL is measured as it runs; for a bundle folder the bench starts `hare serve` itself",
        )
        name = _field(draft, "name", st.text_input, "Run name (optional)", width=260)
    with st.container(horizontal=True, vertical_alignment="bottom"):
        seq = _field(
            draft,
            "seq",
            st.text_input,
            "Sequence lengths (tokens)",
            width=200,
            help="token counts, or a mix of lengths: `comet` (45-55 words), `mix` (3-140 words, most short)",
        )
        batches = _field(draft, "batches", st.text_input, "Batch sizes", width=130)
        conc = _field(draft, "conc", st.text_input, "Concurrency", width=130)
        duration = _field(draft, "duration", st.number_input, "Seconds per point", 0.5, 600.0, step=1.0, width=170)
        warmup = _field(draft, "warmup", st.number_input, "Warm-up seconds", 0.0, 60.0, step=0.5, width=170)
        rounds = _field(
            draft,
            "rounds",
            st.number_input,
            "Rounds",
            1,
            20,
            step=1,
            width=110,
            help="every target's points run this many times, every other round backwards, so that a slow spell of "
            "a shared machine falls on hare and the baselines alike; each point keeps its median round",
        )
    with st.container(horizontal=True, vertical_alignment="bottom"):
        draft["baselines"] = [b for b in draft["baselines"] if b in BASELINES]
        baselines = _field(draft, "baselines", st.multiselect, "Baselines in the same run", BASELINES, width=260)
        bundle = _field(
            draft,
            "bundle",
            st.text_input,
            "Bundle the URL serves (for exact token lengths)",
            width=460,
            help="exact token counts, the model-only figure, and the model folder the baselines load",
        )
        model = _field(
            draft,
            "model",
            st.text_input,
            "Model folder for the baselines (optional)",
            width=340,
            help="default: the folder the bundle was built from",
        )
    model_only = _field(
        draft, "model_only", st.checkbox,
        "Also measure the model alone, in process (adds points after the HTTP ones)",
        help="needs the bundle: its model called in the bench's own process, without HTTP, at each sequence "
        "length and batch size, with 1 stream and as many side by side as the concurrency asks, at most one "
        "per core of this machine. It shows what the server adds to the model's own time.",
    )  # fmt: skip
    if not st.button("Start benchmark", type="primary"):
        return
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
            duration_s=float(duration),
            warmup_s=float(warmup),
            baselines=tuple(baselines),
            name=name.strip(),
            model_only=bool(model_only),
            rounds=int(rounds),
        )
        if not config.target:
            raise ValueError("give the appliance URL or bundle folder to measure")
        if config.baselines and not (config.model or config.bundle or not _is_url(config.target)):
            raise ValueError("baselines load the original model: give the bundle or the model folder")
        config = _with_task(config)
    except ValueError as exc:
        st.error(f"Cannot start: {exc}")
        return
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
