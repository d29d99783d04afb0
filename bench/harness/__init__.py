"""The harness every study shares, written once: the child processes and the protocol they
speak, the throwaway PostgreSQL server, the machine's description, the charts and the reports.

Nothing here imports zincir or a peer: a study's child process imports what it hosts.
"""
