"""The one CLI, `c2dtn`, with a subcommand group per component."""

from __future__ import annotations

import importlib.util
import sys

import click

from c2dtn import __version__
from c2dtn.errors import C2Error
from c2dtn.overlay.envelope import CONTAINER_VERSION


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
# the wire version beside the release: boxes of one network must speak the same (the changelog)
@click.version_option(
    __version__, prog_name="c2dtn", message=f"%(prog)s %(version)s, container version {CONTAINER_VERSION}"
)
def cli() -> None:
    """c2dtn: MQTT and CoAP C2 traffic over disrupted tactical links, carried as DTN bundles."""


PERF_EXTRA = ("rich", "matplotlib", "paho")  # what pyproject's [perf] extra brings


def _needs_extra(name: str, missing: str) -> click.Command:
    """Stands in for a command group whose extra is not installed (a gateway box has none)."""

    @click.command(
        name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False
    )
    def stand_in() -> None:
        raise click.ClickException(
            f"`c2dtn {name}` is part of the testbed and benchmarks and needs {missing}, "
            "which a gateway box does not install: pip install 'c2dtn[perf]'"
        )

    stand_in.help = f"(needs the [perf] extra: {missing} is not installed)"
    return stand_in


def _register() -> None:
    from c2dtn.ip_gateway.cli import gateway
    from c2dtn.overlay.cli import keys_cmd, node, ping_cmd, recv_cmd, relay, send_cmd

    for cmd in (node, relay, gateway, send_cmd, recv_cmd, ping_cmd, keys_cmd):
        cli.add_command(cmd)
    # the testbed and perf: only where their extra is installed (a gateway box has none of it)
    missing = next((m for m in PERF_EXTRA if importlib.util.find_spec(m) is None), None)
    if missing:
        cli.add_command(_needs_extra("topo", missing))
        cli.add_command(_needs_extra("perf", missing))
        return
    from c2dtn.perf.cli import perf
    from c2dtn.topologies.cli import node_configs_cmd, topo, view_cmd

    cli.add_command(topo)
    cli.add_command(perf)
    cli.add_command(view_cmd, name="view")  # `c2dtn view`: the drill view, as `c2dtn topo view`
    node.add_command(node_configs_cmd)


_register()


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except C2Error as e:
        click.echo(f"c2dtn: error: {e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
