"""The node's Kubernetes part: the leader labels its own pod, so that a Service selecting the
label (the `doq` Service of pulumi/) has exactly the leader as its endpoint.

Enabled by `DOQ_K8S_LEADER_LABEL` (the label key, e.g. `doq.io/leader`; the value set is
`"true"`). The node then talks to the Kubernetes API with the pod's in-cluster credentials:
`KUBERNETES_SERVICE_HOST` / `KUBERNETES_SERVICE_PORT`, the service account's `token` (read
again for every request: kubelet rotates it) and `ca.crt` under
`DOQ_K8S_SERVICE_ACCOUNT_DIR` (default: the standard mount). The pod is `DOQ_K8S_POD_NAME`
in `DOQ_K8S_NAMESPACE` (default: the service account's namespace). The only API call is a
JSON merge patch of the pod's labels (RBAC: `patch` on pods); stdlib HTTP only.

`LeaderLabel.on_leader_change(is_leader)` only records what the label should be and
returns at once; a worker thread makes the pod match it, retrying failed API calls with
capped exponential backoff for as long as the process runs. Nothing here ever raises into
the node or stops it. At start the label is removed (a restarted container keeps its pod's
labels, and this process leads nothing yet); `close()` removes it too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
LABEL_VALUE = "true"
# a label key: optional DNS-subdomain prefix and '/', then a name of at most 63 characters
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


class K8sConfigError(ValueError):
    """The label is asked for (`DOQ_K8S_LEADER_LABEL`) but the in-cluster setup is missing."""


class K8sApiError(Exception):
    """One failed API call (HTTP status 0: no answer). Always retried."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"Kubernetes API: {status or 'no answer'}: {detail}")
        self.status = status


@dataclass(frozen=True, slots=True)
class InClusterApi:
    """The Kubernetes API server as a pod sees it: HTTPS to `host:port`, verified with
    `ca_path`, authenticated with the bearer token in `token_path`."""

    host: str
    port: int
    token_path: Path
    ca_path: Path
    timeout_s: float = 5.0

    def patch_pod_labels(self, namespace: str, pod: str, labels: Mapping[str, str | None]) -> None:
        """Merge `labels` into the pod's (None removes a label); raises K8sApiError."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        path = f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods/{urllib.parse.quote(pod)}"
        body = json.dumps({"metadata": {"labels": dict(labels)}}).encode()
        try:
            token = self.token_path.read_text().strip()
            ctx = ssl.create_default_context(cafile=str(self.ca_path))
        except (OSError, ssl.SSLError) as e:
            raise K8sApiError(0, f"cannot read the service account credentials: {e}") from None
        req = urllib.request.Request(
            f"https://{host}:{self.port}{path}", data=body, method="PATCH",
            headers={"Content-Type": "application/merge-patch+json", "Accept": "application/json",
                     "Authorization": f"Bearer {token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=ctx) as r:
                r.read()
        except urllib.error.HTTPError as e:
            detail = e.read(500).decode(errors="replace")
            raise K8sApiError(e.code, detail or str(e.reason)) from None
        except (OSError, ValueError) as e:  # refused, timeout, TLS, DNS...
            raise K8sApiError(0, str(e)) from None


class LeaderLabel:
    """Keeps the label `key=true` on pod `pod` exactly while this node leads (see the module doc).

    `patch(labels)` applies a label change to the pod and raises on failure (normally
    `InClusterApi.patch_pod_labels` bound to the pod). Thread-safe; `on_leader_change`
    never blocks. The latest wish wins: flapping leadership ends with the last state.
    """

    def __init__(
        self,
        patch: Callable[[Mapping[str, str | None]], None],
        key: str,
        *,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 10.0,
        rng: random.Random | None = None,
    ) -> None:
        self._patch = patch
        self.key = key
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._rng = rng or random.Random()
        self._cond = threading.Condition()
        self._want = False  # removed at start: a stale label of a previous container
        self._have: bool | None = None  # what the API last confirmed (None: unknown)
        self._closing = False
        self._stopped = False
        self.failures = 0  # API calls that failed so far (each was retried)
        self._thread = threading.Thread(target=self._run, name="doq-k8s-leader-label", daemon=True)
        self._follow: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the worker (it first removes a stale label)."""
        self._thread.start()

    def follow(self, is_leader: Callable[[], bool], *, interval_s: float = 0.2) -> None:
        """Start, and keep the label in step with `is_leader()` (e.g. `Node.is_leader`,
        checked every `interval_s` on the running loop) until `aclose()`."""
        self.start()
        self._follow = asyncio.create_task(_follow(is_leader, self.on_leader_change, interval_s),
                                           name="doq-k8s-leader-follow")

    async def aclose(self, timeout_s: float = 5.0) -> bool:
        """`close()` from the event loop (stops following first)."""
        if self._follow is not None:
            self._follow.cancel()
        return await asyncio.to_thread(self.close, timeout_s)

    def on_leader_change(self, is_leader: bool) -> None:
        """This node now leads (True) or no longer does (False). Returns at once."""
        with self._cond:
            if not self._closing:
                self._want = is_leader
                self._cond.notify_all()

    @property
    def labelled(self) -> bool | None:
        """Whether the pod carries the label as last confirmed by the API (None: not yet)."""
        with self._cond:
            return self._have

    def close(self, timeout_s: float = 5.0) -> bool:
        """Remove the label (this process leads no more) and stop the worker; waits up to
        `timeout_s` for the API to take it. Returns whether the pod is unlabelled."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._closing = True
            self._want = False
            self._cond.notify_all()
            while self._have is not False and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            self._stopped = True
            self._cond.notify_all()
            done = self._have is False
        if not done:
            log.warning("could not remove the leader label %s from the pod in %.1fs", self.key, timeout_s)
        return done

    def _run(self) -> None:
        delay_s = self._backoff_initial_s
        while True:
            with self._cond:
                while self._want == self._have and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                want = self._want
            try:
                self._patch({self.key: LABEL_VALUE if want else None})
            except Exception as e:  # noqa: BLE001 - every failure is retried, none stops the node
                self.failures += 1
                log.warning("leader label %s=%s not applied (retry in %.1fs): %s",
                            self.key, want, delay_s, e)
                with self._cond:
                    if not self._stopped:
                        self._cond.wait(delay_s * self._rng.uniform(0.5, 1.0))
                delay_s = min(self._backoff_max_s, delay_s * 2)
                continue
            delay_s = self._backoff_initial_s
            with self._cond:
                self._have = want
                self._cond.notify_all()
            log.info("pod %s leader label %s", "has the" if want else "no longer has the", self.key)


def from_env(environ: Mapping[str, str] | None = None) -> LeaderLabel | None:
    """The pod's `LeaderLabel` when `DOQ_K8S_LEADER_LABEL` is set (not started), else None.
    Raises K8sConfigError naming what is missing when the in-cluster setup is incomplete."""
    env = os.environ if environ is None else environ
    key = env.get("DOQ_K8S_LEADER_LABEL", "").strip()
    if not key:
        return None
    if not _LABEL_KEY.fullmatch(key):
        raise K8sConfigError(f"DOQ_K8S_LEADER_LABEL must be a label key such as doq.io/leader, got {key!r}")
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port.isdigit():
        raise K8sConfigError("DOQ_K8S_LEADER_LABEL is set but KUBERNETES_SERVICE_HOST/PORT are not: "
                             "the leader label needs the in-cluster Kubernetes API")
    sa = Path(env.get("DOQ_K8S_SERVICE_ACCOUNT_DIR", SERVICE_ACCOUNT_DIR))
    for name in ("token", "ca.crt"):
        if not (sa / name).is_file():
            raise K8sConfigError(f"DOQ_K8S_LEADER_LABEL is set but {sa / name} is missing: mount the pod's "
                                 "service account token (automountServiceAccountToken)")
    pod = env.get("DOQ_K8S_POD_NAME", "")
    if not pod:
        raise K8sConfigError("DOQ_K8S_LEADER_LABEL is set but DOQ_K8S_POD_NAME is not (the downward "
                             "API's metadata.name)")
    namespace = env.get("DOQ_K8S_NAMESPACE", "")
    if not namespace:
        try:
            namespace = (sa / "namespace").read_text().strip()
        except OSError:
            raise K8sConfigError("DOQ_K8S_NAMESPACE is not set and the service account has no "
                                 "namespace file") from None
    api = InClusterApi(host, int(port), sa / "token", sa / "ca.crt")
    return LeaderLabel(lambda labels: api.patch_pod_labels(namespace, pod, labels), key)


async def _follow(is_leader: Callable[[], bool], on_change: Callable[[bool], None], interval_s: float) -> None:
    """Call `on_change(v)` with `is_leader()` now and whenever it changes, until cancelled."""
    last: bool | None = None
    while True:
        now = bool(is_leader())
        if now != last:
            on_change(now)
            last = now
        await asyncio.sleep(interval_s)
