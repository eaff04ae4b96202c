"""A multi-turn environment in one file (docs/environments.md): the model answers, and is told
to try again until it is right or runs out of turns.

    bidirl train env.path=examples/retry_env.py data.files=train.parquet

Works on any veRL-layout row (``prompt``, ``reward_model.ground_truth``); on the built-in
``reverse`` task, leave ``data.files`` unset.  A right answer on the first turn scores 1, on a
later turn less (``0.5`` per retry), so a policy learns to be right at once.
"""


class Environment:
    def reset(self, row: dict) -> list[dict]:
        """The first chat messages, from a data row (veRL's layout)."""
        self.answer = str(row["reward_model"]["ground_truth"]).strip()
        self.turn = 0
        return list(row["prompt"])

    def step(self, text: str) -> tuple[list[dict], float, bool]:
        """The model's turn in; (observation messages, reward, done) out."""
        self.turn += 1
        if text.strip() == self.answer:
            return [], 0.5 ** (self.turn - 1), True
        return [{"role": "user", "content": "Not yet, try again."}], 0.0, False
