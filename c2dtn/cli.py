"""The one CLI, `c2dtn`, with a subcommand group per component."""

from __future__ import annotations

import sys

import click

from c2dtn import __version__
from c2dtn.errors import C2Error


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="c2dtn")
def cli() -> None:
    """c2dtn: MQTT and CoAP C2 traffic over disrupted tactical links, carried as DTN bundles."""


def _register() -> None:
    from ip_gateway.cli import gateway
    from overlay.cli import node, ping_cmd, recv_cmd, send_cmd
    from perf.cli import perf
    from topologies.cli import topo

    for cmd in (topo, node, gateway, send_cmd, recv_cmd, ping_cmd, perf):
        cli.add_command(cmd)


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
