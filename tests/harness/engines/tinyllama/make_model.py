"""Make the tiny random Llama the engine tests serve (run by build.sh in the vLLM venv).

Nothing comes from a model hub: the training text is generated here from a fixed seed, the
SentencePiece tokenizer is trained on it, and the weights are random (seeded). The result is
an ordinary Hugging Face folder that vLLM serves and llama.cpp's converter turns into GGUF.
Sizes (the README explains why these): hidden 128, 2 heads of 64, 2 layers, MLP 256,
vocabulary 1,000, context 256: about 584k parameters, a 2.3 MB f32 file.

Usage: python make_model.py OUT_DIR
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 20261202
VOCAB = 1000
CONTEXT = 256
# A chat template, so /v1/chat/completions works too; the tests count tokens of /v1/completions.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def training_text(rng: random.Random) -> str:
    """About 400 kB of sentences over 3,000 made-up words: enough distinct pairs for a
    1,000-piece BPE vocabulary, and the same text on every run."""
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "st", "tr", "pl", "gr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ee"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "ng", "st"]

    def word() -> str:
        return "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 3)))

    words = [word() for _ in range(3000)]
    sentences = []
    for _ in range(12000):
        body = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        sentences.append(body[0].upper() + body[1:] + rng.choice([".", ".", "?", "!"]))
    return "\n".join(sentences) + "\n"


def train_tokenizer(corpus: Path, prefix: Path) -> None:
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        model_type="bpe",
        vocab_size=VOCAB,
        character_coverage=1.0,
        byte_fallback=True,
        num_threads=1,  # one thread: the same pieces on every run
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )


def main(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    work = out / "tokenizer-training"
    work.mkdir(parents=True)
    corpus = work / "corpus.txt"
    corpus.write_text(training_text(random.Random(SEED)))
    train_tokenizer(corpus, work / "tokenizer")

    # AutoTokenizer from a folder holding tokenizer.model and its config (LlamaTokenizer's
    # vocab_file= argument is ignored by transformers 5.x); saved again, it adds tokenizer.json.
    source = work / "hf-tokenizer"
    source.mkdir()
    (source / "tokenizer.model").write_bytes((work / "tokenizer.model").read_bytes())
    (source / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "LlamaTokenizer",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "add_bos_token": True,
                "add_eos_token": False,
                "model_max_length": CONTEXT,
                "chat_template": CHAT_TEMPLATE,
            }
        )
    )
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    if len(tokenizer) != VOCAB:
        raise SystemExit(f"tokenizer has {len(tokenizer)} pieces, expected {VOCAB}")

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    hf = out / "hf"
    model.save_pretrained(str(hf), safe_serialization=True)
    tokenizer.save_pretrained(str(hf))
    # The SentencePiece model too: llama.cpp's converter reads a Llama vocabulary from it
    # (without it, it takes the BPE path, which refuses a pre-tokenizer it does not know).
    (hf / "tokenizer.model").write_bytes((work / "tokenizer.model").read_bytes())
    parameters = sum(p.numel() for p in model.parameters())
    print(f"make_model.py: {parameters} parameters, {len(tokenizer)} pieces in {hf}", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
