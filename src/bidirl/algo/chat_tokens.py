"""A conversation's tokens under a model's chat template, turn by turn (multi-turn rollouts).

The model's own turns are never re-encoded (the engine's tokens are kept); what is encoded
here is the prompt (``reset``'s messages) and each environment turn: the template's rendering
of its messages taken as the difference between the template over a fixed two-message
conversation with and without them, i.e. what follows the assistant's end-of-turn token.
Pure functions of a tokenizer (anything with ``apply_chat_template``, ``encode`` and
``eos_token``), shared by the runtime (``runtime/trajectories.py``) and the tool tasks' warm
start (``models/warm_start.py``).
"""

from __future__ import annotations

_BASE = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]


def observation_ids(tok, messages: list[dict], tools: list | None, ended_with_eos: bool) -> list[int]:
    """The tokens an environment turn adds after a model turn: the template's rendering of
    ``messages`` up to the next assistant prompt, plus whatever the template writes after the
    model's end-of-turn token (Qwen's ``\\n``), and the end-of-turn token itself when the model's
    turn was cut by its length cap."""
    kw = {"tools": tools} if tools else {}
    base = tok.apply_chat_template(_BASE, tokenize=False, **kw)
    full = tok.apply_chat_template(_BASE + list(messages), tokenize=False, add_generation_prompt=True, **kw)
    if not full.startswith(base):
        raise ValueError("the chat template renders a conversation differently once messages follow it; "
                         "multi-turn rollouts need a template that only appends")
    eos = tok.eos_token
    glue = base[base.rfind(eos) + len(eos):] if eos and eos in base else ""
    ids = tok.encode(glue + full[len(base):], add_special_tokens=False)
    return ([tok.eos_token_id] if not ended_with_eos else []) + ids


def prompt_ids(tok, messages: list[dict], tools: list | None) -> list[int]:
    """A trajectory's prompt: ``reset``'s messages under the chat template (with the tools'
    schemas where the environment has them), ending with the assistant's turn."""
    ids = tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                  **({"tools": tools} if tools else {}))
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
