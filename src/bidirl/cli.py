"""The ``bidirl`` command: simulate, plan, train, export and make-model.

Each subcommand lives in a small function.  What every command may need is imported
here (the simulator, the planner, the typed config, the model shapes: none of them loads
torch, vLLM or Ray); heavy imports (torch, vLLM, Ray, matplotlib) happen only inside the
subcommand that needs them, so ``bidirl simulate`` starts fast (a test keeps it so).
Expected failures (a bad scenario or config, a missing file) print one line naming the
field and exit with status 2; a traceback means a bug.  ``bidirl train`` stopped by SIGINT
or SIGTERM stops at a step boundary with a checkpoint and exits 130 / 143
(``runtime/stops.py``; during the start-up, ``runtime/exits.py``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from bidirl.algo.data import DataError
from bidirl.controller.queue import GenerationCapError
from bidirl.engines.trainer_config import NonFiniteError
from bidirl.models.make import ARCHS, make_model, shape_of
from bidirl.obs.trace import write_chrome_trace
from bidirl.planner import plan as planner
from bidirl.planner.plan import PlanError
from bidirl.planner.runnable import plan_file_overrides
from bidirl.policy import policy_names
from bidirl.runtime.checkpoints import export_model
from bidirl.runtime.config import ConfigError, help_text
from bidirl.runtime.exits import WorkerLost, run_train
from bidirl.runtime.leftovers import clean_stale_runs
from bidirl.runtime.placement import NodeLost
from bidirl.sim import grid
from bidirl.sim import scenario as scn
from bidirl.sim.confirm import DEFAULT_K, confirm
from bidirl.sim.run import simulate
from bidirl.sim.scenario import ScenarioError


class UserError(Exception):
    """A problem with what the user asked for, reported without a traceback."""


def _count(low: int):
    """An argparse type: an integer >= ``low`` (argparse reports a bad one in one line, exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def _check_outputs(args: argparse.Namespace, *flags: str) -> None:
    """Each output path given (``--json``, ``--trace``, ``--plot``) can be written: checked before
    the work, so a typo does not cost a whole simulation."""
    for flag in flags:
        path = getattr(args, flag.lstrip("-"), None)
        if not path:
            continue
        p = Path(path)
        if p.is_dir():
            raise UserError(f"{flag}: {p} is a directory; give a file name")
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"{flag}: cannot create the directory {p.parent}: {e.strerror or e}") from None


@contextmanager
def _output(flag: str, path: str):
    """Turns an ``OSError`` while writing ``flag``'s file into a one-line ``UserError``."""
    try:
        yield
    except OSError as e:
        raise UserError(f"{flag}: cannot write {path}: {e.strerror or e}") from None


def _write_json(path: str, data, flag: str = "--json") -> None:
    with _output(flag, path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _summary(r) -> str:
    pb, st, b = r.pool_busy_fraction, r.staleness, r.borrows
    return "\n".join([
        f"policy {r.policy} on scenario {r.scenario}: {r.steps} steps, {r.devices} devices, seed {r.seed}",
        f"  throughput        {r.throughput_tokens_per_s:,.0f} tokens/s "
        f"(ideal {r.ideal_tokens_per_s:,.0f}, efficiency {r.efficiency:.1%}; attainable "
        f"{r.attainable_tokens_per_s:,.0f}, efficiency {r.efficiency_attainable:.1%})",
        f"  mean step time    {r.mean_step_time_s:.2f} s   wall {r.wall_s:.1f} s",
        f"  pool busy         rollout {pb.get('rollout', 0):.1%}   train {pb.get('train', 0):.1%}",
        f"  borrows           roll-on-train {b.get('roll_on_train', 0)}   "
        f"train-on-roll {b.get('train_on_roll', 0)}   switching {r.switch_time_s:.1f} s",
        f"  staleness         mean {st.get('mean', 0):.2f}   max {st.get('max', 0):.0f}",
        f"  groups            trained {r.groups_trained}   lost {r.groups_lost}"
        + (f"   filtered {r.groups_filtered} (keep rate {r.keep_rate:.2f})" if r.groups_filtered else ""),
        f"  trace sha256      {r.trace_sha256[:16]}...",
    ])


def _progress(done: int, total: int, what: str) -> None:
    end = "\n" if done == total or not sys.stderr.isatty() else "\r"
    if sys.stderr.isatty() or done == total or done % 10 == 0:
        print(f"[{done}/{total}] {what:<60}", end=end, file=sys.stderr, flush=True)


def cmd_simulate(args: argparse.Namespace) -> int:
    _check_outputs(args, "--json", "--trace", "--plot")
    if args.grid:
        return _simulate_grid(args)
    sc = scn.load(args.scenario)
    if args.plan == "auto":
        sc = _planned(sc, args.policy, args.steps, args.confirm, _confirm_progress)
    # Only the trace and the plot need every device interval (about 680,000 at scale-1024,
    # which roughly doubles the run); the summary and --json use what the recorder tallies
    # as intervals close (pool seconds, busy fractions, the streaming trace sha256).
    keep = bool(args.trace or args.plot)
    t0 = time.perf_counter()
    result = simulate(sc, args.policy, steps=args.steps, seed=args.seed,
                      record_intervals=keep, allow_oversubscribe=args.allow_oversubscribe)
    took = time.perf_counter() - t0
    print(_summary(result))
    print(f"  (simulated in {took:.2f} s)")
    if args.json:
        _write_json(args.json, result.to_json())
    if args.trace:
        with _output("--trace", args.trace):
            sha = write_chrome_trace(result.intervals, args.trace, process_name=f"bidirl sim {sc.name}")
        print(f"  trace   -> {args.trace} (sha256 {sha[:16]}...; "
              "open in ui.perfetto.dev or chrome://tracing)")
    if args.plot:
        from bidirl.obs.timeline_plot import plot_timeline  # lazy: pulls in matplotlib

        with _output("--plot", args.plot):
            plot_timeline(result.intervals, args.plot,
                          title=f"{sc.name} / {args.policy}: {result.throughput_tokens_per_s:,.0f} tok/s")
        print(f"  plot    -> {args.plot}")
    return 0


def _planned(sc, policy: str, steps: int | None, k: int, progress=None):
    """``sc`` on the envelope planned for ``policy`` (its borrowing and staleness) over
    ``steps``, confirmed by simulating ``policy`` on up to ``k`` of the closest."""
    chosen = confirm(sc, planner.plan(sc, steps=steps, policy=policy), k=k, progress=progress)
    how = (f", best simulated of the planner's {len(chosen.confirmed)} closest"
           if chosen.confirmed else "")
    print(f"planner envelope: {chosen.envelope.label()} for {policy} (predicted "
          f"{chosen.predicted_tokens_per_s:,.0f} tokens/s{how})", file=sys.stderr)
    return planner.scenario_with_envelope(sc, chosen.envelope)


def _simulate_grid(args: argparse.Namespace) -> int:
    if args.grid != "paper":
        raise UserError(f"--grid: unknown grid {args.grid!r}; allowed: paper")
    scenarios = grid.paper_grid(steps=args.steps or 12, seed=args.seed or 0)
    known = policy_names()
    policies = args.policies.split(",") if args.policies else known
    bad = [p for p in policies if p not in known]
    if bad:
        raise UserError(f"--policies: unknown {bad}; allowed: {', '.join(known)}")
    run = simulate
    if args.plan == "auto":  # each policy on its own plan (not the grid's shared half split)
        def run(sc, policy, **kw):
            return simulate(_planned(sc, policy, sc.steps, args.confirm), policy, **kw)
    rows = grid.run_grid(scenarios, policies, simulate=run, progress=_progress)
    print(grid.format_table(rows, policies))
    summary = grid.summarize(rows)
    print(json.dumps(summary, indent=2))
    if args.json:
        _write_json(args.json, {
            "summary": summary,
            "rows": [{"scenario": r.scenario,
                      "results": {p: res.to_json() for p, res in r.results.items()}}
                     for r in rows]})
    return 0


def _confirm_progress(i: int, n: int, row: dict) -> None:
    """One line on stderr per envelope the planner's short list simulates."""
    got = (f"{row['simulated_tokens_per_s']:,.0f} tokens/s simulated"
           if row["simulated_tokens_per_s"] is not None else f"refused by the simulator: {row['refused']}")
    print(f"[confirm {i}/{n}] {row['envelope']}: {got} ({row['predicted_tokens_per_s']:,.0f} "
          f"predicted)", file=sys.stderr)


def cmd_plan(args: argparse.Namespace) -> int:
    _check_outputs(args, "--json")
    sc = scn.load(args.scenario)
    chosen = planner.plan(sc, top_k=args.top, policy=args.policy, runnable_only=not args.what_if)
    result = confirm(sc, chosen, k=args.confirm,
                     progress=_confirm_progress)
    print(result.format() if hasattr(result, "format") else result)
    if args.json:
        _write_json(args.json, result.to_json())
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    if getattr(args, "plan", None):  # the plan's layout first: the command line's key=value still win
        try:
            over = plan_file_overrides(args.plan)
        except ValueError as e:
            raise UserError(str(e)) from None
        print(f"[bidirl] --plan {args.plan}: {' '.join(over)}", file=sys.stderr)
        args.overrides = [*over, *(args.overrides or [])]
    try:
        from bidirl.runtime.train import main as train_main  # lazy: pulls in torch, vLLM and Ray
    except ImportError as e:  # the runtime extras are not installed
        raise UserError(f"bidirl train needs the runtime extras (torch, vllm, ray): {e}") from e
    return run_train(train_main, args, USER_ERRORS)  # signals, the last line (runtime/exits.py)


def cmd_export(args: argparse.Namespace) -> int:
    src = export_model(Path(args.run_dir), Path(args.out), args.step, merged=args.merged)
    print(f"[bidirl] exported {src} -> {args.out}", file=sys.stderr)
    return 0


def cmd_make_model(args: argparse.Namespace) -> int:
    fields = {"hidden_size": args.hidden, "intermediate_size": args.intermediate, "num_hidden_layers": args.layers,
              "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads, "head_dim": args.head_dim,
              "vocab_size": args.vocab, "max_position_embeddings": args.max_position_embeddings}
    fields = {k: v for k, v in fields.items() if v is not None}
    try:
        shape = shape_of(args.arch, args.small, **fields)
        out = make_model(args.out, args.arch, small=args.small, seed=args.seed, dtype=args.dtype, **fields)
    except (ValueError, FileExistsError) as e:
        raise UserError(str(e)) from None
    except ImportError as e:  # make_model imports torch and transformers when it runs
        raise UserError(f"bidirl make-model needs torch and transformers: {e}") from e
    print(f"[bidirl] {args.arch}-shaped model (random weights) -> {out}: hidden {shape.hidden_size}, "
          f"{shape.num_hidden_layers} layers, {shape.num_attention_heads}/{shape.num_key_value_heads} heads of "
          f"{shape.head_dim}, tied embeddings {str(shape.tie_word_embeddings).lower()}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bidirl", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("simulate", help="simulate a policy on a scenario (or a grid)")
    s.add_argument("--scenario", default="default", help="built-in name or path to a .yaml")
    s.add_argument("--policy", default="bidirl", choices=policy_names())
    s.add_argument("--steps", type=_count(1), default=None, help="override the scenario's steps")
    s.add_argument("--seed", type=_count(0), default=None)
    s.add_argument("--json", help="write the figures as JSON here (RunResult.to_json); its "
                   "trace_sha256 is the recorder's streaming sha256 over every interval, the same "
                   "with or without --trace (the trace file's own sha256 is printed after 'trace ->')")
    s.add_argument("--trace", help="write a Perfetto/Chrome trace.json here (records every "
                   "device interval: slower and larger in memory than a run without it)")
    s.add_argument("--plot", help="write a timeline PNG here (records every device interval)")
    s.add_argument("--plan", choices=("fixed", "auto"), default="fixed",
                   help="auto: run on the envelope the planner picks for --policy (what it borrows, "
                   "its staleness) instead of the scenario's split; with --grid, one plan per policy and scenario")
    s.add_argument("--confirm", type=_count(0), default=DEFAULT_K, metavar="K",
                   help="with --plan auto: simulate up to K of the envelopes the planner predicts within "
                   f"5%% of its best and run on the best simulated (default {DEFAULT_K}; 0 or 1: the "
                   "planner's pick as is)")
    s.add_argument("--allow-oversubscribe", action="store_true",
                   help="run a split whose rollout replica or trainer does not fit in device memory "
                   "(refused otherwise, naming the role and its memory); borrowed roles still go only where "
                   "they fit")
    s.add_argument("--grid", help="run a sweep instead (allowed: paper)")
    s.add_argument("--policies", help="comma-separated subset of policies for --grid")
    s.set_defaults(func=cmd_simulate)

    pl = sub.add_parser("plan", help="choose a resource envelope for a scenario")
    pl.add_argument("--scenario", default="default")
    pl.add_argument("--top", type=_count(1), default=5, help="how many envelopes to list (>= 1)")
    pl.add_argument("--confirm", type=_count(0), default=DEFAULT_K, metavar="K",
                    help="simulate up to K of the envelopes predicted within 5%% of the best and pick "
                    f"the best simulated (default {DEFAULT_K}; 0 or 1: the planner's prediction alone)")
    pl.add_argument("--policy", default="bidirl", choices=policy_names(),
                    help="the policy to plan for: what it borrows and the staleness it keeps (default bidirl)")
    pl.add_argument("--what-if", action="store_true",
                    help="also layouts the runtime cannot run yet (tensor-parallel trainers and replicas: "
                    "planner/runnable.py), for the simulator; without it the plan is one `bidirl train --plan` runs")
    pl.add_argument("--json")
    pl.set_defaults(func=cmd_plan)

    t = sub.add_parser("train", help="run GRPO for real (default: tiny model on local CPU)",
                       epilog=help_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--config", help="YAML config file")
    t.add_argument("--resume", help="run directory to continue, from its newest usable checkpoint and with its "
                   "config.yaml (not with --config or --run-dir); key=value may change only fields that do not "
                   "define the data stream or the ledger (resume_safe fields in runtime/config.py: run.steps, "
                   "trainer.*, cluster.*, ...), each recorded in RUN_DIR/resume_changes.jsonl")
    t.add_argument("--allow-data-change", action="store_true",
                   help="with --resume: accept training data files that changed since the run began (by default "
                   "refused: the ledger counts prompts by index); the change is recorded in resume_changes.jsonl")
    t.add_argument("--plan", metavar="PLAN.json",
                   help="run the layout `bidirl plan --json` wrote (its split, trainer sharding and policy); "
                   "key=value overrides still win; a layout the runtime cannot run is refused")
    t.add_argument("--ray-address", help="join an existing Ray cluster instead")
    t.add_argument("--run-dir", help="where to write the run (default runs/<time>)")
    t.add_argument("--print-config", action="store_true",
                   help="print the resolved config (defaults, --config, overrides; veRL names resolved) as YAML "
                   "and exit")
    t.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.lr=1e-5")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("export", help="copy a run's checkpoint out as a Hugging Face model directory")
    e.add_argument("run_dir", help="the run directory (bidirl train --run-dir)")
    e.add_argument("out", help="a new (or empty) directory to write")
    e.add_argument("--step", type=_count(0), help="the checkpoint's step (default: the newest complete one)")
    e.add_argument("--merged", action="store_true", help="a LoRA run: the base model with the adapters merged in, "
                   "as a full model directory (default: the adapter directory, for peft.PeftModel.from_pretrained)")
    e.set_defaults(func=cmd_export)

    m = sub.add_parser("make-model", help="write a model directory of a real architecture with random weights",
                       description="Write a Hugging Face model directory of a real architecture (its config, "
                       "tied or untied embeddings, head layout, a byte-level BPE tokenizer trained locally and "
                       "the architecture's chat template) with random weights; nothing is downloaded.")
    m.add_argument("out", help="a new directory to write")
    m.add_argument("--arch", default="qwen2.5-0.5b", choices=sorted(ARCHS))
    m.add_argument("--small", action="store_true", help="2 layers, heads of 32, the tokenizer's own vocabulary "
                   "(same architecture, tying and head grouping): fast on a CPU")
    m.add_argument("--hidden", type=_count(1), help="hidden_size")
    m.add_argument("--intermediate", type=_count(1), help="intermediate_size (the MLP)")
    m.add_argument("--layers", type=_count(1), help="num_hidden_layers")
    m.add_argument("--heads", type=_count(1), help="num_attention_heads")
    m.add_argument("--kv-heads", type=_count(1), help="num_key_value_heads")
    m.add_argument("--head-dim", type=_count(1), help="head_dim (qwen2: hidden / heads)")
    m.add_argument("--vocab", type=_count(1), help="vocab_size (embedding rows; default: the architecture's, or the "
                   "tokenizer's with --small)")
    m.add_argument("--max-position-embeddings", type=_count(1))
    m.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    m.add_argument("--seed", type=_count(0), default=0)
    m.set_defaults(func=cmd_make_model)
    return p


# Exceptions that mean "your input is wrong" (or, ``NodeLost``, that the run cannot go on
# where it is): reported in one line, exit status 2.
USER_ERRORS: tuple[type[Exception], ...] = (
    UserError, ScenarioError, FileNotFoundError, ConfigError, DataError, PlanError, NonFiniteError, NodeLost,
    WorkerLost, GenerationCapError)


def _message(e: Exception) -> str:
    """The error's own message, in one line.

    An error raised inside a device worker (e.g. ``NonFiniteStepError``) reaches the driver
    as Ray's ``RayTaskError``, an instance of the original class whose text is the remote
    traceback; its ``cause`` is the original exception.
    """
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException) and any(c.__name__ == "RayTaskError" for c in type(e).__mro__):
        return " ".join(str(cause).split())
    return str(e)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    clean_stale_runs()  # what a killed run left in /tmp (runtime/leftovers.py)
    try:
        return args.func(args)
    except USER_ERRORS as e:
        print(f"bidirl {args.command}: error: {_message(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bidirl {args.command}: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """The program (``bidirl``, ``python -m bidirl.cli``): :func:`main`, then exit.

    After ``train``, the interpreter's own finalisation (freeing the native state of torch,
    Ray and the tokenizer, no Python code left to run) took ~1.5 s of every run here.  By
    then the run has closed everything it wrote and shut Ray down, so the process flushes
    its streams and logging and leaves without it.  Other commands exit as usual, and
    :func:`main` itself (called in-process by tests and scripts) never exits.
    """
    argv = sys.argv[1:]
    code = main(argv)
    if argv[:1] == ["train"]:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
