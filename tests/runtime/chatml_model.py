"""A Qwen2-shaped HF model directory the way real ones come: a byte-level BPE tokenizer with
learned merges and a ChatML chat template (``<|im_start|>user\\n...<|im_end|>\\n``).

Built in-process (no download): the BPE is trained on a few hundred made-up words, the
``config.json`` is a ``Qwen2Config`` (heads of 32, a size vLLM's CPU attention runs:
``prepare.check_model_shape``).  No weights are written: measuring prompts needs only the
tokenizer and the config (``runtime.prepare.fit_prompts``).  For whole model directories of
real architectures see ``bidirl.models.make_model``.
"""

from __future__ import annotations

import random
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def words(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))
            for _ in range(n)]


def chatml_text(messages) -> str:
    """The ChatML rendering, written out by hand (for a tokenization that skips the template)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + \
        "<|im_start|>assistant\n"


def build_chatml_model(out_dir: str | Path, max_position_embeddings: int = 1024, seed: int = 0):
    """Write the directory; return ``(path, core)`` where ``core`` is the trained
    ``tokenizers.Tokenizer`` itself, an independent reference for token counts."""
    from transformers import PreTrainedTokenizerFast, Qwen2Config
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    from bidirl.models.make import byte_level_bpe

    out_dir = Path(out_dir)
    vocab = words(300, seed)
    texts = [" ".join(random.Random(i).choices(vocab, k=40)) for i in range(200)]
    core = byte_level_bpe(PRETOKENIZE_REGEX, SPECIAL, 2000, texts=texts)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=SPECIAL[1:], clean_up_tokenization_spaces=False,
                                  model_max_length=max_position_embeddings)
    tok.chat_template = CHATML
    tok.save_pretrained(out_dir)
    Qwen2Config(vocab_size=core.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=max_position_embeddings,
                tie_word_embeddings=True, eos_token_id=core.token_to_id("<|im_end|>"),
                pad_token_id=core.token_to_id("<|endoftext|>")).save_pretrained(out_dir)
    return out_dir, core


def verl_rows(n: int, lo: int = 120, hi: int = 210, seed: int = 0, data_source: str = "copy") -> list[dict]:
    """veRL-layout rows whose prompts are ``lo..hi`` words (a system turn and a user turn);
    with :func:`build_chatml_model`'s tokenizer, about 150-250 tokens."""
    rng, vocab = random.Random(seed), words(300, 0)
    rows = []
    for i in range(n):
        k = rng.randint(lo, hi)
        answer = str(rng.randint(10, 99999))
        rows.append({"prompt": [{"role": "system", "content": " ".join(rng.choices(vocab, k=k - 2))},
                                {"role": "user", "content": f"copy {answer}"}],
                     "data_source": data_source, "reward_model": {"ground_truth": answer},
                     "extra_info": {"index": i}})
    return rows
