"""`lookupdec generate` (placeholder until the decoder lands)."""
import click


@click.command("generate")
def generate_cmd() -> None:
    """Generate text with lossless speculative decoding."""
    raise click.ClickException("generate is not implemented yet")
