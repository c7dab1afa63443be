"""Make the example's dataset and tokenizer: data/train.jsonl and data/tokenizer.json.

    python examples/byo-data/prepare.py [--out DIR] [--documents N] [--vocab-size V]

The dataset is the running Python's standard library sources as JSONL, one document per
module ({"path": ..., "text": ...}), the way a user's dataset holds text beside other fields.
The tokenizer is a byte-level BPE (Hugging Face `tokenizers`, from `pip install
'planaria[hf]'`) of V tokens trained on that text, with `</s>` as its end-of-document token.
Both are generated, never committed; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
EOS = "</s>"


def documents(count: int) -> list[tuple[str, str]]:
    """(path, text) of the first `count` standard library modules, sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))[:count]
    return [(f.name, f.read_text(encoding="utf-8", errors="replace")) for f in files]


def train(texts: list[str], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "data", help="output folder")
    parser.add_argument("--documents", type=int, default=120, help="standard library modules")
    parser.add_argument("--vocab-size", type=int, default=1024, help="tokenizer vocabulary")
    args = parser.parse_args()
    docs = documents(args.documents)
    args.out.mkdir(parents=True, exist_ok=True)
    jsonl, tokenizer = args.out / "train.jsonl", args.out / "tokenizer.json"
    with jsonl.open("w", encoding="utf-8") as out:
        for path, text in docs:
            out.write(json.dumps({"path": path, "text": text}) + "\n")
    train([text for _, text in docs], args.vocab_size).save(str(tokenizer))
    print(
        f"wrote {len(docs)} documents to {jsonl} and a {args.vocab_size}-token tokenizer "
        f"to {tokenizer}"
    )


if __name__ == "__main__":
    main()
