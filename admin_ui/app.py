"""The console's Streamlit entry point (`hare console` has Streamlit run this file).

Sign-in when a token is set, the pages in the top bar, then the page the user chose.

A page's module is imported when the page is first shown, so drawing the Overview never waits for the other
pages' imports (Altair, pandas, the bench store); `hare console` has them imported in the background as it
starts (admin_ui/launch.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import streamlit as st
from streamlit.navigation.page import StreamlitPage

from admin_ui import auth, state

# The tab's icon: Streamlit hands an SVG text to the browser as a data: URI. A ":material/...:" page icon would
# make every browser fetch it from fonts.gstatic.com (Streamlit's frontend builds that URL for favicons), which
# fails offline; the Material icons of the pages and the sidebar are drawn with the font Streamlit serves itself.
ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g fill="#0072B2">'
    '<ellipse cx="8.6" cy="6.2" rx="2.1" ry="5.6" transform="rotate(-14 8.6 6.2)"/>'
    '<ellipse cx="15.4" cy="6.2" rx="2.1" ry="5.6" transform="rotate(14 15.4 6.2)"/>'
    '<circle cx="12" cy="15.6" r="6.4"/></g><circle cx="9.8" cy="14.6" r="1" fill="#fff"/>'
    '<circle cx="14.2" cy="14.6" r="1" fill="#fff"/></svg>'
)

PAGES = [
    ("overview", "Overview", ":material/dashboard:"),
    ("playground", "Playground", ":material/science:"),
    ("benchmarks", "Benchmarks", ":material/speed:"),
    ("live", "Live metrics", ":material/monitoring:"),
    ("containers", "Containers", ":material/deployed_code:"),
]


def _page(module: str) -> Callable[[], None]:
    """The render() of admin_ui/views/<module>.py, imported on first use (`hare console` imports them all in
    the background as it starts: admin_ui/launch.py)."""

    def render() -> None:
        importlib.import_module(f"admin_ui.views.{module}").render()

    return render


def _home(first: StreamlitPage) -> StreamlitPage:
    """The app's root, "/": it goes to the first page, which keeps its own name. Served at "/" itself (as the
    default page), the first page's name led nowhere: a typed or bookmarked /overview drew it under a "Page not
    found" dialog."""

    def home() -> None:
        st.switch_page(first)

    return st.Page(home, title=first.title, default=True, visibility="hidden")


def main() -> None:
    # No sidebar: the pages are named in the top bar and the appliance is picked on the pages that work on one,
    # so the page's content has the whole width (a 300-pixel sidebar left an 800-pixel window 500 pixels).
    st.set_page_config(page_title="hare console", page_icon=ICON, layout="wide", initial_sidebar_state="collapsed")
    token = state.settings().token
    # The page is found from the address before the sign-in form is drawn, so that signing in shows the page
    # asked for (/benchmarks), not the first one; the pages' menu stays hidden until then.
    pages = [st.Page(_page(module), title=title, icon=icon, url_path=module) for module, title, icon in PAGES]
    page = st.navigation([_home(pages[0]), *pages], position="top" if auth.signed_in(token) else "hidden")
    if not auth.gate(token):
        st.stop()
    with state.guard(f"The {page.title} page"):
        page.run()


if __name__ == "__main__":  # streamlit runs this file as __main__
    main()
