"""A toy LLM-RL task that runs on a CPU with no download: for examples, tests and benchmarks.

* :func:`char_tokenizer`: a character-level ``PreTrainedTokenizerFast`` built in
  code (``<pad>`` = 0, ``<eos>`` = 1, then ``a-z``, ``0-9``, space).
* :func:`tiny_causal_lm`: a random-weight 2-layer GPT-2 (``n_embd=64``) for it.
* :func:`toy_dataset` and :func:`toy_reward`: two-letter prompts; the
  verifiable reward is the fraction of the completion's characters equal to
  the prompt's first letter.  GRPO sharpens the policy towards that letter,
  so without an entropy bonus the per-token entropy collapses.
* :func:`vowel_reward` with ``char_tokenizer(LETTERS)``: a second task (the
  fraction of vowels), to check a setting on another reward and vocabulary.

This module imports ``transformers``, ``tokenizers`` and ``datasets`` (all
installed with ``pip install -e ".[trl]"``).
"""

from typing import Any, List

import torch

try:
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "alf_entropy.integrations.toy_lm needs transformers, tokenizers and "
        'datasets: pip install -e ".[trl]" (in a checkout of alf_entropy)'
    ) from e

__all__ = [
    "CHARACTERS",
    "LETTERS",
    "char_tokenizer",
    "tiny_causal_lm",
    "toy_dataset",
    "toy_reward",
    "vowel_reward",
]

CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789 "
"""The tokenizer's characters (after ``<pad>`` and ``<eos>``)."""
LETTERS = "zyxwvutsrqponmlkjihgfedcba"
"""The second task's characters (another vocabulary, in another order)."""


def char_tokenizer(characters: str = CHARACTERS) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character of ``characters``."""
    vocab = {"<pad>": 0, "<eos>": 1}
    for c in characters:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tiny_causal_lm(seed: int = 0, vocab_size: int = len(CHARACTERS) + 2) -> GPT2LMHeadModel:
    """A random-weight 2-layer GPT-2 (64 wide, 2 heads, 64 positions).

    Args:
        seed: the seed of its weights (the global torch RNG is left as it was).
        vocab_size: the vocabulary size (that of :func:`char_tokenizer` by default).
    """
    config = GPT2Config(
        vocab_size=vocab_size,
        n_layer=2,
        n_embd=64,
        n_head=2,
        n_positions=64,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return GPT2LMHeadModel(config)


def toy_dataset(repeats: int = 64) -> Dataset:
    """Prompts ``"ab"``, ``"cd"``, ... (8 of them) repeated ``repeats`` times."""
    prompts = [CHARACTERS[i] + CHARACTERS[i + 1] for i in range(0, 16, 2)]
    return Dataset.from_dict({"prompt": prompts * repeats})


def toy_reward(prompts: List[str], completions: List[str], **kwargs: Any) -> List[float]:
    """Per completion: the fraction of its characters equal to its prompt's first letter."""
    return [c.count(p[0]) / max(len(c), 1) for p, c in zip(prompts, completions)]


def vowel_reward(prompts: List[str], completions: List[str], **kwargs: Any) -> List[float]:
    """Per completion: the fraction of its characters that are vowels."""
    return [sum(c.count(v) for v in "aeiou") / max(len(c), 1) for c in completions]
