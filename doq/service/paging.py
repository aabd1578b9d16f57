"""Pages of the queue list (`GET /API/v1/queues`, gRPC `ListQueues`): pure.

A page holds at most `max_results` queues (default and most `MAX_QUEUES_PAGE`) in name
order, after the name its `page_token` gives. The token is the last name of the previous
page (clients should pass it back as it is; any queue name is a valid place to start
after, whether or not that queue exists): a queue created or deleted between two pages
never makes another be returned twice or skipped, since the next page starts after a
name, not at a position. `next_page_token` is "" on the last page.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from doq.errors import InvalidArgument
from doq.queues import limits as L
from doq.queues.model import QueueInfo

MAX_QUEUES_PAGE = 1000  # queues per page: the default and the most


PAGE_TOKEN_PATTERN = rf"^$|{L.QUEUE_NAME_PATTERN}"  # "" or a queue name (JSON Schema syntax)


def encode_token(last_name: str) -> str:
    """The token of the page after `last_name`."""
    return last_name


def decode_token(token: str) -> str:
    """The queue name a page starts after ("" for the first page). Raises InvalidArgument
    (INVALID_PAGE_TOKEN) for a token that is not a queue name."""
    if token and not L.is_queue_name(token):
        raise InvalidArgument(f"invalid page_token {token[:64]!r}: pass the next_page_token of a page "
                              "(a queue name)", reason="INVALID_PAGE_TOKEN")
    return token


def check_max_results(max_results: int) -> int:
    """`max_results` as asked (0: the default, MAX_QUEUES_PAGE). Raises InvalidArgument
    (INVALID_MAX_RESULTS) outside 0..MAX_QUEUES_PAGE."""
    if type(max_results) is not int or not 0 <= max_results <= MAX_QUEUES_PAGE:
        raise InvalidArgument(f"max_results must be within 1..{MAX_QUEUES_PAGE} (0: {MAX_QUEUES_PAGE})",
                              reason="INVALID_MAX_RESULTS")
    return max_results or MAX_QUEUES_PAGE


def page(queues: Sequence[QueueInfo], page_token: str, max_results: int) -> tuple[list[QueueInfo], str]:
    """(the page of `queues` (sorted by name) after `page_token`, the next page's token or
    ""). Raises InvalidArgument for a bad token or `max_results`."""
    n = check_max_results(max_results)
    after = decode_token(page_token)
    start = bisect_right([q.name for q in queues], after) if after else 0
    out = list(queues[start:start + n])
    more = start + n < len(queues)
    return out, encode_token(out[-1].name) if more and out else ""
