"""The ``lookupdec`` command line: thin click commands over the library.

Heavy imports (torch, transformers) happen inside the commands, so
``lookupdec --help`` is instant.
"""
import click

from lookupdec.cli.generate import cost_curve_cmd, generate_cmd
from lookupdec.cli.index import build_index_cmd, compact_cmd, index_info_cmd
from lookupdec.cli.serve import serve_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lookupdec")
def main() -> None:
    """Lossless lookup-based speculative decoding."""


main.add_command(build_index_cmd)
main.add_command(index_info_cmd)
main.add_command(compact_cmd)
main.add_command(generate_cmd)
main.add_command(cost_curve_cmd)
main.add_command(serve_cmd)
