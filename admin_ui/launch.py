"""`python -m admin_ui.launch run admin_ui/app.py ...`: Streamlit's own command line (what `python -m streamlit`
runs), in a process that first starts importing what the console's pages need, in a background thread.

Streamlit imports a page's modules only when a browser first runs it, so without this the first visitor of a
freshly started console waits for Altair, pandas and the bench store on top of the page itself; here they load
while the server starts and before anyone connects. `hare console` runs this (admin_ui/cli.py).
"""

from __future__ import annotations

import importlib
import threading

# The pages, and what their tables and charts need (Streamlit imports pandas and pyarrow for a data frame).
MODULES = (
    "admin_ui.views.overview",
    "admin_ui.views.playground",
    "admin_ui.views.benchmarks",
    "admin_ui.views.live",
    "admin_ui.views.containers",
    "pandas",
    "pyarrow",
    "altair",
)


def import_all() -> None:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # the page that needs it says so when it is shown
            continue


def warm_up() -> threading.Thread:
    thread = threading.Thread(target=import_all, name="hare-console-warm-up", daemon=True)
    thread.start()
    return thread


def main() -> None:
    warm_up()
    from streamlit.web.cli import main as streamlit_main

    streamlit_main(prog_name="streamlit")  # the name Streamlit expects, as `python -m streamlit` gives it


if __name__ == "__main__":
    main()
