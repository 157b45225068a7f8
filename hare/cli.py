"""`hare`: one command line, one subcommand per job. Each subcommand lives beside the code it drives and
is imported only when used, so `hare serve` never loads torch."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Protocol

from container.optimize.errors import ValidationFailed
from tasks.errors import HareError, InputError

# subcommand -> module with `configure(parser)` and `main(args) -> int`
COMMANDS = {
    "optimize": ("container.optimize.cli", "turn a Hugging Face model folder into a checked ONNX bundle"),
    "tune": ("container.optimize.tune", "measure a CPU bundle's batch budget on this machine"),
    "serve": ("api.process.serve", "serve a bundle on /predict (gunicorn + uvicorn workers)"),
    "run": ("api.bulk.cli", "run a bundle over a corpus file (JSONL, CSV, Parquet) into Parquet or JSONL"),
    "bench": ("bench.cli", "benchmark a server end to end against the vanilla baseline"),
    "console": ("admin_ui.cli", "start the Streamlit admin console"),
}
EXIT_CODES: list[tuple[type[HareError], int]] = [(ValidationFailed, 3), (InputError, 2), (HareError, 1)]


class Command(Protocol):
    def configure(self, parser: argparse.ArgumentParser) -> None: ...
    def main(self, args: argparse.Namespace) -> int: ...


def _load(name: str) -> Command | None:
    try:
        return importlib.import_module(COMMANDS[name][0])  # type: ignore[return-value]
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith(COMMANDS[name][0].split(".")[0]):
            return None  # that subcommand is not built yet
        raise


def main(argv: Sequence[str] | None = None) -> int:
    # Never reach a model hub: every model is a local folder.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="hare",
        description="Optimize, serve, benchmark and bulk-run Transformer models (text classification, NER, "
        "embeddings, reranking) from local Hugging Face folders.",
        epilog="`hare COMMAND --help` for each. Start with `hare optimize` (the embedded default model) and "
        "`hare serve`, then POST /predict on :8080.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Configure only the subcommand asked for: its module may import heavy packages.
    wanted = argv[0] if argv and argv[0] in COMMANDS else None
    loaded: Command | None = None
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            loaded = _load(name)
            if loaded is None:
                parser.error(f"`hare {name}` is not available in this build")
            loaded.configure(p)
    args = parser.parse_args(argv)
    assert loaded is not None
    try:
        return loaded.main(args)
    except HareError as exc:
        print(f"hare {args.command}: error: {exc.message}", file=sys.stderr)
        return next(code for cls, code in EXIT_CODES if isinstance(exc, cls))
    except OSError as exc:  # the machine refused a file (a path, a permission, a full disk): one line, not a trace
        print(f"hare {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
