"""vLLM 0.32 generates from image prompts with the tiny Idefics3 directory on a CPU, as the
rollout must: from token ids with one ``<image>`` token per image (vLLM expands it itself, as
the HF processor does), resuming from a prefix of the response, with behaviour log-probs
equal to transformers' forward given the processor's pixels."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
import torch  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
PROMPT = "<|bos|><|user|><image>how many circles?<|assistant|>"


def test_vllm_generates_from_an_image_prompt_like_transformers(tiny_vl_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from vllm import LLM, SamplingParams

    d = str(tiny_vl_dir)
    proc = AutoProcessor.from_pretrained(d)
    img = Image.new("RGB", (80, 50), "white")
    ImageDraw.Draw(img).ellipse((10, 10, 30, 30), fill="red")
    llm = LLM(model=d, dtype="float32", distributed_executor_backend="uni", max_model_len=256, max_num_seqs=4,
              enforce_eager=True, seed=0, enable_prefix_caching=False, kv_cache_memory_bytes=32 << 20,
              enable_chunked_prefill=False, use_tqdm_on_load=False)
    unexpanded = proc.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    expanded = list(proc(text=[PROMPT], images=[[img]])["input_ids"][0])
    sample = SamplingParams(max_tokens=8, temperature=1.0, logprobs=0, seed=3)
    by_text = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": img}}, sample, use_tqdm=False)[0]
    by_ids = llm.generate({"prompt_token_ids": unexpanded, "multi_modal_data": {"image": img}}, sample,
                          use_tqdm=False)[0]
    assert list(by_text.prompt_token_ids) == list(by_ids.prompt_token_ids) == expanded
    out = list(by_ids.outputs[0].token_ids)
    assert out == list(by_text.outputs[0].token_ids) and len(out) == 8
    # A resumed response: the unexpanded prompt + its tokens so far, with the image again.
    resumed = llm.generate({"prompt_token_ids": unexpanded + out[:4], "multi_modal_data": {"image": img}},
                           SamplingParams(max_tokens=4, temperature=0, logprobs=0), use_tqdm=False)[0]
    assert len(resumed.prompt_token_ids) == len(expanded) + 4
    # Already-expanded ids are not recognised: vLLM expands the first <image> again.
    twice = llm.generate({"prompt_token_ids": expanded, "multi_modal_data": {"image": img}},
                         SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert len(twice.prompt_token_ids) != len(expanded)
    # Behaviour log-probs = transformers' on the processor's expanded ids and pixels.
    vllm_lp = [lp[t].logprob for lp, t in zip(by_ids.outputs[0].logprobs, out, strict=True)]
    enc = proc(text=[PROMPT], images=[[img]], return_tensors="pt")
    ids = torch.cat([enc["input_ids"], torch.tensor([out])], 1)
    model = AutoModelForImageTextToText.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values=enc["pixel_values"],
                       pixel_attention_mask=enc["pixel_attention_mask"]).logits[0]
    n = len(expanded)
    hf_lp = torch.log_softmax(logits[n - 1:-1], -1).gather(-1, torch.tensor(out)[:, None])[:, 0]
    assert max(abs(a - b) for a, b in zip(vllm_lp, hf_lp.tolist(), strict=True)) < 1e-4
