"""DigitalOcean's managed Load Balancer, emulated: an address in the world that terminates HTTPS
with the certificate DigitalOcean issued for the domain and forwards to the Droplets that carry
its tag, checking each one's health, as the resource's inputs say.

It is a Caddy of its own in the world's namespace (the product is DigitalOcean's, not ours: how
it balances is not the program's concern, only that it forwards what the resource declares):
the entry port and protocol, the target port over HTTP on the VPC, the health check's path,
interval and thresholds, the idle timeout, and the IPv4 allow list (`firewall.allows`). Its
traffic to the Droplets comes from its VPC address, which their firewalls admit by the Load
Balancer's id (net.World.add_load_balancer). Behaviour relied on (DigitalOcean's OpenAPI,
load_balancers/models/load_balancer_base.yml, forwarding_rule.yml, health_check.yml): a
Droplet joins once its checks pass `healthy_threshold` times and leaves after
`unhealthy_threshold` failures; no algorithm is chosen.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from sandbox import CADDY

from stack import net


class LoadBalancer:
    def __init__(
        self,
        world: net.World,
        folder: Path,
        inputs: dict[str, Any],
        public_ip: str,
        vpc_ip: str,
        certificate: tuple[str, str],
    ) -> None:
        self.world, self.folder = world, folder
        self.inputs, self.public_ip, self.vpc_ip = inputs, public_ip, vpc_ip
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cert.pem").write_text(certificate[0])
        key = folder / "key.pem"
        key.touch(mode=0o600)
        key.write_text(certificate[1])
        self.targets: list[str] = []
        self.config = folder / "Caddyfile"
        self.config.write_text(self.caddyfile())
        self.proc = world.popen(
            [str(CADDY), "run", "--config", str(self.config), "--adapter", "caddyfile"],
            stdout=subprocess.DEVNULL,
            stderr=(folder / "caddy.log").open("ab"),
        )
        self._wait_listening()

    @property
    def tag(self) -> str:
        return str(self.inputs["dropletTag"])

    def caddyfile(self) -> str:
        # Numbers arrive as the wire's doubles (a protobuf Struct): Caddy wants integers.
        rule = {k: _whole(v) for k, v in self.inputs["forwardingRules"][0].items()}
        check = {k: _whole(v) for k, v in self.inputs["healthcheck"].items()}
        allows = [
            a.removeprefix("cidr:") for a in (self.inputs.get("firewall") or {}).get("allows", [])
        ]
        gate = f"\n\t@denied not remote_ip {' '.join(allows)}\n\tabort @denied" if allows else ""
        upstreams = " ".join(f"{ip}:{rule['targetPort']}" for ip in self.targets) or "127.0.0.1:9"
        interval = check["checkIntervalSeconds"]
        return f"""{{
	admin unix/{self.folder}/admin.sock
	auto_https off
	servers {{
		timeouts {{
			idle {_whole(self.inputs.get("httpIdleTimeoutSeconds", 60))}s
		}}
	}}
}}
https://:{rule["entryPort"]} {{
	bind {self.public_ip}
	tls {self.folder}/cert.pem {self.folder}/key.pem{gate}
	reverse_proxy {upstreams} {{
		health_uri {check["path"]}
		health_port {check["port"]}
		health_interval {interval}s
		health_timeout {check["responseTimeoutSeconds"]}s
		health_fails {check["unhealthyThreshold"]}
		health_passes {check["healthyThreshold"]}
		flush_interval -1
		transport http {{
			local_address {self.vpc_ip}
		}}
	}}
}}
"""

    def set_targets(self, addresses: list[str]) -> None:
        """The private addresses of the Droplets with its tag, as DigitalOcean re-reads them."""
        if sorted(addresses) == sorted(self.targets):
            return
        self.targets = sorted(addresses)
        self.config.write_text(self.caddyfile())
        admin = f"unix/{self.folder}/admin.sock"
        reload = [str(CADDY), "reload", "--config", str(self.config), "--adapter", "caddyfile"]
        proc = self.world.run([*reload, "--address", admin])
        if proc.returncode != 0:
            raise RuntimeError(f"the emulated Load Balancer did not reload: {proc.stderr}")

    def _wait_listening(self) -> None:
        port = int(self.inputs["forwardingRules"][0]["entryPort"])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.world.reaches(self.public_ip, port):
                return
            time.sleep(0.1)
        log = (self.folder / "caddy.log").read_text(errors="replace")
        raise RuntimeError(f"the emulated Load Balancer did not start:\n{log[-2000:]}")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _whole(value: Any) -> Any:
    """2.0 -> 2 (what a JSON number came as); anything else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
