"""`/docs` and `/redoc` on a real node load nothing from outside: every URL they reference
is same-origin and served with 200."""

from __future__ import annotations

import re
import urllib.request
from urllib.parse import urljoin, urlsplit

import pytest

from tests.support.proc import NodeProc

pytestmark = pytest.mark.integration

URL_ATTR = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']|url\s*:\s*["']([^"']+)["']""")


def fetch(url: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read()


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_doc_pages_use_only_local_assets(doq_node: NodeProc, page: str) -> None:
    status, ctype, raw = fetch(doq_node.http_url + page)
    assert status == 200 and ctype.startswith("text/html")
    html = raw.decode()
    own = urlsplit(doq_node.http_url).netloc
    for absolute in re.findall(r"https?://[^\s\"'<>)]+", html):
        assert urlsplit(absolute).netloc == own, f"{page} references an outside URL: {absolute}"
    refs = {a or b for a, b in URL_ATTR.findall(html)}
    assert "/openapi.json" in refs
    assert any(r.endswith(".js") for r in refs)
    for ref in refs:
        status, ctype, body = fetch(urljoin(doq_node.http_url + page, ref))
        assert status == 200 and body, ref
        if ref.endswith(".js"):
            assert "javascript" in ctype, (ref, ctype)
        if ref.endswith(".css"):
            assert "text/css" in ctype, (ref, ctype)


def test_static_bundles_have_no_source_map_or_cdn_reference(doq_node: NodeProc) -> None:
    for name in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"):
        status, _, body = fetch(f"{doq_node.http_url}/static/{name}")
        assert status == 200 and len(body) > 10_000
        assert b"sourceMappingURL=" + name.encode() not in body
        assert b"cdn.jsdelivr.net" not in body and b"fonts.googleapis.com" not in body
