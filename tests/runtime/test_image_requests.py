"""A prompt's images travel with every request of its group and with a reclaimed partial.

What crosses the worker boundary (``runtime/messages.py``) carries the images' encoded
bytes and the tokens they add; the group store hands them to fresh and resumed requests
and keeps them through a checkpoint (once per group, base64 in the JSON state); the
replica's request book sends vLLM the ids with one placeholder per image plus the decoded
images, and counts the expanded context.  No engine: a stand-in records what it is given.
"""

from __future__ import annotations

import io
import json

import pytest
from PIL import Image

from bidirl.runtime.group_store import GroupStore, result_state
from bidirl.runtime.messages import ResponseRequest, ResponseResult


def _png(colour: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buf, format="PNG")
    return buf.getvalue()


IMAGES = (_png("red"), _png("blue"))
ROLLOUT_IDS = [1, 9, 9, 5]  # two placeholders (9)
TRAIN_IDS = [1, 9, 9, 9, 9, 9, 9, 5]  # each expanded to 3 tokens


def _store() -> GroupStore:
    store = GroupStore(n=2, max_new_tokens=6, temperature=1.0, seed=0)
    store.add(0, "uid0", ROLLOUT_IDS, "shapes", "3", images=IMAGES, train_prompt_ids=TRAIN_IDS)
    store.add(1, "uid1", [1, 2, 3], "copy", "x")
    return store


def test_a_reclaimed_partial_resumes_with_its_images_exactly():
    store = _store()
    fresh = store.requests_for(0)
    assert all(r.images == IMAGES and r.image_tokens == 4 and r.prompt_ids == ROLLOUT_IDS for r in fresh)
    assert store.requests_for(1)[0].images == () and store.groups[1].trained_prompt_ids == [1, 2, 3]
    partial = ResponseResult.start(fresh[0])
    partial.token_ids += [4, 4]
    partial.logprobs += [-0.5, -0.25]
    partial.versions += [0, 0]
    assert store.absorb_partials([partial]) == [0]
    resumed = store.requests_for(0)
    again = next(r for r in resumed if r.index == 0)
    assert again.images == IMAGES and again.image_tokens == 4
    assert (again.prefix_ids, again.prefix_logprobs, again.prefix_versions) == ([4, 4], [-0.5, -0.25], [0, 0])
    # Through a checkpoint (JSON): the images once per group, back on every response.
    store = _store()
    store.requests_for(0)
    store.absorb_partials([partial])
    state = json.loads(json.dumps(store.state_dict()))
    assert "images" not in state["groups"][0]["partial"][0]
    assert json.loads(json.dumps(result_state(partial))) == state["groups"][0]["partial"][0], \
        "a replica's in-flight snapshot goes into the checkpoint the same way"
    loaded = GroupStore(n=2, max_new_tokens=6, temperature=1.0, seed=0)
    loaded.load_state_dict(state)
    rec = loaded.groups[0]
    assert rec.images == IMAGES and rec.trained_prompt_ids == TRAIN_IDS and rec.image_tokens == 4
    again = next(r for r in loaded.requests_for(0) if r.index == 0)
    assert again.images == IMAGES and again.prefix_ids == [4, 4] and again.image_tokens == 4


class _Engine:
    def __init__(self) -> None:
        self.added: list[tuple[str, dict, object]] = []

    def add_request(self, rid, prompt, params) -> None:
        self.added.append((rid, prompt, params))

    def abort_request(self, ids) -> None:
        pass


def test_the_request_book_sends_images_and_counts_their_tokens():
    pytest.importorskip("vllm")
    from bidirl.runtime.rollout_requests import RequestBook, TrainingSampling

    engine = _Engine()
    book = RequestBook(engine, max_num_seqs=4, sampling=TrainingSampling(image_tokens=(9,)))
    r = ResponseRequest(0, 0, ROLLOUT_IDS, 6, images=IMAGES, image_tokens=4, prefix_ids=[4], prefix_logprobs=[-1.0],
                        prefix_versions=[0])
    book.add("a", r, ResponseResult.start(r))
    book.add("b", ResponseRequest(1, 0, [1, 2, 3], 6), ResponseResult.start(ResponseRequest(1, 0, [1, 2, 3], 6)))
    (_, prompt, params), (_, text_prompt, _) = engine.added
    assert prompt["prompt_token_ids"] == ROLLOUT_IDS + [4], "unexpanded ids: vLLM expands the placeholders"
    colours = [im.getpixel((0, 0)) for im in prompt["multi_modal_data"]["image"]]
    assert colours == [(255, 0, 0), (0, 0, 255)]
    assert text_prompt == {"prompt_token_ids": [1, 2, 3]}
    assert book.context["a"] == len(ROLLOUT_IDS) + 1 + 4 and book.context["b"] == 3
    assert params.logit_bias == {9: -100.0}, "an image placeholder is never sampled"
    # A restart (weight update) re-sends the images with the response so far.
    book.resume(book.set_aside())
    assert engine.added[-2][1]["multi_modal_data"]["image"] == prompt["multi_modal_data"]["image"]
