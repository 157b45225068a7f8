"""Overview: every appliance in the session's list, with health, readiness and what it serves."""

from __future__ import annotations

import streamlit as st

from admin_ui import overview, state
from admin_ui.client import Probe
from admin_ui.views import common


def render() -> None:
    st.title("Overview")
    st.caption("Every appliance this console watches: is it up, what does it serve, and how was its model chosen.")
    _add_form()
    urls = state.appliances()
    if not urls:
        st.info("No appliance yet: add one above (for example http://localhost:8080).")
    for url, probe in zip(urls, state.describe_all(urls), strict=True):
        with st.container(border=True):
            _appliance(probe, url)


def _add_form() -> None:
    with st.form("hare-add-appliance", clear_on_submit=True, border=False):
        cols = st.columns([4, 1], vertical_alignment="bottom")
        url = cols[0].text_input("Add an appliance", placeholder="http://host:8080", key="hare-add-url")
        if cols[1].form_submit_button("Add", width="stretch") and url:
            try:
                st.toast(f"Added {state.add_appliance(url)}")
            except ValueError as exc:
                st.error(f"Cannot add {url!r}: {exc}")


def _appliance(p: Probe, url: str) -> None:
    badges = ""
    if p.error is None:
        badges = " ".join(
            [
                ":green-badge[healthy]" if p.healthy else ":red-badge[unhealthy]",
                ":green-badge[ready]" if p.ready else ":orange-badge[not ready]",
            ]
        )
    with st.container(horizontal=True, vertical_alignment="center"):
        st.subheader(f"`{url}` {badges}", anchor=False)
        if st.button("Remove", key=f"hare-remove-{url}"):
            state.remove_appliance(url)
            st.rerun()
    if p.error is not None or p.info is None:
        st.error(p.error or "no description")
        return
    info = p.info
    # Side by side where both fit, one under the other where they do not (a row that wraps, not two columns
    # that squeeze their tables into each other).
    with st.container(horizontal=True, gap="large"):
        with st.container(width=TABLE_WIDTH):
            st.markdown("**What it serves**")
            common.static_table(overview.summary_rows(info))
        with st.container(width=TABLE_WIDTH):
            chosen = overview.chosen_variant(info)
            name = chosen.get("name") if chosen else info.get("variant", "?")
            st.markdown(f"**Chosen variant `{name}`: validation against PyTorch**")
            gates = overview.gate_rows(chosen)
            if gates:
                common.static_table(gates)
                st.caption(
                    "A gate's threshold decides whether a variant may ship; a figure without one is shown "
                    f'"{overview.INFORMATION}" and decides nothing.'
                )
            else:
                st.caption("The appliance reports no validation figures for its variant.")
    with st.expander("Every candidate variant and the versions it runs"):
        variants = overview.variant_rows(info)
        if variants:
            common.static_table(variants, whole=["variant"])
            st.caption(
                "MB: the model's size. 16×1, 128×8 and the like: median milliseconds per request of that many "
                "tokens × texts in the batch."
            )
            for line in overview.variant_failures(info):
                st.caption(line)
        versions = overview.versions_rows(info)
        if versions:
            common.static_table(versions)
        if "pid" in info:
            st.caption(f"server pid {info['pid']}")


TABLE_WIDTH = 500  # pixels: two fit side by side in a 1,280-pixel window; at 800 they stack
