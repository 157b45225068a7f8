"""The console's token gate: `HARE_CONSOLE_TOKEN`, asked for once per browser session.

`hare console` refuses to listen beyond loopback without a token (see `needs_token`); with one set, every
session must type it before any page renders. Streamlit serves plain HTTP: put TLS in front when the console
is reachable from other machines.
"""

from __future__ import annotations

import hmac
import ipaddress

import streamlit as st

AUTHED = "hare.authed"


def is_loopback(address: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1; False for 0.0.0.0, a LAN address or a host name."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def needs_token(address: str) -> bool:
    return not is_loopback(address)


def token_matches(expected: str, given: str) -> bool:
    """Constant-time comparison, so the time a wrong guess takes says nothing about the token."""
    return hmac.compare_digest(expected.encode(), given.encode())


def signed_in(expected: str | None) -> bool:
    """True when no token is set or this session has given it."""
    return not expected or bool(st.session_state.get(AUTHED))


def gate(expected: str | None) -> bool:
    """Draw the sign-in form until the session gives the token; True once it has (or when none is set)."""
    if not expected or signed_in(expected):
        return True
    st.title("hare console")
    with st.form("hare-signin"):
        given = st.text_input("Console token", type="password", help="the value of HARE_CONSOLE_TOKEN")
        submitted = st.form_submit_button("Sign in", type="primary")
    if submitted:
        if token_matches(expected, given):
            st.session_state[AUTHED] = True
            st.rerun()
        st.error("That is not the console token.")
    return False
