"""Backups versioned by Raft index: the file format (`format`) and backup/restore (`ops`)."""
