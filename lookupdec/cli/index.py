"""`lookupdec build-index` and `lookupdec index-info`: parse options, call lookupdec.index, print."""
import click

from lookupdec.errors import LookupdecError


@click.command("build-index")
@click.argument("corpus", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=str),
              help="Index directory to create.")
@click.option("--tokenizer", default=None, metavar="NAME_OR_PATH",
              help="tokenizer.json, .gguf file, local model directory, or cached hub id "
                   "[default: the embedded SmolLM2-135M-Instruct tokenizer].")
@click.option("--text-field", default="text", show_default=True,
              help="JSON field / table column with the text (or a list of chat turns).")
@click.option("--shard-tokens", type=click.IntRange(min=2), default=None,
              help="Maximum tokens (plus one separator per document) per shard [default: 100,000,000].")
@click.option("--overwrite", is_flag=True, help="Replace an existing index at the output directory.")
@click.option("--skip-invalid", is_flag=True, help="Skip and count malformed records instead of failing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def build_index_cmd(corpus, output, tokenizer, text_field, shard_tokens, overwrite, skip_invalid, quiet) -> None:
    """Build a suffix-array datastore from CORPUS files (JSONL, Parquet, Arrow, text, or directories)."""
    from lookupdec.index import build_index
    from lookupdec.index.build import DEFAULT_SHARD_TOKENS
    from lookupdec.index.info import describe_summary

    try:
        summary = build_index(
            list(corpus), output, tokenizer=tokenizer, text_field=text_field,
            shard_tokens=shard_tokens or DEFAULT_SHARD_TOKENS, overwrite=overwrite,
            skip_invalid=skip_invalid, progress=not quiet,
        )
    except (LookupdecError, ValueError, TypeError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(describe_summary(summary))


@click.command("index-info")
@click.argument("index_dir", type=click.Path(path_type=str))
@click.option("--verify", is_flag=True, help="Also check every file's checksum and suffix array (reads the whole index).")
def index_info_cmd(index_dir, verify) -> None:
    """Describe the index at INDEX_DIR."""
    from lookupdec.index import open_index
    from lookupdec.index.info import describe_manifest

    try:
        index = open_index(index_dir, verify=verify)
    except LookupdecError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(describe_manifest(index.manifest, index_dir))
    if verify:
        click.echo("  verified:   checksums, separators and suffix arrays are all correct")
