"""Pages of the queue list (`GET /API/v1/queues`, gRPC `ListQueues`): pure.

A page holds at most `max_results` queues (default and most `MAX_QUEUES_PAGE`) in name
order, after the queue its `page_token` names. The token is opaque to clients (URL-safe
base64 of the last name of the previous page, without padding): a queue created or deleted
between two pages never makes another be returned twice or skipped, since the next page
starts after a name, not at a position. `next_page_token` is "" on the last page.
"""

from __future__ import annotations

import base64
import binascii
from bisect import bisect_right
from collections.abc import Sequence

from doq.errors import InvalidArgument
from doq.queues import limits as L
from doq.queues.model import QueueInfo

MAX_QUEUES_PAGE = 1000  # queues per page: the default and the most


def encode_token(last_name: str) -> str:
    """The token of the page after `last_name`."""
    return base64.urlsafe_b64encode(last_name.encode()).rstrip(b"=").decode()


def decode_token(token: str) -> str:
    """The queue name a page token names ("" for none). Raises InvalidArgument
    (INVALID_PAGE_TOKEN) for a token this node did not make."""
    if not token:
        return ""
    try:
        name = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, ValueError):
        name = ""
    if not L.is_queue_name(name) or encode_token(name) != token:
        raise InvalidArgument(f"invalid page_token {token[:64]!r}: pass the next_page_token of a page",
                              reason="INVALID_PAGE_TOKEN")
    return name


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
