"""lookupdec.index builds, opens and queries an index without importing torch (checked in a fresh process)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import checkout_env
from tests.index_fixtures import tiny_tokenizer, write_jsonl


def test_index_never_imports_torch(tmp_path):
    tiny_tokenizer().save(str(tmp_path / "tokenizer.json"))
    write_jsonl(tmp_path / "c.jsonl", [{"text": "the cat sat on the mat"}, {"text": "the cat ran"}])
    code = textwrap.dedent(f"""
        import sys
        from lookupdec.index import build_index, build_index_from_tokens, open_index
        root = {str(tmp_path)!r}
        s = build_index([root + "/c.jsonl"], root + "/i", tokenizer=root + "/tokenizer.json", progress=False)
        assert s.tokens == 9, s
        idx = open_index(root + "/i", verify=True)
        r = idx.lookup([1, 2], max_n=2, min_n=1)
        assert r.match_len == 2 and r.occurrences == 2, r
        from lookupdec.tokenizer import load_tokenizer
        idx.check_tokenizer(load_tokenizer(root + "/tokenizer.json"))
        build_index_from_tokens([[1, 2, 3]], root + "/j")
        from lookupdec.cli import main  # the CLI module imports no torch either
        heavy = [m for m in ("torch", "transformers") if m in sys.modules]
        assert not heavy, "imported " + ", ".join(heavy)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, env=checkout_env())
