"""`lookupdec build-index`, `lookupdec index-info` and `lookupdec compact`: parse options, call lookupdec.index, print."""
import click

from lookupdec.errors import LookupdecError


@click.command("build-index")
@click.argument("corpus", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("-o", "--output", "--index", "output", required=True, type=click.Path(path_type=str),
              help="Index directory to create (every command names it --index; -o/--output are the same option).")
@click.option("--tokenizer", default=None, metavar="NAME_OR_PATH",
              help="tokenizer.json, .gguf file, local model directory, or cached hub id "
                   "[default: the embedded SmolLM2-135M-Instruct tokenizer].")
@click.option("--text-field", default="text", show_default=True,
              help="JSON field / table column with the text (or a list of chat turns).")
@click.option("--shard-tokens", type=click.IntRange(min=2), default=None,
              help="Maximum tokens (plus one separator per document) per shard [default: 100,000,000].")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Tokenizer processes [default: 1, whose batch encoding already uses every core; N > 1 spawns "
                   "N workers]; the index is the same whatever this is.")
@click.option("--max-memory", default=None, metavar="SIZE",
              help="Memory limit such as 2G: sets the shard size (unless --shard-tokens) and how many shards "
                   "build at once.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="auto", default=None, metavar="[ADDRESS]",
              help="Build on a Ray cluster (pip install 'lookupdec[ray]'): --ray alone joins the running cluster "
                   "or starts a local one; --ray HOST:PORT joins that one. The output path must be shared.")
@click.option("--append", is_flag=True, help="Add the corpus to the existing index at -o as new shards.")
@click.option("--overwrite", is_flag=True, help="Replace an existing index at the output directory.")
@click.option("--skip-invalid", is_flag=True, help="Skip and count malformed records instead of failing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def build_index_cmd(corpus, output, tokenizer, text_field, shard_tokens, jobs, max_memory, ray_address, append,
                    overwrite, skip_invalid, quiet) -> None:
    """Build a suffix-array datastore from CORPUS files (JSONL, Parquet, Arrow, text, or directories)."""
    from lookupdec.index import append_to_index, build_index
    from lookupdec.index.info import describe_summary

    try:
        if append:
            if overwrite or max_memory or ray_address:
                raise click.ClickException("--append adds to the index at -o: it takes none of --overwrite, "
                                           "--max-memory, --ray (use --shard-tokens)")
            summary = append_to_index(list(corpus), output, tokenizer=tokenizer, text_field=text_field,
                                      shard_tokens=shard_tokens, skip_invalid=skip_invalid, progress=not quiet,
                                      jobs=jobs)
        else:
            summary = build_index(
                list(corpus), output, tokenizer=tokenizer, text_field=text_field, shard_tokens=shard_tokens,
                overwrite=overwrite, skip_invalid=skip_invalid, progress=not quiet, jobs=jobs, max_memory=max_memory,
                engine="ray" if ray_address else "local",
                ray_address=None if ray_address in (None, "auto") else ray_address,
            )
    except (LookupdecError, ValueError, TypeError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(describe_summary(summary))


def _index_dir(positional: str | None, option: str | None) -> str:
    """The index directory given as INDEX_DIR or as --index (the name every command uses), exactly once."""
    if positional is not None and option is not None:
        raise click.UsageError("give the index directory once: INDEX_DIR or --index DIR")
    if positional is None and option is None:
        raise click.UsageError("missing the index directory: INDEX_DIR or --index DIR")
    return positional if positional is not None else option


_INDEX_OPTION = click.option("--index", "index_opt", type=click.Path(path_type=str), default=None, metavar="DIR",
                             help="The index directory (the same as INDEX_DIR).")


@click.command("index-info")
@click.argument("index_dir", required=False, type=click.Path(path_type=str))
@_INDEX_OPTION
@click.option("--verify", is_flag=True, help="Also check every file's checksum and suffix array (reads the whole index).")
def index_info_cmd(index_dir, index_opt, verify) -> None:
    """Describe the index at INDEX_DIR (or --index DIR)."""
    from lookupdec.index import open_index

    index_dir = _index_dir(index_dir, index_opt)
    from lookupdec.index.info import describe_manifest

    try:
        index = open_index(index_dir, verify=verify)
    except LookupdecError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(describe_manifest(index.manifest, index_dir))
    if verify:
        click.echo("  verified:   checksums, separators and suffix arrays are all correct")


@click.command("compact")
@click.argument("index_dir", required=False, type=click.Path(path_type=str))
@_INDEX_OPTION
@click.option("--shard-tokens", "--target-shard-tokens", "shard_tokens", type=click.IntRange(min=2), default=None,
              help="Largest merged shard, as build-index's --shard-tokens [default: the index's shard size].")
def compact_cmd(index_dir, index_opt, shard_tokens) -> None:
    """Merge consecutive small shards of INDEX_DIR or --index DIR (a new manifest version; open readers keep working)."""
    from lookupdec.index import compact_index
    from lookupdec.index.manifest import read_manifest

    index_dir = _index_dir(index_dir, index_opt)
    try:
        before = len(read_manifest(index_dir).shards)
        m = compact_index(index_dir, shard_tokens=shard_tokens)
    except (LookupdecError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if len(m.shards) == before:
        click.echo(f"{index_dir}: nothing to merge ({before} shards, manifest version {m.version})")
    else:
        click.echo(f"Compacted {index_dir}: {before} shards -> {len(m.shards)}, manifest version {m.version}")
