"""Build the stdlib code corpus, and train the shipped pair's tokenizer (CPU work, run it here).

    python experiments/build_corpus.py                    # .corpus/stdlib.jsonl + assets/pair/tokenizer/
    python experiments/build_corpus.py --lib /path/to/Lib --out .corpus/stdlib.jsonl

Writes the corpus JSONL (one source file per line: path, module, split, text) and its
``.meta.json`` under the git-ignored ``.corpus/``, the tokenizer (byte-level BPE trained on
the training split) to ``assets/pair/tokenizer/`` and held-out code prefixes to
``assets/pair/heldout_prompts.jsonl``; both are committed, so GPU runs and the main job need
no tokenizer training. The file list and the split are deterministic for a given ``Lib/``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ddtree.training import corpus
from ddtree.training.pair import PROMPTS, TOKENIZER, write_prompts
from ddtree.training.tokenizer import train_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", type=Path, default=None, help="a Lib/ directory (default: this interpreter's)")
    parser.add_argument("--out", type=Path, default=Path(".corpus/stdlib.jsonl"))
    parser.add_argument("--assets", type=Path, default=Path("assets/pair"), help="where tokenizer/ and prompts go")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--prompts", type=int, default=16, help="held-out prompts to ship")
    parser.add_argument("--no-tokenizer", action="store_true", help="write the corpus only")
    args = parser.parse_args()

    start = time.perf_counter()
    docs = corpus.build_corpus(args.lib)
    corpus.write_corpus(docs, args.out)
    heldout = [d for d in docs if d.split == "heldout"]
    size = args.out.stat().st_size / 1e6
    print(f"corpus: {len(docs)} files ({len(heldout)} held out), {size:.1f} MB -> {args.out}")
    print("held out: " + ", ".join(d.module for d in heldout))
    if args.no_tokenizer:
        return
    tokenizer = train_tokenizer(corpus.split_texts(docs, "train"), args.vocab_size)
    tokenizer.save_pretrained(str(args.assets / TOKENIZER))
    write_prompts(corpus.code_prefixes(heldout, args.prompts), args.assets / PROMPTS)
    print(f"tokenizer: {len(tokenizer)} tokens -> {args.assets / TOKENIZER}; "
          f"{args.prompts} prompts -> {args.assets / PROMPTS}; {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
