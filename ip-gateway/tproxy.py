"""TPROXY interception of MQTT (TCP 1883) crossing a gateway box, in the current namespace.

nftables when `nft` is there, iptables otherwise.  Packets to port 1883 that are
routed through the box go to the gateway's transparent listener; the accepted
socket's local address is the broker the client meant.  Policy routing (fwmark 1
-> table 100 -> local) delivers them to the box itself.  Everything is named
c2dtn / table 100 and removed on stop; installing twice replaces, never stacks.
"""

from __future__ import annotations

import shutil
import subprocess

from c2dtn.errors import C2Error

TABLE = "c2dtn_tproxy"
MARK, RT_TABLE = "1", "100"


def _run(*cmd: str, check: bool = True) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode:
        raise C2Error(f"{' '.join(cmd)} failed: {r.stderr.strip()}")


def install(port: int, mqtt_port: int = 1883) -> dict:
    remove({"nft": bool(shutil.which("nft"))})
    if shutil.which("nft"):
        rules = (f"table ip {TABLE} {{\n chain prerouting {{\n  type filter hook prerouting priority mangle; policy accept;\n"
                 f"  tcp dport {mqtt_port} fib daddr type local accept\n"
                 f"  tcp dport {mqtt_port} socket transparent 1 meta mark set {MARK} accept\n"
                 f"  tcp dport {mqtt_port} tproxy to :{port} meta mark set {MARK} accept\n }}\n}}\n")
        r = subprocess.run(["nft", "-f", "-"], input=rules, capture_output=True, text=True)
        if r.returncode:
            raise C2Error(f"installing the TPROXY rules with nft failed: {r.stderr.strip()}")
        kind = True
    elif shutil.which("iptables"):
        _run("iptables", "-t", "mangle", "-N", TABLE, check=False)
        _run("iptables", "-t", "mangle", "-A", TABLE, "-p", "tcp", "--dport", str(mqtt_port), "-m", "addrtype",
             "--dst-type", "LOCAL", "-j", "RETURN")
        _run("iptables", "-t", "mangle", "-A", TABLE, "-p", "tcp", "--dport", str(mqtt_port), "-j", "TPROXY",
             "--on-port", str(port), "--tproxy-mark", MARK)
        _run("iptables", "-t", "mangle", "-I", "PREROUTING", "-j", TABLE)
        kind = False
    else:
        raise C2Error("TPROXY interception needs nft or iptables (Debian: apt-get install nftables)")
    _run("ip", "rule", "add", "fwmark", MARK, "lookup", RT_TABLE)
    _run("ip", "route", "replace", "local", "0.0.0.0/0", "dev", "lo", "table", RT_TABLE)
    return {"nft": kind}


def remove(handle: dict) -> None:
    """Idempotent: removes what install() made, if it is there."""
    if handle.get("nft"):
        _run("nft", "delete", "table", "ip", TABLE, check=False)
    elif shutil.which("iptables"):
        _run("iptables", "-t", "mangle", "-D", "PREROUTING", "-j", TABLE, check=False)
        _run("iptables", "-t", "mangle", "-F", TABLE, check=False)
        _run("iptables", "-t", "mangle", "-X", TABLE, check=False)
    for _ in range(4):  # rules added twice by a crashed run
        _run("ip", "rule", "del", "fwmark", MARK, "lookup", RT_TABLE, check=False)
    _run("ip", "route", "flush", "table", RT_TABLE, check=False)
