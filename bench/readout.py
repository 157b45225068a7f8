"""The `hare bench` subcommands that read the result store (bench/cli.py parses them): list, show, compare,
export, report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.store import Store, default_db_path
from bench.tables import wide_console
from container.machine import machine_line
from tasks.errors import InputError


def open_store(args: argparse.Namespace) -> Store:
    """The store a measurement writes to, made if it is not there yet."""
    return Store(args.db)


def read_store(args: argparse.Namespace) -> Store:
    """The store a reading command reads: one that is not there is said, not made (with its folders)."""
    path = args.db if args.db is not None else default_db_path()
    if not path.exists():
        raise InputError(
            f"there is no result store at {path}: nothing has been measured there yet (a `hare bench` measurement "
            "writes one); give another --db (or HARE_BENCH_DB)"
        )
    return Store(path)


def list_runs(args: argparse.Namespace) -> int:
    from bench.tables import runs_table

    wide_console().print(runs_table(read_store(args).runs(limit=args.limit)))
    return 0


def _get_run(store: Store, run_id: int) -> None:
    try:
        store.run(run_id)
    except KeyError as exc:
        raise InputError(str(exc.args[0])) from None


def print_run(store: Store, run_id: int) -> None:
    from bench.tables import points_table, ratios_table

    console = wide_console()
    run = store.run(run_id)
    m = run.machine
    console.print(
        f"[bold]run {run.id}[/] {run.kind} {run.status} · {run.task} · {run.target}\n"
        f"machine: {machine_line(m)}\n"
        f"versions: {' '.join(f'{k} {v}' for k, v in run.versions.items())}\n"
        f"bundle manifest sha256: {run.manifest_hash or '-'}" + (f"\nmessage: {run.message}" if run.message else "")
    )
    if run.kind in ("peers", "bulk"):  # figures kept in the run's summary: the results page's tables and notes
        from rich.markup import escape

        from bench.page import notes, tables

        for table in tables(store, run):
            console.print(table)
        for note in notes(run):
            console.print(escape(note))
        return
    points = store.points(run_id)
    if points:  # a run that failed before its first point: its message, not an empty table
        console.print(points_table(points))
    ratios = store.ratios(run_id)
    if ratios:
        console.print(ratios_table(ratios))
    goals = run.summary.get("goals")
    if goals:
        from bench.headline import goals_table

        console.print(goals_table(goals))


def show(args: argparse.Namespace) -> int:
    store = read_store(args)
    _get_run(store, args.run)
    print_run(store, args.run)
    return 0


def compare(args: argparse.Namespace) -> int:
    from bench.tables import compare_table

    store = read_store(args)
    _get_run(store, args.a)
    _get_run(store, args.b)
    wide_console().print(compare_table(store.compare(args.a, args.b), args.a, args.b))
    return 0


def export(args: argparse.Namespace) -> int:
    from bench.report import export_csv, export_json

    store = read_store(args)
    _get_run(store, args.run)
    text = export_csv(store, args.run) if args.format == "csv" else export_json(store, args.run)
    if args.out:
        if args.out.is_dir():
            raise InputError(f"--out {args.out} is a folder; name the file to write, such as {args.out / 'run.csv'}")
        args.out.parent.mkdir(parents=True, exist_ok=True)  # as report's --out
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def report(args: argparse.Namespace) -> int:
    if args.run is None:
        return _results_page(args)
    from bench.report import write_report

    if args.kind or args.since or args.all:
        raise InputError("--kind, --since and --all choose the runs of the results page: leave out RUN")
    store = read_store(args)
    _get_run(store, args.run)
    fmt = args.format or "html"
    out = args.out or Path(f"bench-report-{args.run}.{fmt}")
    write_report(store, args.run, out, fmt)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _results_page(args: argparse.Namespace) -> int:
    from bench.page import render

    if args.format == "html":
        raise InputError("the results page is Markdown; --format html is for one run's report (give RUN)")
    text = render(read_store(args), kind=args.kind, since=args.since, every=args.all)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
