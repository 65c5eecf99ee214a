"""`lookupdec build-index` and `lookupdec index-info` (placeholder until the index lands)."""
import click


@click.command("build-index")
def build_index_cmd() -> None:
    """Build a suffix-array datastore from corpus files."""
    raise click.ClickException("build-index is not implemented yet")


@click.command("index-info")
def index_info_cmd() -> None:
    """Describe an index directory."""
    raise click.ClickException("index-info is not implemented yet")
