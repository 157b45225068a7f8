"""The console's Streamlit entry point (`hare console` runs `streamlit run` on this file).

Sign-in when a token is set, the appliance picker in the sidebar, then the page the user chose.
"""

from __future__ import annotations

import streamlit as st

from admin_ui import auth, state
from admin_ui.views import benchmarks, containers, live, overview, playground

PAGES = [
    (overview.render, "Overview", ":material/dashboard:", "overview"),
    (playground.render, "Playground", ":material/science:", "playground"),
    (benchmarks.render, "Benchmarks", ":material/speed:", "benchmarks"),
    (live.render, "Live metrics", ":material/monitoring:", "live"),
    (containers.render, "Containers", ":material/deployed_code:", "containers"),
]


def _sidebar() -> None:
    urls = state.appliances()
    with st.sidebar:
        st.markdown("### :material/cruelty_free: hare console")
        if urls:
            current = state.selected()
            st.selectbox(
                "Appliance",
                urls,
                index=urls.index(current) if current in urls else 0,
                key=state.SELECTED,
                help="the appliance the Playground, Benchmarks and Live metrics pages work on",
            )
        else:
            st.caption("No appliance: add one on the Overview page.")


def main() -> None:
    st.set_page_config(page_title="hare console", page_icon=":material/cruelty_free:", layout="wide")
    if not auth.gate(state.settings().token):
        st.stop()
    page = st.navigation(
        [
            st.Page(fn, title=title, icon=icon, url_path=path, default=i == 0)
            for i, (fn, title, icon, path) in enumerate(PAGES)
        ]
    )
    _sidebar()
    with state.guard(f"The {page.title} page"):
        page.run()


if __name__ == "__main__":  # streamlit runs this file as __main__
    main()
