"""Reading a pod's part of a TLS Secret volume as kubelet lays it out (doq.tls.secret_dir):
one version at a time, and a missing file named without any content."""

from __future__ import annotations

from pathlib import Path

import pytest

from doq.tls import secret_dir
from doq.tls.certs import TlsSetupError, generate_ca, issue_node_cert
from doq.tls.secret_dir import check_material, read_secret
from tests.deploy.pods import write_secret


def _version(tag: str) -> dict[str, str]:
    return {"ca.crt": f"ca-{tag}", "doq-0.crt": f"cert-{tag}", "doq-0.key": f"key-{tag}"}


def test_the_files_are_read_through_the_current_version(tmp_path: Path) -> None:
    write_secret(tmp_path, _version("a"), 0o440)
    write_secret(tmp_path, _version("b"), 0o440)
    m = read_secret(tmp_path, "doq-0")
    assert (m.ca_cert, m.node_cert, m.node_key) == (b"ca-b", b"cert-b", b"key-b")
    assert m.digest != read_secret_of(tmp_path, _version("a")).digest


def read_secret_of(root: Path, data: dict[str, str]) -> secret_dir.SecretMaterial:
    other = root / "other"
    write_secret(other, data, 0o440)
    return read_secret(other, "doq-0")


def test_an_update_in_the_middle_of_a_read_gives_the_new_version_whole(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """kubelet swaps `..data` and removes the old version while the files are being read:
    the read starts again on the new version instead of mixing the two."""
    write_secret(tmp_path, _version("a"), 0o440)
    real = Path.read_bytes
    swapped: list[Path] = []

    def read_bytes(self: Path) -> bytes:
        if self.name == "doq-0.crt" and not swapped:
            swapped.append(self)
            write_secret(tmp_path, _version("b"), 0o440)  # the old version's directory is gone
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    m = read_secret(tmp_path, "doq-0")
    assert swapped and (m.ca_cert, m.node_cert, m.node_key) == (b"ca-b", b"cert-b", b"key-b")


def test_a_missing_file_is_named_and_no_content_is_shown(tmp_path: Path) -> None:
    write_secret(tmp_path, {"ca.crt": "ca-secret-content", "doq-0.crt": "cert-secret-content"}, 0o440)
    with pytest.raises(ValueError, match=r"doq-0\.key") as e:
        read_secret(tmp_path, "doq-0")
    assert "secret-content" not in str(e.value)


def test_material_that_does_not_hold_together_is_refused() -> None:
    ca, ca_key = generate_ca()
    other, _ = generate_ca()
    cert, key = issue_node_cert(ca, ca_key, "doq-0", ["localhost"])
    check_material(ca, cert, key)  # the control
    with pytest.raises(TlsSetupError, match="signed by none"):
        check_material(other, cert, key)
    _, other_key = issue_node_cert(ca, ca_key, "doq-1", ["localhost"])
    with pytest.raises(TlsSetupError, match="not the key"):
        check_material(ca, cert, other_key)
    with pytest.raises(TlsSetupError):
        check_material(b"not pem", b"not pem", b"not pem")
