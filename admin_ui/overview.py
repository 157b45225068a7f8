"""The Overview page's logic: an appliance's /info turned into a summary, its variants and its gate verdicts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tasks.registry import TASKS


def _fmt(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping):  # {"max_batch_size": 32} -> "max batch size 32"
        return ", ".join(f"{str(k).replace('_', ' ')} {_fmt(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ", ".join(_fmt(v) for v in value) or "-"
    return str(value)


def label_list(labels: Any) -> list[str]:
    """/info `labels` as a list in id order: accepts {"0": "NEG", ...}, {0: ...} or ["NEG", ...]."""
    if isinstance(labels, Mapping):

        def order(k: Any) -> tuple[int, str]:
            return (int(k), "") if str(k).lstrip("-").isdigit() else (1 << 30, str(k))

        return [str(labels[k]) for k in sorted(labels, key=order)]
    if isinstance(labels, list | tuple):
        return [str(x) for x in labels]
    return []


def summary_rows(info: Mapping[str, Any]) -> list[dict[str, str]]:
    """The facts an operator checks first, as (field, value) rows; absent fields show as '-'."""
    labels = label_list(info.get("labels"))
    rows = [
        ("task", info.get("task")),
        ("model", info.get("model")),
        ("architecture", " / ".join(str(x) for x in (info.get("architecture"), info.get("model_type")) if x)),
        ("labels", f"{len(labels)}: {', '.join(labels[:12])}{' …' if len(labels) > 12 else ''}" if labels else None),
        ("max length", info.get("max_length")),
        ("variant", " ".join(str(x) for x in (info.get("variant"), info.get("precision"), info.get("target")) if x)),
        (
            "workers × streams × threads",
            f"{info.get('workers', '-')} × {info.get('streams', '-')} × {info.get('threads', '-')}"
            + (f" ({info['profile']} profile)" if info.get("profile") else ""),
        ),
        ("execution providers", info.get("providers")),
        ("batching", info.get("batching")),
    ]
    spec = TASKS.get(str(info.get("task")))
    if spec is not None and spec.embeddings:
        rows.append(("pooling", f"{info.get('pooling') or '-'}{', normalized' if info.get('normalize') else ''}"))
    return [{"field": k, "value": _fmt(v)} for k, v in rows]


def versions_rows(info: Mapping[str, Any]) -> list[dict[str, str]]:
    """Package versions the server runs, beside those the bundle was built with (`versions.bundle`)."""
    versions = info.get("versions")
    if not isinstance(versions, Mapping):
        return []
    bundle = versions.get("bundle")
    built: Mapping[str, Any] = bundle if isinstance(bundle, Mapping) else {}
    names = [k for k in versions if k != "bundle"] + [k for k in built if k not in versions]
    return [
        {"package": str(k), "server": _fmt(versions.get(k)), "bundle built with": _fmt(built.get(k))} for k in names
    ]


# What the optimizer's parity metrics mean, in words (tasks/*.py compute them; /info reports them by name).
METRICS = {
    "cosine_p1": "cosine to PyTorch, 1st percentile",
    "cosine_min": "cosine to PyTorch, lowest",
    "top1_agreement": "top label agrees with PyTorch",
    "token_agreement": "token labels agree with PyTorch",
    "max_score_diff": "largest score difference",
    "max_abs_prob_diff": "largest probability difference",
    "max_abs_diff": "largest raw output difference",
    "top20_overlap_p1": "top-20 terms kept, 1st percentile",
    "spearman_min": "rank correlation, lowest query",
    "spearman_mean": "rank correlation, mean over queries",
    "max_abs_diff_tokens": "tokens of the sample furthest from PyTorch",
}
INFORMATION = "for information"  # the verdict of a figure no gate checks: it decides nothing


def metric_label(name: str) -> str:
    """ "cosine_p1" -> "cosine to PyTorch, 1st percentile"; an unknown metric keeps its name, in words."""
    return METRICS.get(name, name.replace("_", " "))


def failure(variant: Mapping[str, Any]) -> str:
    """Why a candidate may not ship: its build error, or the gates it missed with their figures."""
    if variant.get("error"):
        return f"build failed: {variant['error']}"
    found = variant.get("gates")
    gates: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    missed = [
        f"{metric_label(str(m))} {_fmt(g.get('value'))} (needs {_fmt(g.get('threshold'))})"
        for m, g in gates.items()
        if isinstance(g, Mapping) and not g.get("passed")
    ]
    return "failed: " + "; ".join(missed) if missed else "failed"


def variant_rows(info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every candidate the optimizer tried: size, whether it may ship, and median milliseconds per timing point.

    Short cells only, so that the table reads at 800 pixels (with a precision column and each failure's reason in
    its cell, the text columns were squeezed to one letter a line): the precision joins the name when the name
    does not say it, and why a candidate failed is said under the table (`variant_failures`)."""
    out = []
    for v in _variants(info):
        name, precision = str(v.get("name", "?")), str(v.get("precision") or "")
        row: dict[str, Any] = {
            "variant": ("★ " if v.get("chosen") else "")
            + name
            + (f" ({precision})" if precision and precision not in name else ""),
            "MB": v.get("size_mb"),
            "gates": "passed" if v.get("passed") else "build failed" if v.get("error") else "failed",
        }
        for point, ms in sorted((v.get("timings_ms") or {}).items(), key=lambda kv: (len(kv[0]), kv[0])):
            row[timing_label(point)] = ms
        out.append(row)
    return out


def timing_label(point: str) -> str:
    """The optimizer's timing point "s128xb8" as a short column name, "128×8" (tokens × batch)."""
    found = re.fullmatch(r"s(\d+)xb(\d+)", point)
    return f"{found[1]}×{found[2]}" if found else point


def variant_failures(info: Mapping[str, Any]) -> list[str]:
    """Why each candidate that may not ship failed, one line each: "int8: failed: cosine ... 0.866 (needs 0.99)"."""
    return [f"{v.get('name', '?')}: {failure(v)}" for v in _variants(info) if not v.get("passed")]


def _variants(info: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [v for v in info.get("variants") or [] if isinstance(v, Mapping)]


def chosen_variant(info: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The variant the appliance serves: the one marked chosen, else the one named by `variant`."""
    variants = [v for v in info.get("variants") or [] if isinstance(v, Mapping)]
    return next((v for v in variants if v.get("chosen")), None) or next(
        (v for v in variants if v.get("name") == info.get("variant")), None
    )


def gate_rows(variant: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The chosen variant's validation figures, named in words: each metric, its gate threshold and verdict
    when a gate checks it, else "for information" (such a figure decides nothing, whatever its size)."""
    if not variant:
        return []
    gates = variant.get("gates") or {}
    metrics = dict(variant.get("metrics") or {})
    rows = []
    for metric in dict.fromkeys([*gates, *metrics]):
        gate = gates.get(metric) if isinstance(gates, Mapping) else None
        value = gate.get("value") if isinstance(gate, Mapping) else metrics.get(metric)
        if str(metric).endswith("_tokens") and isinstance(value, float) and value.is_integer():
            value = int(value)  # a token count: "40", not "40.0"
        rows.append(
            {
                "metric": metric_label(str(metric)),
                "value": value,
                "threshold": gate.get("threshold") if isinstance(gate, Mapping) else None,
                "verdict": ("pass" if gate.get("passed") else "FAIL") if isinstance(gate, Mapping) else INFORMATION,
            }
        )
    return rows
