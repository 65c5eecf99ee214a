"""Words for an index manifest and a build summary (what ``lookupdec index-info`` prints)."""
from __future__ import annotations

from pathlib import Path

from lookupdec.index.build import IndexSummary
from lookupdec.index.manifest import Manifest


def describe_manifest(manifest: Manifest, path: str | Path) -> str:
    """A few lines describing an index: tokenizer, size, shards and how it was built.

    Example:
        >>> print(describe_manifest(open_index("x.index").manifest, "x.index"))   # doctest: +SKIP
        Index x.index (lookupdec-suffix-index v1, built by lookupdec 0.1.0 on 2025-01-01T00:00:00Z)
        ...
    """
    m = manifest
    tok = m.tokenizer
    lines = [
        f"Index {path} ({m.format} v{m.format_version}, built by lookupdec {m.lookupdec_version or '?'} on {m.created or '?'})",
        f"  manifest:   version {m.version}" + (f" ({len(m.build.get('appends', []))} append(s))" if m.build.get("appends") else ""),
        (f"  tokenizer:  {tok.name}, vocabulary {tok.vocab_size:,} ids, fingerprint {tok.fingerprint[:16]}"
         if tok else "  tokenizer:  none recorded (built from raw token ids)"),
        f"  documents:  {m.documents:,}" + (f" ({m.skipped:,} invalid records skipped)" if m.skipped else ""),
        f"  tokens:     {m.tokens:,}",
        f"  on disk:    {_bytes(m.bytes_on_disk)} in {2 * len(m.shards)} array files"
        + (f" ({m.bytes_on_disk / m.tokens:.2f} bytes/token)" if m.tokens else ""),
        f"  shards:     {len(m.shards)}",
    ]
    for s in m.shards:
        lines.append(f"    {s.tokens.file}: {s.n_tokens:,} tokens, {s.documents:,} documents; "
                     f"suffix array {s.sa.file} ({s.sa.dtype})")
    build = m.build
    if build:
        n = build.get("n_sources", len(build.get("sources", [])))
        src = ", ".join(map(str, build.get("sources", [])[:3])) + (", ..." if n > 3 else "")
        lines.append(f"  built from: {n} source(s): {src}")
        opts = [f"{k}={build[k]}" for k in ("text_field", "shard_tokens", "skip_invalid") if k in build]
        if opts:
            lines.append(f"  options:    {', '.join(opts)}")
    return "\n".join(lines)


def describe_summary(s: IndexSummary) -> str:
    """The closing summary of a build: counts, size, time, and tokenizing vs indexing speed."""
    lines = [
        f"Built {s.path}",
        f"  documents:  {s.documents:,}" + (f" ({s.skipped:,} invalid records skipped)" if s.skipped else ""),
        f"  tokens:     {s.tokens:,}",
        f"  shards:     {s.shards}",
        f"  on disk:    {_bytes(s.bytes_on_disk)}" + (f" ({s.bytes_on_disk / s.tokens:.2f} bytes/token)" if s.tokens else ""),
        f"  time:       {s.seconds:.2f} s",
    ]
    if s.tokenize_seconds > 0:
        lines.append(f"  tokenizing: {s.tokenize_seconds:.2f} s ({s.tokenize_tokens_per_s:,.0f} tokens/s)")
    if s.index_seconds > 0:
        lines.append(f"  indexing:   {s.index_seconds:.2f} s ({s.index_tokens_per_s:,.0f} tokens/s)")
    if s.peak_rss_bytes:
        lines.append(f"  peak RSS:   {s.peak_rss_bytes / 2**20:,.0f} MiB (this process plus {s.jobs if s.jobs > 1 else 'no'} "
                     "worker(s), peaks added)")
    return "\n".join(lines)


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n} B"
