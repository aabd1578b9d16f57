"""The join token's format (`doq.tls.enrollment`) and what a joiner pins from it
(`doq.enrollment_client.pinned_ca`): a token names every CA trusted at its creation (two
during a CA rotation), tokens of the first format (one fingerprint) still load and hash
as they were stored, and malformed ones are refused."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest

from doq.enrollment_client import pinned_ca
from doq.errors import InvalidArgument
from doq.tls.certs import fingerprint, generate_ca
from doq.tls.enrollment import PREFIX, JoinToken, decode_token, encode_token, secret_hash

FP_A, FP_B = "a" * 64, "b" * 64
SECRET, TID = b"s" * 32, b"t" * 16


def _raw(doc: dict[str, Any]) -> str:
    return PREFIX + base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")


def _doc(**kw: Any) -> dict[str, Any]:
    return {"v": 2, "addrs": ["127.0.0.1:8000"], "fps": [FP_A, FP_B], "id": TID.hex(),
            "secret": base64.urlsafe_b64encode(SECRET).decode().rstrip("="), "exp": 123, **kw}


def test_a_token_carries_every_ca_it_was_made_under_in_order() -> None:
    t = JoinToken(["h:1"], (FP_A, FP_B), TID, SECRET, 5)
    assert decode_token(encode_token(t)) == t
    assert secret_hash(t.ca_fingerprints, SECRET) != secret_hash((FP_A,), SECRET)  # bound to the whole list
    assert secret_hash((FP_A, FP_B), SECRET) != secret_hash((FP_B, FP_A), SECRET)


def test_a_token_of_the_first_format_loads_and_hashes_as_it_was_stored() -> None:
    """`{"v":1, "fp": ...}` (one CA): its `ca_fingerprints` is that one, and the hash the
    leader checks is the one it stored when it made the token (SHA-256 over the one
    fingerprint and the secret)."""
    doc = _doc(v=1, fp=FP_A)
    del doc["fps"]
    t = decode_token(_raw(doc))
    assert t.ca_fingerprints == (FP_A,)
    stored = hashlib.sha256(b"doq-join-token\0" + FP_A.encode() + b"\0" + SECRET).digest()
    assert secret_hash(t.ca_fingerprints, t.secret) == stored == secret_hash(FP_A, SECRET)


@pytest.mark.parametrize("doc", [
    _doc(v=3),
    _doc(fps=[]),
    _doc(fps=[FP_A, FP_A]),
    _doc(fps=[FP_A] + ["c" * 63 + str(i) for i in range(8)]),
    _doc(fps=["A" * 64]),
    _doc(fps=[FP_A + ",", FP_B]),
    _doc(fps=FP_A),
    _doc(v=1),  # the first format has "fp", not "fps"
], ids=["version", "none", "duplicate", "too-many", "not-lower-hex", "comma", "not-a-list", "v1-without-fp"])
def test_malformed_tokens_are_refused(doc: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument) as e:
        decode_token(_raw(doc))
    assert e.value.reason == "INVALID_JOIN_TOKEN"


def test_a_joiner_trusts_exactly_the_certificates_of_the_bundle_its_token_names() -> None:
    old, new, other = (generate_ca()[0] for _ in range(3))
    bundle = new + old
    fp_old, fp_new = fingerprint(old), fingerprint(new)
    assert pinned_ca(bundle, [fp_old, fp_new]) == new + old
    assert pinned_ca(bundle, [fp_old]) == old
    assert pinned_ca(bundle + other, [fp_new]) == new  # a certificate the token does not name: not trusted
    assert pinned_ca(bundle, [fingerprint(other)]) is None
