"""The client door: keys, scopes, the one authorization table and the checks of both
transports (see docs/security.md, "Keys and scopes")."""
