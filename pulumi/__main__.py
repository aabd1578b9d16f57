"""doq on Kubernetes: `pulumi up` in this directory deploys a self-forming doq cluster.

- StatefulSet `doq` (pods doq-0..doq-N-1, one PersistentVolumeClaim each): the node id is
  the pod name; every pod listens on 0.0.0.0 and announces
  `<pod>.doq-internal.<namespace>.svc`; `doq k8s-start` decides how it starts: a pod whose
  volume holds data restarts from it as itself; every other pod joins through
  `doq-internal`, except doq-0 on an empty volume, which bootstraps only when every other
  replica says its store is empty (it joins when any belongs to a cluster, waits while any
  is silent): a cluster is never bootstrapped twice.
- Service `doq-internal`: headless, publishes not-ready addresses (peers find each other
  while the cluster forms).
- Service `doq`: selects the pod carrying `doq.io/leader=true`, the label the leader puts
  on its own pod (doq/node/k8s_leader.py) through a Role that allows only get/patch on
  these pods.
- PodDisruptionBudget keeping a quorum; pods spread across nodes; non-root, read-only root
  filesystem; probes on /livez and /readyz over HTTPS.
- Secure by default: at the first `pulumi up` the program generates (with `cryptography`)
  the cluster CA, one certificate per pod and the first admin key; they live in the stack's
  state as Pulumi secrets. The pods get the CA certificate and the pod certificates (Secret
  `doq-tls`) and the admin key (Secret `doq-admin-key`); the CA's private key never leaves
  the stack. A NetworkPolicy lets only doq pods reach the Raft port.

Stack config (`pulumi config set doq:KEY VALUE`): see `load_settings` and README.md.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import secrets
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi.dynamic
import pulumi_kubernetes as k8s

APP = "doq"
INTERNAL_SERVICE = "doq-internal"
LEADER_SERVICE = "doq"
LEADER_LABEL = "doq.io/leader"  # what the leader sets on its own pod (value "true")
DEFAULT_IMAGE = "doq:0.1.0"  # the Dockerfile at the repository root, tagged with the package version
DATA_DIR = "/var/lib/doq"
TLS_SECRET = "doq-tls"  # ca.crt, and <pod>.crt / <pod>.key for every pod
ADMIN_KEY_SECRET = "doq-admin-key"  # admin.key: the first admin key
TLS_MOUNT = "/etc/doq/tls"  # `doq k8s-start --tls-secret-dir` installs the pod's files from here
ADMIN_KEY_MOUNT = "/etc/doq/admin"
ADMIN_KEY_FILE = "admin.key"
SECRET_FILE_MODE = 0o440  # owner root, group the pod's fsGroup (the doq user): read only
UID = 10001  # the image's non-root user (Dockerfile)
# Kubelet's health checks: the paths the HTTP gateway serves.
LIVENESS_PATH = "/livez"
READINESS_PATH = "/readyz"
STARTUP_PROBE_PERIOD_S = 5
STARTUP_PROBE_FAILURES = 120  # a restart that rebuilds a large state may take up to 10 minutes
# `doq serve` on SIGTERM: a leader hands over within max(1 s, 3 election timeouts), then
# in-flight gRPC calls get 5 s and the label removal up to 5 s; the rest is margin.
SHUTDOWN_S = 5 + 5 + 10

# How a pod starts is decided by `doq k8s-start` (doq/k8s_start.py, tested; docs/deploy.md):
# a volume with data restarts from it; every pod but doq-0 joins through doq-internal and
# never bootstraps; doq-0 with an empty volume bootstraps only when every other replica
# answers `GET /cluster/identity` that its store is empty, joins when any belongs to a
# cluster, and waits while any is silent (it may hold the cluster). Kubernetes expands
# $(VAR) in commands: this script has none of those on purpose.
START_SCRIPT = """\
exec doq k8s-start
"""


@dataclass(frozen=True)
class Settings:
    """The stack's configuration (key `doq:<camelCase of the field>`), with its defaults."""

    namespace: str = "doq"
    create_namespace: bool = True
    replicas: int = 3
    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    grpc_port: int = 10000
    http_port: int = 8000
    raft_port: int = 9000
    storage_size: str = "10Gi"
    storage_class: str | None = None  # None: the cluster's default StorageClass
    cpu_request: str = "500m"
    cpu_limit: str = "2"
    memory_request: str = "1Gi"
    memory_limit: str = "1Gi"
    election_timeout_ms: int = 1000
    spread: str = "required"  # one pod per node: "required", or "preferred" (small clusters)
    log_level: str = "info"
    ca_generation: int = 1  # raise it to replace the cluster CA and every pod certificate
    ca_rotation: str = ""  # a rolling CA rotation's step: "", "begin", "reissue" (see ClusterTls)


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def load_settings(cfg: pulumi.Config) -> Settings:
    """Read and check the stack config; raises pulumi.RunError with a clear message."""
    d = Settings()

    def text(key: str, default: str) -> str:
        return cfg.get(key) or default

    def number(key: str, default: int) -> int:
        value = cfg.get_int(key)
        return default if value is None else value

    flag = cfg.get_bool("createNamespace")
    s = Settings(
        namespace=text("namespace", d.namespace),
        create_namespace=d.create_namespace if flag is None else flag,
        replicas=number("replicas", d.replicas),
        image=text("image", d.image),
        image_pull_policy=text("imagePullPolicy", d.image_pull_policy),
        grpc_port=number("grpcPort", d.grpc_port),
        http_port=number("httpPort", d.http_port),
        raft_port=number("raftPort", d.raft_port),
        storage_size=text("storageSize", d.storage_size),
        storage_class=cfg.get("storageClass") or d.storage_class,
        cpu_request=text("cpuRequest", d.cpu_request),
        cpu_limit=text("cpuLimit", d.cpu_limit),
        memory_request=text("memoryRequest", d.memory_request),
        memory_limit=text("memoryLimit", d.memory_limit),
        election_timeout_ms=number("electionTimeoutMs", d.election_timeout_ms),
        spread=text("spread", d.spread),
        log_level=text("logLevel", d.log_level),
        ca_generation=number("caGeneration", d.ca_generation),
        ca_rotation=text("caRotation", d.ca_rotation),
    )
    _check(s)
    return s


def _check(s: Settings) -> None:
    if s.replicas < 1 or s.replicas % 2 == 0:
        raise pulumi.RunError(
            f"doq:replicas must be an odd number >= 1 (a Raft cluster of n voters survives the loss of "
            f"(n-1)/2; an even n adds a node without surviving one more loss), got {s.replicas}")
    if not _DNS_LABEL.fullmatch(s.namespace):
        raise pulumi.RunError(f"doq:namespace must be a DNS label (lowercase letters, digits, '-'), got {s.namespace!r}")
    ports = {"grpcPort": s.grpc_port, "httpPort": s.http_port, "raftPort": s.raft_port}
    for key, port in ports.items():
        if not 1 <= port <= 65535:
            raise pulumi.RunError(f"doq:{key} must be within 1..65535, got {port}")
    if len(set(ports.values())) != 3:
        raise pulumi.RunError(f"doq:grpcPort, httpPort and raftPort must differ, got {ports}")
    if not 500 <= s.election_timeout_ms <= 60_000:
        raise pulumi.RunError(f"doq:electionTimeoutMs must be within 500..60000, got {s.election_timeout_ms}")
    if s.spread not in ("required", "preferred"):
        raise pulumi.RunError(f"doq:spread must be 'required' or 'preferred', got {s.spread!r}")
    if s.image_pull_policy not in ("Always", "IfNotPresent", "Never"):
        raise pulumi.RunError(f"doq:imagePullPolicy must be Always, IfNotPresent or Never, got {s.image_pull_policy!r}")
    if max_data_size(s.storage_size) < 16 << 20:
        raise pulumi.RunError(f"doq:storageSize must be at least 100Mi, got {s.storage_size!r}")
    if s.log_level not in ("debug", "info", "warning", "error"):
        raise pulumi.RunError(f"doq:logLevel must be debug, info, warning or error, got {s.log_level!r}")
    if s.ca_generation < 1:
        raise pulumi.RunError(f"doq:caGeneration must be an integer >= 1, got {s.ca_generation}")
    if s.ca_rotation not in ("", "begin", "reissue"):
        raise pulumi.RunError(f"doq:caRotation must be 'begin' or 'reissue' (or unset), got {s.ca_rotation!r}")


# -- names and numbers derived from the settings ----------------------------------------


_QUANTITY = re.compile(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?")
_QUANTITY_UNITS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
                   "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def max_data_size(storage_size: str) -> int:
    """doq's `--max-data-size` for a volume of `storage_size` (a Kubernetes quantity): four
    fifths of the volume less 80 MiB (doq's default `--disk-free-limit` of 64 MiB, and room
    for the lock file). The store's map is the limit plus a reserve of at most a quarter of
    it, which only writes taken under a storage alarm use, so the store never fills the
    volume: past the limit doq refuses writes that grow the state (HTTP 507) and keeps
    draining."""
    m = _QUANTITY.fullmatch(storage_size)
    if m is None:
        raise pulumi.RunError(f"doq:storageSize must be a quantity such as 10Gi or 500Mi, got {storage_size!r}")
    volume = int(m.group(1)) * _QUANTITY_UNITS[m.group(2)]
    return max(0, volume - (80 << 20)) * 4 // 5


def selector_labels() -> dict[str, str]:
    """The labels every doq pod carries and every selector of this program matches."""
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": APP}


def pod_name(i: int) -> str:
    return f"{APP}-{i}"


def pod_host(s: Settings, pod: str) -> str:
    """The DNS name of a pod through the headless Service (resolves while not ready)."""
    return f"{pod}.{INTERNAL_SERVICE}.{s.namespace}.svc"


def join_addrs(s: Settings) -> str:
    """`--join`: the HTTP address of every pod through doq-internal (the joining pod's own
    among them: it does not answer yet, the others are tried)."""
    return ",".join(f"{pod_host(s, pod_name(i))}:{s.http_port}" for i in range(s.replicas))


def max_unavailable(s: Settings) -> int:
    """Voluntary disruptions that still leave a quorum of the n voters: (n-1)/2."""
    return (s.replicas - 1) // 2


def termination_grace_s(s: Settings) -> int:
    """Long enough for a leader to hand over (max(1 s, 3 election timeouts)) and shut down."""
    handover_s = max(1000, 3 * s.election_timeout_ms) / 1000
    return int(handover_s + 0.999) + SHUTDOWN_S


def container_env(s: Settings) -> list[k8s.core.v1.EnvVarArgs]:
    """doq is configured by DOQ_* variables (doq/config.py). Order matters: $(DOQ_NODE_ID)
    expands only in variables defined after it."""

    def field(path: str) -> k8s.core.v1.EnvVarSourceArgs:
        return k8s.core.v1.EnvVarSourceArgs(field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path=path))

    env = k8s.core.v1.EnvVarArgs
    return [
        env(name="DOQ_NODE_ID", value_from=field("metadata.name")),
        env(name="DOQ_DATA_DIR", value=DATA_DIR),
        env(name="DOQ_GRPC_ADDR", value=f"0.0.0.0:{s.grpc_port}"),
        env(name="DOQ_HTTP_ADDR", value=f"0.0.0.0:{s.http_port}"),
        env(name="DOQ_RAFT_ADDR", value=f"0.0.0.0:{s.raft_port}"),
        env(name="DOQ_ADVERTISE_HOST", value=pod_host(s, "$(DOQ_NODE_ID)")),
        env(name="DOQ_JOIN", value=join_addrs(s)),
        # TLS on every port, mutual TLS between the pods, client keys required (pods bind
        # 0.0.0.0, which is secure anyway: said explicitly)
        env(name="DOQ_SECURE", value="1"),
        # the pod's certificate and the CA certificate, installed by `doq k8s-start`
        env(name="DOQ_K8S_TLS_DIR", value=TLS_MOUNT),
        # the bootstrap registers this key as the first admin key (none is generated)
        env(name="DOQ_ADMIN_KEY_FILE", value=f"{ADMIN_KEY_MOUNT}/{ADMIN_KEY_FILE}"),
        # the key a pod joins with (`POST /cluster/join` is an admin action), and that
        # `kubectl exec ... doq ...` commands use
        env(name="DOQ_KEY", value_from=k8s.core.v1.EnvVarSourceArgs(secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(
            name=ADMIN_KEY_SECRET, key=ADMIN_KEY_FILE))),
        env(name="DOQ_ELECTION_TIMEOUT_MS", value=str(s.election_timeout_ms)),
        env(name="DOQ_LOG_LEVEL", value=s.log_level),
        env(name="DOQ_MAX_DATA_SIZE", value=str(max_data_size(s.storage_size))),
        env(name="DOQ_K8S_LEADER_LABEL", value=LEADER_LABEL),
        env(name="DOQ_K8S_POD_NAME", value_from=field("metadata.name")),
        env(name="DOQ_K8S_NAMESPACE", value_from=field("metadata.namespace")),
    ]


def _http_probe(path: str, *, period_s: int, timeout_s: int, failures: int) -> k8s.core.v1.ProbeArgs:
    """An HTTPS GET of `path` (kubelet does not verify the certificate; no key needed)."""
    return k8s.core.v1.ProbeArgs(
        http_get=k8s.core.v1.HTTPGetActionArgs(path=path, port="http", scheme="HTTPS"),
        period_seconds=period_s, timeout_seconds=timeout_s, failure_threshold=failures,
    )


def container(s: Settings) -> k8s.core.v1.ContainerArgs:
    port = k8s.core.v1.ContainerPortArgs
    return k8s.core.v1.ContainerArgs(
        name=APP,
        image=s.image,
        image_pull_policy=s.image_pull_policy,
        command=["/bin/sh", "-c", START_SCRIPT],
        env=container_env(s),
        ports=[port(name="grpc", container_port=s.grpc_port), port(name="http", container_port=s.http_port),
               port(name="raft", container_port=s.raft_port)],
        # the process is up (a restart may take long: the startup probe allows for it; a pod
        # waiting to join answers /livez too)
        startup_probe=_http_probe(LIVENESS_PATH, period_s=STARTUP_PROBE_PERIOD_S, timeout_s=3,
                                  failures=STARTUP_PROBE_FAILURES),
        # /livez fails once the node cannot make progress by itself (its Raft loop failed,
        # its store broke): the kubelet restarts it. Not for a storage alarm (a restart would
        # not free space; the node lifts it by itself once space is freed)
        liveness_probe=_http_probe(LIVENESS_PATH, period_s=10, timeout_s=5, failures=6),
        # a member in contact with the leader, applied up to its commit index (the reasons
        # are in the body otherwise): counts for the PDB and the rollout; a node under a
        # storage alarm stays ready, so consumers keep draining it
        readiness_probe=_http_probe(READINESS_PATH, period_s=5, timeout_s=3, failures=2),
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": s.cpu_request, "memory": s.memory_request},
            limits={"cpu": s.cpu_limit, "memory": s.memory_limit},
        ),
        security_context=k8s.core.v1.SecurityContextArgs(
            run_as_non_root=True, run_as_user=UID, run_as_group=UID, read_only_root_filesystem=True,
            allow_privilege_escalation=False, capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
        ),
        volume_mounts=[k8s.core.v1.VolumeMountArgs(name="data", mount_path=DATA_DIR),
                       k8s.core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp"),
                       k8s.core.v1.VolumeMountArgs(name="tls", mount_path=TLS_MOUNT, read_only=True),
                       k8s.core.v1.VolumeMountArgs(name="admin-key", mount_path=ADMIN_KEY_MOUNT, read_only=True)],
    )


def affinity(s: Settings) -> k8s.core.v1.AffinityArgs:
    """At most one doq pod per node: required by default, preferred with doq:spread=preferred."""
    term = k8s.core.v1.PodAffinityTermArgs(
        label_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels()),
        topology_key="kubernetes.io/hostname",
    )
    if s.spread == "required":
        anti = k8s.core.v1.PodAntiAffinityArgs(required_during_scheduling_ignored_during_execution=[term])
    else:
        anti = k8s.core.v1.PodAntiAffinityArgs(preferred_during_scheduling_ignored_during_execution=[
            k8s.core.v1.WeightedPodAffinityTermArgs(weight=100, pod_affinity_term=term)])
    return k8s.core.v1.AffinityArgs(pod_anti_affinity=anti)


def pod_spec(s: Settings, service_account: pulumi.Input[str]) -> k8s.core.v1.PodSpecArgs:
    return k8s.core.v1.PodSpecArgs(
        service_account_name=service_account,
        automount_service_account_token=True,  # the leader label needs the API
        termination_grace_period_seconds=termination_grace_s(s),
        security_context=k8s.core.v1.PodSecurityContextArgs(
            run_as_non_root=True, run_as_user=UID, run_as_group=UID, fs_group=UID,
            fs_group_change_policy="OnRootMismatch",
            seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
        ),
        affinity=affinity(s),
        # and across zones where the cluster has them
        topology_spread_constraints=[k8s.core.v1.TopologySpreadConstraintArgs(
            max_skew=1, topology_key="topology.kubernetes.io/zone", when_unsatisfiable="ScheduleAnyway",
            label_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels()),
        )],
        containers=[container(s)],
        volumes=[
            k8s.core.v1.VolumeArgs(name="tmp", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit="256Mi")),
            k8s.core.v1.VolumeArgs(name="tls", secret=k8s.core.v1.SecretVolumeSourceArgs(
                secret_name=TLS_SECRET, default_mode=SECRET_FILE_MODE)),
            k8s.core.v1.VolumeArgs(name="admin-key", secret=k8s.core.v1.SecretVolumeSourceArgs(
                secret_name=ADMIN_KEY_SECRET, default_mode=SECRET_FILE_MODE)),
        ],
    )


# -- keys and certificates: generated by `pulumi up`, kept in the stack as secrets -------
#
# Two dynamic resources (their code runs in `pulumi up`, with `cryptography`; the results
# are stored in the stack's state, encrypted as Pulumi secrets):
# - ClusterTls: the cluster CA and one certificate per pod. Created once; `pulumi up`
#   issues certificates for new pods (scale up) and again for pods whose names changed or
#   whose certificate expires within RENEW_DAYS, with the same CA; a new doq:caGeneration
#   replaces the CA and every certificate at once. doq:caRotation rotates the CA in rolling
#   steps (a rolling restart of the pods after each `pulumi up`): "begin" makes a next CA
#   and the pods trust both (certificates unchanged); "reissue" signs every certificate
#   with the next CA (still trusting both); unset again, the next CA is the CA and the old
#   one is trusted no more (unset after "begin": the rotation is abandoned). Pods of two
#   neighbouring steps always accept each other's certificates. The private keys are in
#   no pod: pods cannot issue certificates, so only this stack can admit a member.
# - AdminKey: the first admin key (`doq_<id>_<secret>`, as doq makes them). The bootstrap
#   registers it (DOQ_ADMIN_KEY_FILE); it never changes with `pulumi up`. The pods get it
#   unless the secret config doq:adminKey gives another (`admin_token`: how it is rotated).
# The code is self-contained (no import of doq): dynamic providers are serialized with
# the program and run by Pulumi's Python provider host.

CA_DAYS = 3650
NODE_DAYS = 825
RENEW_DAYS = 30


def _tls_key_pem(key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _tls_new_ca() -> tuple[str, str]:
    """A self-signed ECDSA P-256 CA (as doq's own, doq/tls/certs.py): (cert PEM, key PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "doq cluster CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode(), _tls_key_pem(key)


def _tls_issue(ca_cert_pem: str, ca_key_pem: str, pod: str, hosts: list[str]) -> tuple[str, str]:
    """A certificate for `pod` (common name = the node id, which the peer door checks;
    `hosts` as names), for server and client use: (cert PEM, key PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate(ca_cert_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, pod)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(min(now + datetime.timedelta(days=NODE_DAYS), ca.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode(), _tls_key_pem(key)


def _tls_expires_soon(cert_pem: str) -> bool:
    from cryptography import x509

    left = x509.load_pem_x509_certificate(cert_pem.encode()).not_valid_after_utc - datetime.datetime.now(
        datetime.UTC)
    return left < datetime.timedelta(days=RENEW_DAYS)


def _tls_issued_by(cert_pem: str, ca_cert_pem: str) -> bool:
    from cryptography import x509

    try:
        x509.load_pem_x509_certificate(cert_pem.encode()).verify_directly_issued_by(
            x509.load_pem_x509_certificate(ca_cert_pem.encode()))
    except Exception:  # noqa: BLE001 - another issuer, whatever cryptography raises for it
        return False
    return True


def _tls_outputs(news: dict[str, Any], olds: dict[str, Any] | None) -> dict[str, Any]:
    """The CA (kept from `olds` unless there are none or the generation changed), a
    rolling rotation's next CA (doq:caRotation, above), the trust bundle the pods get
    (the signing CA first), and a certificate per pod of `news["nodes"]` from the signing
    CA (kept when its names are the same, it is of the signing CA and not about to expire)."""
    same_ca = olds is not None and olds.get("ca_generation") == news["ca_generation"] and olds.get("ca_key")
    if same_ca:
        assert olds is not None
        ca_cert, ca_key = olds["ca_cert"], olds["ca_key"]
    else:
        ca_cert, ca_key = _tls_new_ca()
    rotation = news.get("ca_rotation") or ""
    was = (olds or {}).get("ca_rotation") or ""
    nxt = (olds["next_ca_cert"], olds["next_ca_key"]) if same_ca and olds and olds.get("next_ca_key") else None
    if rotation == "" and nxt is not None:
        if was == "reissue":  # the rotation's end: the next CA is the CA, the old one goes
            ca_cert, ca_key = nxt
        nxt = None  # (after "begin": abandoned)
    elif rotation == "begin" and nxt is None:
        nxt = _tls_new_ca()
    elif rotation == "reissue" and nxt is None:
        raise Exception("doq:caRotation reissue needs a rotation begun: set doq:caRotation begin, pulumi up, "
                        "and let every pod take it (doq tls status) first")
    sign_cert, sign_key = nxt if rotation == "reissue" and nxt else (ca_cert, ca_key)
    trust = [sign_cert, *(c for c in (ca_cert, nxt[0] if nxt else None) if c and c != sign_cert)]
    certs, keys = {}, {}
    for pod, hosts in news["nodes"].items():
        old = (olds or {}).get("certs", {}).get(pod)
        if same_ca and olds is not None and olds["nodes"].get(pod) == hosts and old \
                and _tls_issued_by(old, sign_cert) and not _tls_expires_soon(old):
            certs[pod], keys[pod] = old, olds["keys"][pod]
        else:
            certs[pod], keys[pod] = _tls_issue(sign_cert, sign_key, pod, hosts)
    return {"nodes": news["nodes"], "ca_generation": news["ca_generation"], "ca_rotation": rotation,
            "ca_cert": ca_cert, "ca_key": ca_key, "next_ca_cert": nxt[0] if nxt else None,
            "next_ca_key": nxt[1] if nxt else None, "trust_bundle": "".join(trust), "certs": certs, "keys": keys}


class _ClusterTlsProvider(pulumi.dynamic.ResourceProvider):
    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        return pulumi.dynamic.CreateResult(id_=f"doq-tls-{secrets.token_hex(8)}", outs=_tls_outputs(props, None))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        renew = any(_tls_expires_soon(c) for c in olds.get("certs", {}).values())
        changed = (olds.get("nodes") != news["nodes"] or olds.get("ca_generation") != news["ca_generation"]
                   or (olds.get("ca_rotation") or "") != (news.get("ca_rotation") or ""))
        return pulumi.dynamic.DiffResult(changes=changed or renew, replaces=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        return pulumi.dynamic.UpdateResult(outs=_tls_outputs(news, olds))


class ClusterTls(pulumi.dynamic.Resource):
    """The cluster CA and the pods' certificates (see above)."""

    ca_cert: pulumi.Output[str]
    ca_key: pulumi.Output[str]
    trust_bundle: pulumi.Output[str]  # the pods' ca.crt and the output caCert: the CA, or both in a rotation
    certs: pulumi.Output[dict[str, str]]
    keys: pulumi.Output[dict[str, str]]

    def __init__(self, name: str, nodes: dict[str, list[str]], ca_generation: int, ca_rotation: str = "",
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(_ClusterTlsProvider(), name,
                         {"nodes": nodes, "ca_generation": ca_generation, "ca_rotation": ca_rotation,
                          "ca_cert": None, "ca_key": None, "next_ca_cert": None, "next_ca_key": None,
                          "trust_bundle": None, "certs": None, "keys": None},
                         pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
                             additional_secret_outputs=["ca_key", "next_ca_key", "keys"])))


class _AdminKeyProvider(pulumi.dynamic.ResourceProvider):
    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        key_id = secrets.token_hex(6)  # as doq/auth/tokens.py: 12 hex digits, 256-bit secret
        return pulumi.dynamic.CreateResult(id_=key_id, outs={"key_id": key_id,
                                                            "token": f"doq_{key_id}_{secrets.token_urlsafe(32)}"})


class AdminKey(pulumi.dynamic.Resource):
    """The first admin key (see above)."""

    key_id: pulumi.Output[str]
    token: pulumi.Output[str]

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(_AdminKeyProvider(), name, {"key_id": None, "token": None},
                         pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["token"])))


def cert_hosts(s: Settings, pod: str) -> list[str]:
    """The names a pod's certificate carries: its node id (the peer door's check), its
    doq-internal names, the leader Service's names (clients reach the leader through it),
    and loopback (`kubectl port-forward`, `kubectl exec`)."""
    internal = pod_host(s, pod)
    leader = f"{LEADER_SERVICE}.{s.namespace}.svc"
    return [pod, internal, f"{internal}.cluster.local", LEADER_SERVICE, f"{LEADER_SERVICE}.{s.namespace}", leader,
            f"{leader}.cluster.local", "localhost", "127.0.0.1", "::1"]


def tls_secret(s: Settings, ns: pulumi.Input[str], tls: ClusterTls) -> k8s.core.v1.Secret:
    """ca.crt (the trust bundle: the CA, or both CAs during a rolling rotation), and
    <pod>.crt / <pod>.key for every pod: never a CA's key."""
    def files(args: list[Any]) -> dict[str, str]:
        ca_cert, certs, keys = args
        out = {"ca.crt": ca_cert}
        for pod in sorted(certs):
            out[f"{pod}.crt"], out[f"{pod}.key"] = certs[pod], keys[pod]
        return out

    data: pulumi.Output[Any] = pulumi.Output.all(tls.trust_bundle, tls.certs, tls.keys).apply(files)
    return k8s.core.v1.Secret("doq-tls-secret", metadata=metadata(ns, TLS_SECRET), type="Opaque",
                              string_data=pulumi.Output.secret(data))


_TOKEN = re.compile(r"doq_[0-9a-f]{1,64}_[A-Za-z0-9_-]{16,}")


def admin_token(cfg: pulumi.Config, generated: AdminKey) -> pulumi.Output[Any]:
    """The admin key the pods get: `doq:adminKey` (secret config: a key made with `doq keys
    create --scope admin`, to rotate the generated one), else the generated one."""
    given = cfg.get_secret("adminKey")
    if given is None:
        return pulumi.Output.secret(_any(generated.token))

    def check(token: str) -> str:
        if not _TOKEN.fullmatch(token.strip()):
            raise pulumi.RunError("doq:adminKey must be a doq key (doq_<id>_<secret>, from `doq keys create "
                                  "--scope admin`); set it with `pulumi config set --secret doq:adminKey ...`")
        return token.strip()

    return pulumi.Output.secret(_any(given.apply(check)))


def admin_key_secret(ns: pulumi.Input[str], token: pulumi.Output[Any]) -> k8s.core.v1.Secret:
    return k8s.core.v1.Secret("doq-admin-key-secret", metadata=metadata(ns, ADMIN_KEY_SECRET), type="Opaque",
                              string_data={ADMIN_KEY_FILE: token})


def _any(value: pulumi.Output[Any]) -> pulumi.Output[Any]:
    """`value` as it is (mypy infers no type parameter for `Output.secret` of an Output[str])."""
    return value


def network_policy(s: Settings, ns: pulumi.Input[str]) -> k8s.networking.v1.NetworkPolicy:
    """Ingress of the doq pods: the Raft port only from doq pods; gRPC and HTTP (clients,
    probes, the pods' own joins and forwarding) from anywhere, where TLS and keys guard them."""
    def port(n: int) -> k8s.networking.v1.NetworkPolicyPortArgs:
        return k8s.networking.v1.NetworkPolicyPortArgs(port=n, protocol="TCP")

    doq_pods = k8s.networking.v1.NetworkPolicyPeerArgs(
        pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels()))
    return k8s.networking.v1.NetworkPolicy("doq-network-policy", metadata=metadata(ns, APP),
                                           spec=k8s.networking.v1.NetworkPolicySpecArgs(
        pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels()),
        policy_types=["Ingress"],
        ingress=[
            k8s.networking.v1.NetworkPolicyIngressRuleArgs(from_=[doq_pods], ports=[port(s.raft_port)]),
            k8s.networking.v1.NetworkPolicyIngressRuleArgs(ports=[port(s.grpc_port), port(s.http_port)]),
        ],
    ))


# -- resources ---------------------------------------------------------------------------


def metadata(namespace: pulumi.Input[str], name: str) -> k8s.meta.v1.ObjectMetaArgs:
    return k8s.meta.v1.ObjectMetaArgs(name=name, namespace=namespace, labels=selector_labels())


def namespace(s: Settings) -> pulumi.Input[str]:
    """The namespace's name; an Output when this program creates it (so everything in it
    is created after it)."""
    if not s.create_namespace:
        return s.namespace
    ns = k8s.core.v1.Namespace("doq-namespace", metadata=k8s.meta.v1.ObjectMetaArgs(name=s.namespace))
    return ns.metadata.name


def service_account(s: Settings, ns: pulumi.Input[str]) -> k8s.core.v1.ServiceAccount:
    return k8s.core.v1.ServiceAccount("doq-service-account", metadata=metadata(ns, APP))


def role(s: Settings, ns: pulumi.Input[str]) -> k8s.rbac.v1.Role:
    """Only what the leader label needs: get and patch of the doq pods themselves."""
    return k8s.rbac.v1.Role("doq-leader-label-role", metadata=metadata(ns, f"{APP}-leader-label"), rules=[
        k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["pods"], verbs=["get", "patch"],
                                   resource_names=[pod_name(i) for i in range(s.replicas)]),
    ])


def role_binding(s: Settings, ns: pulumi.Input[str], r: k8s.rbac.v1.Role,
                 sa: k8s.core.v1.ServiceAccount) -> k8s.rbac.v1.RoleBinding:
    return k8s.rbac.v1.RoleBinding(
        "doq-leader-label-binding", metadata=metadata(ns, f"{APP}-leader-label"),
        role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role", name=r.metadata.name),
        subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=sa.metadata.name, namespace=ns)],
    )


def _service_port(name: str, port: int) -> k8s.core.v1.ServicePortArgs:
    return k8s.core.v1.ServicePortArgs(name=name, port=port, target_port=name, protocol="TCP")


def internal_service(s: Settings, ns: pulumi.Input[str]) -> k8s.core.v1.Service:
    """Headless: one DNS name per pod, published before the pod is ready (peers find each
    other while the cluster forms)."""
    return k8s.core.v1.Service("doq-internal-service", metadata=metadata(ns, INTERNAL_SERVICE),
                               spec=k8s.core.v1.ServiceSpecArgs(
        cluster_ip="None", publish_not_ready_addresses=True, selector=selector_labels(),
        ports=[_service_port("grpc", s.grpc_port), _service_port("http", s.http_port),
               _service_port("raft", s.raft_port)],
    ))


def leader_service(s: Settings, ns: pulumi.Input[str], after: list[pulumi.Resource]) -> k8s.core.v1.Service:
    """Clients' entry point: exactly the pod that labelled itself leader (and is ready).
    Created after the StatefulSet: Pulumi waits for it to have an endpoint."""
    return k8s.core.v1.Service(
        "doq-leader-service", metadata=metadata(ns, LEADER_SERVICE),
        spec=k8s.core.v1.ServiceSpecArgs(
            type="ClusterIP", selector={**selector_labels(), LEADER_LABEL: "true"},
            ports=[_service_port("grpc", s.grpc_port), _service_port("http", s.http_port)],
        ),
        opts=pulumi.ResourceOptions(depends_on=after),
    )


def stateful_set(s: Settings, ns: pulumi.Input[str], sa: k8s.core.v1.ServiceAccount,
                 after: list[pulumi.Resource]) -> k8s.apps.v1.StatefulSet:
    claim = k8s.core.v1.PersistentVolumeClaimSpecArgs(
        access_modes=["ReadWriteOnce"], storage_class_name=s.storage_class,
        resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": s.storage_size}),
    )
    return k8s.apps.v1.StatefulSet(
        "doq-statefulset", metadata=metadata(ns, APP),
        spec=k8s.apps.v1.StatefulSetSpecArgs(
            service_name=INTERNAL_SERVICE,
            replicas=s.replicas,
            # all pods at once: after a full stop no pod can become ready alone (no quorum),
            # so OrderedReady would wait forever for doq-0
            pod_management_policy="Parallel",
            update_strategy=k8s.apps.v1.StatefulSetUpdateStrategyArgs(type="RollingUpdate"),
            selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels()),
            persistent_volume_claim_retention_policy=k8s.apps.v1.StatefulSetPersistentVolumeClaimRetentionPolicyArgs(
                when_deleted="Retain", when_scaled="Retain"),
            template=k8s.core.v1.PodTemplateSpecArgs(
                metadata=k8s.meta.v1.ObjectMetaArgs(labels=selector_labels()),
                spec=pod_spec(s, sa.metadata.name),
            ),
            volume_claim_templates=[k8s.core.v1.PersistentVolumeClaimArgs(
                metadata=k8s.meta.v1.ObjectMetaArgs(name="data", labels=selector_labels()), spec=claim)],
        ),
        opts=pulumi.ResourceOptions(depends_on=after),
    )


def disruption_budget(s: Settings, ns: pulumi.Input[str]) -> k8s.policy.v1.PodDisruptionBudget:
    return k8s.policy.v1.PodDisruptionBudget(
        "doq-pdb", metadata=metadata(ns, APP),
        spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
            max_unavailable=max_unavailable(s),
            selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels()),
        ),
    )


def main() -> dict[str, Any]:
    """Declare everything and export what a user needs; returns the resources by role."""
    cfg = pulumi.Config()
    s = load_settings(cfg)
    ns = namespace(s)
    sa = service_account(s, ns)
    r = role(s, ns)
    binding = role_binding(s, ns, r, sa)
    internal = internal_service(s, ns)
    tls = ClusterTls("doq-cluster-tls", {pod_name(i): cert_hosts(s, pod_name(i)) for i in range(s.replicas)},
                     s.ca_generation, s.ca_rotation)
    admin = AdminKey("doq-admin-key")
    tls_sec = tls_secret(s, ns, tls)
    token = admin_token(cfg, admin)
    admin_sec = admin_key_secret(ns, token)
    policy = network_policy(s, ns)
    sts = stateful_set(s, ns, sa, after=[internal, binding, tls_sec, admin_sec])
    leader = leader_service(s, ns, after=[sts])
    pdb = disruption_budget(s, ns)

    local = f"127.0.0.1:{s.http_port}"
    pulumi.export("namespace", ns)
    pulumi.export("leaderService", leader.metadata.name)
    pulumi.export("internalService", internal.metadata.name)
    pulumi.export("leaderGrpc", f"{LEADER_SERVICE}.{s.namespace}.svc:{s.grpc_port}")
    pulumi.export("leaderHttp", f"https://{LEADER_SERVICE}.{s.namespace}.svc:{s.http_port}")
    pulumi.export("members", [pod_host(s, pod_name(i)) for i in range(s.replicas)])
    pulumi.export("portForward", f"kubectl -n {s.namespace} port-forward svc/{LEADER_SERVICE} {s.http_port}:{s.http_port}")
    pulumi.export("docs", f"https://{local}/docs (while portForward runs)")
    # the pods have the admin key in $DOQ_KEY and the CA certificate at TLS_MOUNT
    pulumi.export("clusterStatus", f"kubectl -n {s.namespace} exec {pod_name(0)} -- doq cluster status "
                                   f"--server https://{local} --ca-file {TLS_MOUNT}/ca.crt")
    pulumi.export("caCert", tls.trust_bundle)  # public: clients verify the nodes with it (--ca-file)
    pulumi.export("adminKey", token)  # `pulumi stack output adminKey --show-secrets`
    return {"settings": s, "service_account": sa, "role": r, "role_binding": binding, "internal_service": internal,
            "stateful_set": sts, "leader_service": leader, "pdb": pdb, "cluster_tls": tls, "admin_key": admin,
            "tls_secret": tls_sec, "admin_key_secret": admin_sec, "network_policy": policy}


if __name__ == "__main__":
    main()
