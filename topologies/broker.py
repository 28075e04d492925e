"""Mosquitto as the real broker in tests, benchmarks and the demo: started in a
testbed node's namespace with its own config file, named c2mosquitto."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from c2dtn.errors import C2Error


def mosquitto_missing() -> str | None:
    return None if shutil.which("mosquitto") else "mosquitto is not installed (make deps installs Debian's mosquitto)"


def start_mosquitto(netns: str, workdir: Path, address: str, port: int = 1883, extra: str = "") -> subprocess.Popen:
    """Start mosquitto in `netns` listening on address:port; returns once it accepts connections."""
    if mosquitto_missing():
        raise C2Error(mosquitto_missing())
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / f"mosquitto-{netns}-{port}.conf"
    conf.write_text(
        f"listener {port} 0.0.0.0\nallow_anonymous true\npersistence false\n"
        f"max_queued_messages 100000\nlog_dest stderr\nlog_type error\nlog_type warning\n{extra}\n"
    )
    from c2dtn.topologies import netns as nsmod

    def accepts() -> bool:
        try:
            with nsmod.socket_in(netns, socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(1)
                s.connect((address, port))
            return True
        except OSError:
            return False

    return nsmod.start_ready(
        netns,
        f'exec -a c2mosquitto mosquitto -c "{conf}"',
        workdir / f"mosquitto-{netns}-{port}.log",
        "mosquitto",
        accepts,
        f"accept connections on {address}:{port}",
    )
