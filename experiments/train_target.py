"""Train the small target LM alone (the pipeline's ``target`` stage), from the corpus JSONL.

    python experiments/train_target.py --corpus .corpus/stdlib.jsonl --out /tmp/target --seconds 120

The tokenizer is the committed one (``assets/pair/tokenizer``). Prints the held-out perplexity
of the kept (best held-out) step; the model is saved in bf16 on CUDA, float32 on CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from ddtree.errors import run_cli
from ddtree.training import corpus
from ddtree.training.lm import LMTrainConfig, TargetSpec, build_target, token_stream, train_target
from ddtree.training.loop import Budget
from ddtree.training.tokenizer import encode_documents, load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path(".corpus/stdlib.jsonl"))
    parser.add_argument("--tokenizer", type=Path, default=Path("assets/pair/tokenizer"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    tok = load_tokenizer(args.tokenizer)
    docs = corpus.read_corpus(args.corpus)
    train, heldout = (token_stream(encode_documents(tok, corpus.split_texts(docs, s))) for s in ("train", "heldout"))
    model = build_target(TargetSpec(vocab_size=len(tok)), tok.eos_token_id, tok.pad_token_id, args.seed).to(args.device)
    cfg = dataclasses.replace(LMTrainConfig(), batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed)
    result = train_target(model, train, heldout, cfg, Budget(max_steps=args.steps, max_seconds=args.seconds))
    dtype = torch.bfloat16 if torch.device(args.device).type == "cuda" else torch.float32
    model.to(dtype).save_pretrained(str(args.out))
    tok.save_pretrained(str(args.out))
    print(f"held-out perplexity {result.best_perplexity:.2f} at step {result.best_step} -> {args.out}")


if __name__ == "__main__":
    run_cli(main)
