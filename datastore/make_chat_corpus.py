"""Write a chat corpus that exists offline: the embedded model's own answers to a prompt set.

REST found that a datastore of text written by models drafts best for a
chat model. No chat data set can be downloaded here, so this script makes
one: a deterministic set of instructions (templates x topics, written for this
project and disjoint from Spec-Bench's questions; ``prompts()``), each answered
greedily by the embedded SmolLM2-135M-Instruct through ``lookupdec`` itself.
One JSONL record per answer, in the chat format ``build-index`` reads::

    {"id": 17, "messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]}

The run is resumable: records already in the output file are kept and their
ids skipped, so an interrupted run continues where it stopped.

Usage:
    python datastore/make_chat_corpus.py -o datastore/sample/chat.jsonl [--n 600] [--max-new-tokens 256]
    lookupdec build-index datastore/sample/chat.jsonl -o datastore/sample/chat.index --overwrite
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "plate tectonics", "vaccines", "the immune system",
    "compound interest", "inflation", "supply and demand", "the French Revolution", "the Silk Road",
    "the printing press", "climate change", "renewable energy", "electric cars", "machine learning",
    "neural networks", "the internet", "encryption", "databases", "cloud computing", "version control",
    "recycling", "urban gardening", "sleep", "meditation", "marathon training", "a balanced diet",
    "learning a new language", "time management", "public speaking", "remote work", "job interviews",
    "saving money", "buying a used car", "moving to a new city", "adopting a dog", "caring for houseplants",
    "baking bread", "brewing coffee", "planning a trip to Japan", "camping in the mountains", "chess openings",
    "the history of jazz", "impressionist painting", "the Olympic Games", "volcanoes", "coral reefs",
    "honey bees", "the Moon landing", "the human heart", "antibiotics", "earthquakes", "solar panels",
    "3D printing", "smartphones", "social media", "online privacy", "open-source software", "the stock market",
]
TEMPLATES = [
    "Explain {t} in simple terms.",
    "What is {t}, and why does it matter?",
    "Give me five interesting facts about {t}.",
    "Write a short paragraph for a ten-year-old about {t}.",
    "What are the main advantages and disadvantages of {t}?",
    "Summarize the key ideas of {t} in three bullet points.",
    "Write a short poem about {t}.",
    "Write a short story in which {t} plays an important role.",
    "Give me a step-by-step beginner's guide to {t}.",
    "What are common misconceptions about {t}?",
    "How would you explain {t} to someone who has never heard of it?",
    "Write a friendly email inviting a colleague to a talk about {t}.",
    "List three questions a student might ask about {t}, and answer each.",
    "Compare {t} with something from everyday life.",
    "What should a beginner know before getting started with {t}?",
    "Write a tweet-length tip about {t}.",
    "Describe the history of {t} briefly.",
    "What are the biggest open questions about {t}?",
    "Write a haiku about {t}.",
    "Give me a one-week plan to learn more about {t}.",
]
PUZZLES = [
    "A shop sells pencils at {a} cents each. How much do {b} pencils cost in dollars?",
    "A train travels {a} kilometres in {b} hours. What is its average speed?",
    "If a recipe needs {a} eggs for {b} people, how many eggs are needed for {c} people?",
    "Tom has {a} apples and gives away {b}. He then buys {c} more. How many does he have?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
]
CODE = [
    "How do I reverse a list in Python?", "How do I read a text file line by line in Python?",
    "What is the difference between a list and a tuple in Python?", "How do I sort a dictionary by value in Python?",
    "What does the yield keyword do in Python?", "How do I handle exceptions in Python?",
    "How do I check whether a string is a palindrome in Python?", "What is a Python decorator?",
    "How do I remove duplicates from a list in Python while keeping the order?",
    "How do I get the current date and time in Python?", "What is recursion? Give a short example.",
    "How do I merge two dictionaries in Python?",
]


def prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct instructions, the same for the same ``n`` and ``seed``.

    Example:
        >>> ps = prompts(5)
        >>> len(ps), len(set(ps)), ps == prompts(5)
        (5, 5, True)
    """
    rng = random.Random(seed)
    pool = [t.format(t=topic) for t in TEMPLATES for topic in TOPICS]
    pool += [p.format(a=rng.randint(2, 90), b=rng.randint(2, 12), c=rng.randint(2, 20)) for p in PUZZLES for _ in range(8)]
    pool += CODE
    pool = sorted(set(pool))
    rng.shuffle(pool)
    if n > len(pool):
        raise ValueError(f"at most {len(pool)} distinct prompts, asked for {n}")
    return pool[:n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Answer a prompt set with the embedded model; write a chat JSONL corpus.")
    ap.add_argument("-o", "--output", required=True, type=Path)
    ap.add_argument("--n", type=int, default=600, help="prompts to answer")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)

    import torch

    from lookupdec import Decoder

    if args.threads:
        torch.set_num_threads(args.threads)
    done: set[int] = set()
    if args.output.exists():
        for line in args.output.read_text(encoding="utf-8").splitlines():
            try:
                done.add(int(json.loads(line)["id"]))
            except (ValueError, KeyError, TypeError):
                break  # a torn last line from an interrupted run: rewritten below
    todo = [(i, p) for i, p in enumerate(prompts(args.n)) if i not in done]
    if done:  # keep only the whole records
        kept = [line for line in args.output.read_text(encoding="utf-8").splitlines()
                if line.strip().startswith("{") and line.rstrip().endswith("}")]
        args.output.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    dec = Decoder()
    t0, tokens = time.perf_counter(), 0
    with open(args.output, "a", encoding="utf-8") as f:
        for k, (i, p) in enumerate(todo, 1):
            res = dec.generate(p, method="auto", max_new_tokens=args.max_new_tokens)
            rec = {"id": i, "messages": [{"role": "user", "content": p}, {"role": "assistant", "content": res.text}]}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            f.flush()
            tokens += res.new_tokens
            if k % 10 == 0 or k == len(todo):
                rate = tokens / (time.perf_counter() - t0)
                print(f"{len(done) + k}/{args.n} answers, {tokens} new tokens, {rate:.1f} tok/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
