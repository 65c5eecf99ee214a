"""Shared fixtures: tiny random Llama models with a character tokenizer, and
the real embedded model (loaded once per session, for slow tests only)."""
from __future__ import annotations

import functools
import os
import string
import sys

import pytest
import torch

from lookupdec.costs import CostCurve

# The tiny test models are far too small to gain from threads, and on a shared
# 2-core machine intra-op threads contend badly: one thread is ~10x faster here.
torch.set_num_threads(1)

TINY_VOCAB = 128
EOS_ID = 2
# Where the test models live: "cpu" (the default, what CI runs) or e.g. "cuda" to
# run the suite's models on a GPU (LOOKUPDEC_TEST_DEVICE=cuda python -m pytest).
# Models the tests load by name (Decoder(path), the CLI, the server) follow it
# through LOOKUPDEC_DEVICE, the library's default device.
TEST_DEVICE = os.environ.get("LOOKUPDEC_TEST_DEVICE", "cpu")
os.environ["LOOKUPDEC_DEVICE"] = TEST_DEVICE
# The suite measures cost curves and exports tokenizers for dozens of tiny random models: it
# keeps them in the checkout (git-ignored, shared by the workers and by later runs), never in
# the user's own cache. Set LOOKUPDEC_CACHE to put them elsewhere.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout

# A cost curve that prices every width almost alike (5% more at 128 rows than at 1): any draft with
# positive scores pays, whatever the machine running the tests measures (or how loaded it is).
FLAT = CostCurve((1, 128), (10.0, 10.5), 0, (0.0, 0.0), "test", "flat")
os.environ.setdefault("LOOKUPDEC_CACHE", os.path.join(ROOT, ".pytest_cache", "lookupdec"))


def checkout_env(*first: str, **extra: str) -> dict[str, str]:
    """The environment for a child Python run from this checkout: ``benchmarks/child_env.py``'s.

    ``first`` and the checkout go ahead of the caller's own PYTHONPATH, which is kept: packages
    installed through it (a ``pip install --target`` directory, say) stay importable in the child.
    ``extra`` sets further variables.
    """
    child_env = sys.modules.get("bench_child_env") or load_benchmark("child_env")  # loaded once
    return child_env.checkout_env(*first, **extra)


def _native_isas() -> list[str]:
    """The instruction sets the native kernels can run here, best first (each forced in turn, then the best again)."""
    from lookupdec import _native

    isas = [isa for isa in ("avx512", "avx2", "c") if _native.qmatmul_force_isa(isa)]
    _native.qmatmul_force_isa(isas[0])  # back to the best this CPU has (what the dispatch picks)
    return isas


NATIVE_ISAS = _native_isas()


@pytest.fixture(params=NATIVE_ISAS)
def isa(request):
    """Each instruction set of the native kernels in turn (products, attention, layers, top-k follow it)."""
    from lookupdec import _native

    assert _native.qmatmul_force_isa(request.param)
    yield request.param
    _native.qmatmul_force_isa(NATIVE_ISAS[0])


@pytest.fixture(autouse=True)
def _cpu_feature_models(request, monkeypatch):
    """A test marked ``cpu`` checks a CPU-only feature (the fast forward, its weight
    formats and what rests on them): its models stay on the CPU whatever the test device."""
    if TEST_DEVICE != "cpu" and request.node.get_closest_marker("cpu"):
        monkeypatch.setattr(sys.modules[__name__], "TEST_DEVICE", "cpu")
        monkeypatch.setenv("LOOKUPDEC_DEVICE", "cpu")


def char_tokenizer():
    """A character-level fast tokenizer: ids 0-2 are <unk> <s> </s>, then printable ASCII, then fillers up to 128."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in chars:
        vocab[c] = len(vocab)
    assert len(vocab) <= TINY_VOCAB
    # Ids the models can emit but no character maps to: the tokenizer's vocabulary is the model's.
    for k in range(len(vocab), TINY_VOCAB):
        vocab[f"<x{k}>"] = k
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    hf.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant: {% endif %}"
    )
    return hf


def tiny_model(seed: int = 0, *, layers: int = 2, attn: str = "sdpa", max_positions: int = 256, scale: float = 4.0):
    """A random Llama: 2 layers, hidden 64, 4 heads (2 KV heads), vocab 128.

    ``scale`` multiplies the weight matrices: the default 4 makes greedy
    choices decisive and outputs repetitive (drafts match often); ``scale=1``
    keeps transformers' own initialisation, with its near-ties between the top
    two logits (where rounding that depends on the width could flip an argmax).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                      bos_token_id=1, eos_token_id=EOS_ID, pad_token_id=0, tie_word_embeddings=False,
                      attn_implementation=attn)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    if scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.mul_(scale)
    return model.to(TEST_DEVICE)


def tiny_loaded(seed: int = 0, **kw):
    from lookupdec.models import LoadedModel

    model = tiny_model(seed, **kw)
    return LoadedModel(model, char_tokenizer(), f"tiny-llama-{seed}", (EOS_ID,), model.config.max_position_embeddings)


def batch_of(model, ids) -> torch.Tensor:
    """``ids`` as a batch of one on ``model``'s device (what a model's own forward takes)."""
    return torch.tensor([list(ids)], dtype=torch.long, device=model.device)


def save_tiny(directory, seed: int = 0, **kw) -> str:
    """A tiny model and its tokenizer saved as a model directory (what --model and Decoder(path) take)."""
    tiny_model(seed, **kw).save_pretrained(directory)
    char_tokenizer().save_pretrained(directory)
    return str(directory)


@pytest.fixture
def tiny():
    return tiny_loaded(0)


@functools.lru_cache(maxsize=None)
def _real_model(device: str):
    from lookupdec.models import load_model

    return load_model(device=device)


@pytest.fixture
def real_loaded(_cpu_feature_models):
    """The embedded model on the test's device, loaded once per device."""
    return _real_model(TEST_DEVICE)


def hf_greedy(model, prompt_ids, max_new_tokens, eos_id=EOS_ID) -> list[int]:
    """transformers' own greedy generate(): the reference output."""
    ids = torch.tensor([prompt_ids], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos_id, pad_token_id=0, top_p=None, top_k=None, temperature=None)
    return out[0, len(prompt_ids):].tolist()


def load_benchmark(name: str):
    """A script of benchmarks/ imported as a module (``benchmarks/<name>.py``), for testing it at tiny scale.

    benchmarks/ goes on ``sys.path`` first: its scripts import each other (``simulate``, ``specbench``).
    """
    import importlib.util
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", bench / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def add_gguf_tensor(writer, name: str, x, kind: str) -> None:
    """Add float32 array ``x`` to a ``gguf.GGUFWriter`` stored as ``kind`` ("F32", "F16" or a GGML block type)."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    if kind == "F32":
        writer.add_tensor(name, x)
    elif kind == "F16":
        writer.add_tensor(name, x.astype(np.float16))
    else:
        qtype = getattr(GGMLQuantizationType, kind)
        writer.add_tensor(name, quantize(x, qtype), raw_dtype=qtype)
