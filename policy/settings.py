"""Parsing of operator settings shared by the modules that read them when the code loads."""

from __future__ import annotations


def positive_int_setting(variable: str, value: str | None, meaning: str, unset: str) -> int | None:
    """An environment variable that holds a positive integer, or None when unset or blank.

    Args:
        variable: the variable's name, for the error.
        value: its value as read from the environment.
        meaning: what the number counts, for the error ("seconds between ...").
        unset: what leaving it unset gives, for the error.

    Raises:
        ValueError: naming the variable and its value, when it is set to anything else.
    """
    if not (value or "").strip():
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(
            f"{variable}={value!r}: expected a positive integer ({meaning}), or unset for {unset}"
        )
    return n
