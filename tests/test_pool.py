"""components/host/pool.py: what a replica of a set is given to leave and rejoin its pool, the
drain's file, notice and stall window, and when it counts back in; the pool's members under
bash (the member phase, a drain for real) are test_pool_scripts.py's."""

from __future__ import annotations

import fnmatch

from pulumi_harness import stack_config
from test_pool_scripts import configs, phase_settings_for

from components.host import gateway, phase_settings, phases, pool
from components.spec import catalog, config


def test_replica_settings_listen_privately_and_drain() -> None:
    raw = stack_config("dev")
    raw["replicas"] = 3
    cfg = config.parse(raw, "dev")
    s = phase_settings_for(cfg, "gateway")
    assert "\tbind 10.110.0.3\n" in str(s["NEMO_CADDYFILE"])
    assert "http://:8080 {" in str(s["NEMO_CADDYFILE"])
    assert s["NEMO_HOST"] == "10.110.0.3"
    service = phase_settings_for(cfg, "service")
    assert service["NEMO_DRAIN_FILE"] == pool.drain_file()
    # Caddy's checks: out after 2 failures 2 s apart, plus one interval for the cycle's phase.
    assert service["NEMO_DRAIN_NOTICE_SECONDS"] == 6
    ready = phase_settings_for(cfg, "ready")
    # Back in the pool after 2 passes 2 s apart, plus one interval.
    assert ready["NEMO_REJOIN_SECONDS"] == 6
    assert ready["NEMO_PROBE_URL"] == "http://10.110.0.3:8080/v1/chat/completions"
    assert ready["NEMO_ACME_PATIENCE"] == 0, "no certificate on a replica"
    # The managed Load Balancer checks every 15 s (a look waits 15 s: a busy vLLM answers
    # late): its notice is 2 failures plus one interval.
    raw["access"] = {**raw["access"], "domain": "api.example.com", "dnsZone": "example.com"}
    raw["access"]["acmeEmail"] = "ops@example.com"
    managed = config.parse(raw, "dev")
    assert managed.balancer_kind == "managed"
    assert phase_settings_for(managed, "service")["NEMO_DRAIN_NOTICE_SECONDS"] == 45


def test_the_stall_window_covers_the_longest_prefill() -> None:
    """vLLM counts a prompt's tokens once its prefill ends: a drain must not call a long
    prefill stuck."""
    lone, caddy, managed = configs()
    for cfg in (caddy, managed):
        for phase in ("reboot", "service"):
            s = phase_settings_for(cfg, phase)
            assert s["NEMO_DRAIN_STALL_SECONDS"] == pool.stall_seconds(cfg)
            assert s["NEMO_DRAIN_SECONDS"] == pool.DRAIN_SECONDS == 600
    assert pool.stall_seconds(caddy) == 60, "32k tokens prefill in well under a minute"
    assert pool.stall_seconds(managed) == 66, "131k tokens at 2000 tokens/s"
    assert phase_settings.drain_settings(lone)["NEMO_DRAIN_FILE"] == ""


def test_a_replicas_upstream_file_is_its_droplets_and_its_join_mark_is_never_imported() -> None:
    """A new Droplet at the same index never writes (so a leave never removes) an old one's file;
    the join mark sits beside the file but out of the gateway's `*.caddy` import, and both reach
    the member phase as rendered (balancer_member)."""
    old, new = pool.upstream_file(1, "111"), pool.upstream_file(1, "222")
    assert old != new
    imported = gateway.Listen().upstreams
    assert fnmatch.fnmatch(old, imported) and fnmatch.fnmatch(new, imported)
    joined = pool.joined_file(1, "111")
    assert joined.startswith(old) and not fnmatch.fnmatch(joined, imported)
    assert pool.metrics_url("10.110.0.3") == f"http://10.110.0.3:{catalog.REPLICA_PORT}/metrics"
    cfg = configs()[1]
    member = phases.balancer_settings(
        cfg, "member", private_ip="10.110.0.3", droplet_id="111", replica=1
    )
    assert member["NEMO_UPSTREAM_FILE"] == old
    assert member["NEMO_UPSTREAM_JOINED_FILE"] == joined
