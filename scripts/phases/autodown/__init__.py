"""autodown: delete this Droplet when nobody uses it, or when it has been up too long.

Runs every minute from a systemd timer (the autodown phase installs it): the unit runs
`python3 -m autodown` in the folder the phase installs, which holds this package and the
clients it uses (scripts/clients: transport, digitalocean, prometheus), nothing else. Reads
vLLM's Prometheus /metrics on loopback. The Droplet is busy while the engine makes progress:
tokens generated or prompts read, requests finished. The running/waiting gauges alone do not
count once there is a reading to compare with, because vLLM can leave them non-zero after
aborted requests (vllm-project/vllm#22545): a "running" request that produces nothing for
AUTODOWN_IDLE_MINUTES is idle. AUTODOWN_MAX_HOURS counts from this Droplet's first bootstrap
(the file AUTODOWN_FIRST_BOOTSTRAP, written once by the preflight phase), busy or not.

Installed by the first phase after preflight, before the driver, the downloads and vLLM: a
bootstrap that fails there (a driver that does not build, a download that never ends, vLLM out
of memory at its start) leaves this rule running. AUTODOWN_BOOTSTRAP_MINUTES (empty: no such
rule) is the deadline of a Droplet that never served: until this replica's own metrics have been
read once, it is bootstrapping (busy), and that many minutes after its first bootstrap it is
deleted, whatever else the rule says.

Nothing here may crash into "never": metrics that cannot be read or parsed count as busy (a
broken vLLM never gets a working one killed), but only for AUTODOWN_UNREADABLE_MINUTES in a row
per source (this replica once it served, each peer; empty: no bound): past that the source
counts as idle, so a dead replica cannot keep a set "busy" for ever, and the idle rule takes the
set down. Max hours still fires whatever the metrics say; a state file of any shape is reset;
the run keeps its own deadline (AUTODOWN_RUN_SECONDS) so a hung service cannot hold the next
minute's run. The Droplet is deleted through the DigitalOcean API (its id from the metadata
service, which must be a number) exactly once. Every decision is one log line (the journal);
the token is never printed. Standard library only.

With replicas it runs on replica 0 for the whole set: AUTODOWN_PEER_METRICS_URLS are the other
replicas' /metrics through their private gateways (AUTODOWN_PEER_METRICS_KEY is the API key
they ask for); the set is busy when any replica is. AUTODOWN_PEER_DROPLET_IDS are the other
replicas' Droplet ids: each is deleted by its id, and this one last, once every other is gone,
so that a failed delete leaves the rule running on a Droplet that can try again.

The modules, by role:
    __main__   the run: its settings, state, reading, decision and the delete, wired
    settings   the environment (a root-only EnvironmentFile) read once, numbers checked
    metrics    vLLM's metric names and this minute's reading of the set (clients.prometheus)
    rule       the decision: busy or idle, and whether a limit is past (pure, no I/O)
    state      the state file: load (any shape), save, and the first-bootstrap record
    remove     the delete: the Droplet's id, the DNS record, the peers, this Droplet
    run        the run's deadline and its log line
"""

# Nothing imported here: `-m autodown` runs __main__.py, which imports what it runs, and a test
# imports the one module it tests.
