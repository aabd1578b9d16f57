"""TLS for doq: the cluster CA and node certificates (`certs`), when a node runs secure
(`mode`), and the gRPC/HTTP credentials built from them (`creds`). docs/security.md."""
