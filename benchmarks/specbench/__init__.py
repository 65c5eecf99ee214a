"""The parts of the Spec-Bench harness (``benchmarks/spec_bench.py``).

- ``tasks``: the question file, Spec-Bench's six tasks, per-category selection;
- ``documents``: the reference documents inside rag and summarization prompts;
- ``methods``: the decoding methods under test behind one small interface;
- ``exactness``: every method's greedy tokens against ``ar``'s;
- ``runner``: warm-up, repeats, turn-by-turn generation, timing;
- ``metrics``: Spec-Bench's speed arithmetic (tokens/s, speedup, accepted length);
- ``report``: the JSON file and the Markdown table; ``plots``: the PNG figures;
- ``cli``: the command line.
"""
