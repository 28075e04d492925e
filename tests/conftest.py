import os
import shutil
import subprocess

import pytest


def _netns_ok() -> str | None:
    """Why namespace tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root: network namespaces, veth and AF_PACKET"
    for tool in ("ip", "tc", "ethtool"):
        if shutil.which(tool) is None:
            return f"needs the '{tool}' command (make test installs it)"
    probe = subprocess.run(["ip", "netns", "add", "c2probe-test"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "c2probe-test"], capture_output=True)
    return None


def pytest_collection_modifyitems(config, items):
    # checked only when a selected test needs namespaces (no namespace made at every collection)
    if not any("netns" in item.keywords for item in items):
        return
    why = _netns_ok()
    if why is None:
        return
    mark = pytest.mark.skip(reason=why)
    for item in items:
        if "netns" in item.keywords:
            item.add_marker(mark)
