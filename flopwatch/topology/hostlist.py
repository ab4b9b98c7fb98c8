"""Slurm hostlist expressions (`node[001-016,020]`, `rack[1-2]-n[01-02]`) expanded as Slurm does.

Semantics follow Slurm's src/common/hostlist.c (`hostlist_create`): names are separated by
commas, spaces or tabs outside brackets; a bracket holds comma-separated numbers or `lo-hi`
ranges whose width is the width of `lo` as written (`[08-10]` -> 08 09 10, `[8-10]` -> 8 9 10);
the last bracket group must end the name, earlier groups in the prefix multiply out the way
Slurm's recursion does. Order is kept and duplicates are not removed, as in Slurm.

Where Slurm quietly turns a malformed name into a host (an unclosed `[` gets a `]` tacked on)
this module refuses it instead: a topology naming a host that does not exist is a mistake.
"""

from __future__ import annotations

#: Slurm's MAX_RANGE: hosts one bracket range may stand for (guards against `n[0-999999999]`).
MAX_RANGE = 64 * 1024
SEPARATORS = ",\t "


class HostlistError(ValueError):
    """A hostlist expression is malformed; the message says what and where."""


def expand(expr: str) -> list[str]:
    """Every host name `expr` stands for, in Slurm's order."""
    hosts: list[str] = []
    for token in _tokens(expr):
        hosts.extend(_expand_token(token, expr))
    return hosts


def _tokens(expr: str) -> list[str]:
    """Split on separators outside brackets (Slurm's _next_tok with bracket depth)."""
    tokens: list[str] = []
    depth = 0
    current: list[str] = []
    for char in expr:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"{expr!r}: ']' without an opening '['")
        if depth == 0 and char in SEPARATORS:
            if current:
                tokens.append("".join(current))
            current = []
            continue
        current.append(char)
    if depth:
        raise HostlistError(f"{expr!r}: '[' is never closed; write e.g. node[01-16]")
    if current:
        tokens.append("".join(current))
    return tokens


def _expand_token(token: str, expr: str) -> list[str]:
    if "[" not in token:
        if "]" in token:
            raise HostlistError(f"{expr!r}: ']' without an opening '['")
        return [token]
    open_at = token.rindex("[")
    close_at = token.find("]", open_at)
    if close_at != len(token) - 1:
        raise HostlistError(
            f"{expr!r}: text after the last ']' in {token!r}; Slurm's bracket must end the name"
        )
    prefix, body = token[:open_at], token[open_at + 1:close_at]
    return _push_range_list(prefix, _ranges(body, expr), expr)


def _push_range_list(prefix: str, numbers: list[str], expr: str) -> list[str]:
    """Slurm's _push_range_list: a bracket group in the prefix multiplies out, innermost first.

    The prefix's last group is taken first and, for each of its numbers, the rest of the prefix
    recurses; so `rack[1-2]-n[01-02]` gives rack1-n01 rack1-n02 rack2-n01 rack2-n02."""
    if "[" not in prefix:
        return [prefix + n for n in numbers]
    open_at = prefix.rindex("[")
    close_at = prefix.find("]", open_at)
    if close_at < 0:
        raise HostlistError(f"{expr!r}: '[' is never closed; write e.g. node[01-16]")
    head, body, tail = prefix[:open_at], prefix[open_at + 1:close_at], prefix[close_at + 1:]
    hosts: list[str] = []
    for number in _ranges(body, expr):
        hosts.extend(_push_range_list(head + number + tail, numbers, expr))
    return hosts


def _ranges(body: str, expr: str) -> list[str]:
    """The numbers in one bracket, zero padded to the width of each range's low end."""
    if not body:
        raise HostlistError(f"{expr!r}: empty brackets; write e.g. [01-16]")
    numbers: list[str] = []
    for part in body.split(","):
        lo_text, dash, hi_text = part.partition("-")
        if not lo_text.isdigit() or (dash and not hi_text.isdigit()):
            raise HostlistError(
                f"{expr!r}: {part!r} is not a number or range; write e.g. 1, 01-16 or 3-5"
            )
        lo = int(lo_text)
        hi = int(hi_text) if dash else lo
        if lo > hi:
            raise HostlistError(f"{expr!r}: range {part!r} runs backwards; write the low end first")
        if hi - lo + 1 > MAX_RANGE:
            raise HostlistError(f"{expr!r}: range {part!r} stands for more than {MAX_RANGE} hosts")
        width = len(lo_text)
        numbers.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return numbers
