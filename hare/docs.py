"""The tables in docs/ that the code enforces, generated from that code: `python -m hare.docs` rewrites them,
`python -m hare.docs --check` (and tests/test_docs.py) fails when a page has drifted.

A generated table sits in its page between `<!-- name -->` and `<!-- /name -->`; the prose around it is
hand-written. The configuration table comes from the settings fields (api/config.py) and `hare serve`'s
flags (api/process/serve.py); the errors table from the error tree (each layer's errors, under tasks/errors.py's
root) and the one status table (api/web/errors.py); the KServe tensors table from each task's spec (tasks/); the
parity gates table from each task's gates and `hare optimize`'s flags (container/optimize/cli.py); the families
table's parity lengths from each family's default config (container/optimize/regimes.py), its other columns as
written.
"""

from __future__ import annotations

import argparse
import inspect
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from api import config
from api.process import serve
from api.web import errors
from container.optimize import cli as optimize_cli
from container.optimize import regimes
from tasks import errors as tree
from tasks.registry import TASKS

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def configuration_table() -> str:
    """Every HARE_* variable `hare serve` reads: its flag, default (and public default) and what it does."""
    flags = {variable: flag for flag, variable in serve.flags().values()}
    rows = ["| Variable | Flag | Default | What it does |", "|---|---|---|---|"]
    for variable, default, help_text in config.describe():
        flag = f"`{flags[variable]}`" if variable in flags else ""
        rows.append(f"| `{variable}` | {flag} | {default} | {_cell(help_text)} |")
    return "\n".join(rows)


# The modules whose errors a server can answer with (the optimizer's and the bench's never reach HTTP).
SERVED = ("tasks.errors", "api.engine.errors", "api.web.errors", "container.runtime")


def _classes(root: type[tree.HareError]) -> list[type[tree.HareError]]:
    found = [root]
    for sub in root.__subclasses__():
        if sub.__module__ in SERVED:
            found += _classes(sub)
    return found


def errors_table() -> str:
    """Every error a server answers with, and its status (api/web/errors.py's table)."""
    rows = ["| Status | Type | When |", "|---|---|---|"]
    listed = [cls for cls in _classes(tree.HareError) if cls is not tree.HareError]
    for cls in sorted(listed, key=lambda c: (errors.status_of(c("")), c.__name__)):
        rows.append(f"| {errors.status_of(cls(''))} | `{cls.__name__}` | {_cell(inspect.getdoc(cls) or '')} |")
    return "\n".join(rows)


def kserve_table() -> str:
    """Every task's KServe v2 tensors, from its spec (`TaskSpec.tensors`)."""

    def listed(tensors: Sequence[dict[str, object]]) -> str:
        return ", ".join(f"`{t['name']}` {t['datatype']} `{t['shape']}`" for t in tensors)

    rows = ["| Task | Inputs | Outputs | What the outputs hold |", "|---|---|---|---|"]
    for name, spec in TASKS.items():
        t = spec.tensors
        what = _cell(inspect.getdoc(t.convert) or "")
        rows.append(f"| `{name}` | {listed(t.inputs)} | {listed(t.outputs)} | {what} |")
    return "\n".join(rows)


def gates_table() -> str:
    """Every parity gate `hare optimize` applies: where, its default threshold, the flag that overrides it and
    the thresholds it takes (the metric's values, Gate.bounds)."""
    rows = ["| Gate | Applies to | Default | Flag | Takes | What it measures |", "|---|---|---|---|---|---|"]
    for name, gate in optimize_cli.declared_gates():
        where = f"`{name}`" if name in TASKS else name
        default = f"{'≥' if gate.higher_is_better else '≤'} {gate.threshold:g}"
        flag = optimize_cli.gate_flag(gate)
        low, high = gate.bounds
        takes = f"{low:g} to {high:g}" if math.isfinite(high) else f"≥ {low:g}"
        rows.append(f"| `{gate.metric}` | {where} | {default} | `{flag}` | {takes} | {_cell(gate.help)} |")
    return "\n".join(rows)


def _spans(lengths: Sequence[int]) -> str:
    """[63, 64, 65, 127] -> "63-65, 127"."""
    runs: list[list[int]] = []
    for n in lengths:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def regime_lengths(model_type: str) -> str:
    """The lengths a build of `model_type` in transformers' default geometry adds to its parity set
    (container/optimize/regimes.py), as ranges; where its maximum is past what a reference can hold, up to
    where it checks."""
    import transformers

    config = transformers.AutoConfig.for_model(model_type).to_dict()
    positions = max([0, *(c.get("max_position_embeddings") or 0 for c in regimes.nested(config))])
    if not positions:
        return "(relative positions: no maximum)"
    lengths = _spans(regimes.parity_lengths(config, positions))
    return (
        lengths
        if positions <= regimes.reference_limit(config)
        else f"{lengths} (maximum {positions}: past a PyTorch reference's memory)"
    )


def families_table() -> str:
    """optimizer.md's families table: the hand-written columns as the page has them, and the lengths each
    family's parity set adds where its arithmetic changes (regime_lengths)."""
    text = (DOCS / "optimizer.md").read_text()
    table = text.split("<!-- families -->", 1)[1].split("<!-- /families -->", 1)[0]
    rows = [line.strip().strip("|").split(" | ")[:4] for line in table.strip().splitlines()[2:]]
    head = "| family | tokenizer in the tests | graph inputs | what ORT's fusion finds (tiny models) | parity lengths "
    out = [head + "beside 1–600 (default config) |", "|---|---|---|---|---|"]
    for cells in rows:
        out.append(f"| {' | '.join(c.strip() for c in cells)} | {regime_lengths(cells[0].strip().strip('`'))} |")
    return "\n".join(out)


# marker name -> (page under docs/, the table's generator)
TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "configuration": ("configuration.md", configuration_table),
    "errors": ("api.md", errors_table),
    "kserve": ("api.md", kserve_table),
    "gates": ("optimizer.md", gates_table),
    "families": ("optimizer.md", families_table),
}


def render(text: str, name: str, table: str) -> str:
    """`text` with the table between its markers replaced by `table`."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    head, found, rest = text.partition(start)
    if not found or end not in rest:
        raise ValueError(f"the page has no {start} ... {end} markers")
    return f"{head}{start}\n{table}\n{end}{rest.split(end, 1)[1]}"


def drifted(docs: Path = DOCS) -> list[str]:
    """The pages whose generated tables differ from the code."""
    return [
        f"{page} ({name})"
        for name, (page, make) in TABLES.items()
        if render((docs / page).read_text(), name, make()) != (docs / page).read_text()
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hare.docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say which pages drifted (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        stale = drifted()
        for page in stale:
            print(f"docs/{page} is out of date: run python -m hare.docs", file=sys.stderr)
        return 1 if stale else 0
    for name, (page, make) in TABLES.items():
        path = DOCS / page
        path.write_text(render(path.read_text(), name, make()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
