"""What each DAG node does in a step: DATA_LOAD, ROLLOUT, COMPUTE (reward, advantage,
dynamic sampling, user functions), MODEL_INFERENCE, MODEL_TRAIN, BARRIER_SYNC.

Service nodes call the trainer or the rollout fleet with data-buffer keys only; COMPUTE
nodes read their inputs from the data buffer, compute here and write their output back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Batch, Ragged
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.clients import TrainerClient
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.fleet.rollout_fleet import RolloutFleet
from meshrl.scheduler.step.dag.columns import Reads, plan_reads
from meshrl.scheduler.step.dag.dispatch import check_dispatch_table, handler_name
from meshrl.scheduler.step.dag.executor import NodeResult, StepContext
from meshrl.scheduler.step.dag.held import hold, read_held, successor_reads
from meshrl.scheduler.step.dag.logprob_gap import gap_metric, gap_reads
from meshrl.scheduler.step.dag.shared_passes import call_group, run_passes
from meshrl.scheduler.step.prompts.data import PromptEncoder, PromptSampler
from meshrl.scheduler.step.scoring import advantages as adv
from meshrl.scheduler.step.scoring.old_logprobs import ratio_reads
from meshrl.scheduler.step.scoring.reward_model import score_node
from meshrl.scheduler.step.scoring.rewards import RewardFn, score
from meshrl.scheduler.step.scoring.temperature import sampling_temperature
from meshrl.scheduler.step.user.episodes import trajectory_columns
from meshrl.scheduler.step.user.user_code import UserCode
from meshrl.scheduler.workflow import compute_catalog as cat
from meshrl.scheduler.workflow import resolve_executable
from meshrl.scheduler.workflow.columns import declared, node_outputs
from meshrl.scheduler.workflow.model import Node


def enum_name(value: Any) -> str:
    """NodeType.ROLLOUT -> "ROLLOUT" (plain strings pass through)."""
    return str(getattr(value, "value", value))


def _text(col: Ragged, i: int) -> str:
    return bytes(col.row(i).astype(np.uint8)).decode("utf-8", errors="replace")


def rollout_seed(job_seed: int, step: int) -> int:
    """The sampling seed of a step's rollout: the same job seed and step give the same samples, whichever
    mode (sync or asynchronous) runs the step; never 0 (the proto's "no seed")."""
    return ((job_seed * 1_000_003 + step) & 0x7FFF_FFFF_FFFF) + 1


def encode_texts(texts: list[str]) -> Ragged:
    return Ragged.from_rows([np.frombuffer(t.encode(), dtype=np.uint8) for t in texts], dtype=np.uint8)


class NodeHandlers:
    """Binds the services of one job to the node types of its workflow."""

    def __init__(
        self,
        cfg: JobConfig,
        buffer: DataBufferClient,
        trainer: TrainerClient,
        fleet: RolloutFleet,
        encoder: PromptEncoder,
        sampler: PromptSampler,
        reward_fn: RewardFn,
        user_code: UserCode | None = None,
    ) -> None:
        self.cfg = cfg
        self.buffer = buffer
        self.trainer = trainer
        self.fleet = fleet
        self.encoder = encoder
        self.sampler = sampler
        self.reward_fn = reward_fn
        self.user_code = user_code  # worker pools for rewards and environments (None: all in-process)
        check_dispatch_table()

    def handler_for(self, node: Node) -> Callable[[Any, StepContext], NodeResult]:
        """The handler of `node` by the dispatch table (checked against the workflow validator's table)."""
        return getattr(self, handler_name(node))

    def barrier(self, node: Node, ctx: StepContext) -> NodeResult:
        return NodeResult()

    def _executable(self, node: Node) -> Callable:
        return resolve_executable(node.executable_ref, self.cfg.job.allowed_modules, node.node_id)

    def _key(self, ctx: StepContext, node: Node):
        return batch_key(ctx.job_id, ctx.step, node.node_id)

    # -- DATA_LOAD -----------------------------------------------------------------------
    def data_load(self, node: Node, ctx: StepContext) -> NodeResult:
        records = self.sampler.next_batch(int(node.config.get("prompts_per_step", self.cfg.data.prompts_per_step)))
        prompt_ids = [self.encoder.encode_prompt(r.prompt) for r in records]
        columns = {
            S.PROMPT_IDS: Ragged.from_rows(prompt_ids, dtype=np.int32),
            S.ANSWER: encode_texts([r.answer for r in records]),
            S.PROMPT_INDEX: np.array([r.index for r in records], dtype=np.int64),
        }
        key = self._key(ctx, node)
        nbytes = self.buffer.put(key, columns)
        return NodeResult([key], {"data/prompts": len(records), "buffer/bytes_written": nbytes}, rows=len(records))

    # -- ROLLOUT -------------------------------------------------------------------------
    def rollout(self, node: Node, ctx: StepContext) -> NodeResult:
        if node.executable_ref:
            return self.episodes(node, ctx)
        (source,) = ctx.input_keys(node.node_id)[:1]
        r = self.cfg.rollout
        rows = ctx.results[source.node_id].rows if source.node_id in ctx.results else None
        keys, metrics = self.fleet.generate(
            source,
            job_id=ctx.job_id,
            step=ctx.step,
            node_id=node.node_id,
            n=int(node.config.get("n", r.n)),
            temperature=float(node.config.get("temperature", r.temperature)),
            top_p=float(node.config.get("top_p", r.top_p)),
            max_tokens=int(node.config.get("max_tokens", r.max_tokens)),
            seed=rollout_seed(self.cfg.job.seed, ctx.step),
            num_prompts=rows,
            columns=declared(node, cat.CONFIG_INPUTS) or (),
        )
        return NodeResult(keys, metrics, rewrites_rows=True)  # one row per sample from here on

    def episodes(self, node: Node, ctx: StepContext) -> NodeResult:
        """A ROLLOUT node with an environment: n multi-turn episodes per prompt (step/user/episodes.py)."""
        if self.user_code is None or self.user_code.environments is None:
            raise InvalidArgument(f"node '{node.node_id}' names an environment but the job has no environment workers")
        batch = self.buffer.get_many(ctx.input_keys(node.node_id)[:1])
        r, c = self.cfg.rollout, node.config
        n = int(c.get("n", r.n))
        rows = batch.num_rows()
        sampling = {"temperature": float(c.get("temperature", r.temperature)), "top_p": float(c.get("top_p", r.top_p))}
        if S.PROMPT_INDEX not in batch.columns:
            raise InvalidArgument(
                f"node '{node.node_id}' runs episodes on dataset rows: add prompt_index to its inputs "
                "(a DATA_LOAD node writes it)"
            )
        records = self.sampler.records  # the environment starts from the row's own prompt text, not its template
        prompts = [records[int(i)].prompt for i in np.asarray(batch[S.PROMPT_INDEX])]
        trajs, metrics = self.user_code.episodes(
            node,
            self.fleet.router,
            self.encoder,
            prompts,
            [_text(batch[S.ANSWER], i) for i in range(rows)],
            n=n,
            sampling=sampling,
            session=f"{ctx.job_id}/{ctx.step}/{node.node_id}",
        )
        columns, samples = trajectory_columns(trajs, batch[S.ANSWER], n, ctx.job_id, ctx.step)
        key = self._key(ctx, node)
        self.buffer.put(key, columns, samples=samples)
        metrics["reward/mean"] = float(columns[S.REWARDS].mean()) if trajs else 0.0
        metrics["reward/accuracy"] = float(columns[S.ACCURACY].mean()) if trajs else 0.0
        return NodeResult([key], metrics, rewrites_rows=True)

    # -- COMPUTE -------------------------------------------------------------------------
    def _reads(self, node: Node, ctx: StepContext, also: Sequence[str] = ()) -> Reads:
        """The upstream batches and columns `node` reads (its declared inputs: step/dag/columns.py)."""
        return plan_reads(node, ctx.input_keys(node.node_id), node_outputs(ctx.nodes.values()), also)

    def _read(self, node: Node, ctx: StepContext, also: Sequence[str] = ()) -> Batch:
        reads = self._reads(node, ctx, also)
        return self.buffer.get_many(reads.keys, columns=reads.columns)

    def _read_held(self, node: Node, ctx: StepContext, also: Sequence[str] = ()) -> Batch:
        """A built-in COMPUTE node's read: held columns of this step first (step/dag/held.py), and in the same call
        what its built-in successor needs from the same batches."""
        writes = node_outputs(ctx.nodes.values())
        reads = self._reads(node, ctx, also)
        local = [i for i, n in ctx.nodes.items() if handler_name(n) in ("reward", "advantage")]
        sources = list(dict.fromkeys(k.node_id for k in reads.keys))
        ahead = successor_reads(node, ctx.nodes.values(), sources, writes, local) if reads.columns else []
        if ahead:
            reads = self._reads(node, ctx, [*also, *ahead])
        return read_held(self.buffer, ctx.held, reads, writes)

    def rule_rewards(self, node: Node, ctx: StepContext, also: Sequence[str] = ()) -> tuple[Batch, np.ndarray, int]:
        """(the rows read, their rule rewards float32 [N], failed groups): the node's executable_ref or
        algorithm.reward, in worker processes per group when algorithm.reward_workers is set."""
        apart = self.user_code is not None and self.user_code.rewards is not None
        batch = self._read_held(node, ctx, also=[*also, *([S.GROUP_INDEX] if apart else [])])  # workers: by group
        fn = self._executable(node) if node.executable_ref and not apart else None
        rows = batch.num_rows()
        prompts = [self.encoder.decode(batch[S.PROMPT_IDS].row(i)) for i in range(rows)]
        responses = [self.encoder.decode(batch[S.RESPONSE_IDS].row(i)) for i in range(rows)]
        answers = [_text(batch[S.ANSWER], i) for i in range(rows)]
        if apart:  # in worker processes, per group, with a timeout
            ref = node.executable_ref or self.cfg.algorithm.reward
            scored = self.user_code.score(ref, prompts, responses, answers, np.asarray(batch[S.GROUP_INDEX]))
            return batch, scored.rewards, len(scored.failed_groups)
        return batch, np.asarray(score(fn or self.reward_fn, prompts, responses, answers), dtype=np.float32), 0

    def reward(self, node: Node, ctx: StepContext) -> NodeResult:
        batch, rewards, failed = self.rule_rewards(node, ctx)
        rows = batch.num_rows()
        correct = (rewards >= 1.0).astype(np.float32)
        key = self._key(ctx, node)
        self.buffer.put(key, {S.REWARDS: rewards, S.ACCURACY: correct})
        hold(ctx.held, node.node_id, {S.REWARDS: rewards, S.ACCURACY: correct})  # the advantage node's input
        lengths = batch[S.RESPONSE_IDS].lengths()
        return NodeResult(
            [key],
            {
                "reward/mean": float(rewards.mean()) if rows else 0.0,
                "reward/std": float(rewards.std()) if rows else 0.0,
                "reward/accuracy": float(correct.mean()) if rows else 0.0,
                "response/length_mean": float(lengths.mean()) if rows else 0.0,
                "response/length_max": float(lengths.max()) if rows else 0.0,
                "reward/failed_groups": float(failed),
            },
        )

    def advantage(self, node: Node, ctx: StepContext) -> NodeResult:
        batch = self._read_held(node, ctx)
        estimator = node.config.get("estimator", self.cfg.algorithm.advantage)
        rewards = np.asarray(batch[S.REWARDS], dtype=np.float32)
        offsets = batch[S.RESPONSE_IDS].offsets
        alg = self.cfg.algorithm
        token_kl = None
        kl_coef = alg.loss.kl_coef or 0.0
        if kl_coef and S.REF_LOGPROBS in batch.columns and S.OLD_LOGPROBS in batch.columns:
            token_kl = batch[S.OLD_LOGPROBS].values - batch[S.REF_LOGPROBS].values
        columns: dict[str, Ragged] = {}
        if estimator == "gae":
            token_rewards = adv.terminal_token_rewards(rewards, offsets, token_kl=token_kl, kl_coef=kl_coef)
            values, returns = adv.gae_advantages(
                token_rewards, batch[S.VALUES].values, offsets, gamma=alg.gamma, lam=alg.lam
            )
            columns[S.RETURNS] = Ragged(returns, offsets)
        elif estimator == "reinforce_pp":
            values = adv.reinforce_pp_advantages(rewards, offsets, token_kl=token_kl, kl_coef=kl_coef, gamma=alg.gamma)
        elif estimator in ("grpo", "grpo_no_std", "rloo"):
            groups = np.asarray(batch[S.GROUP_INDEX], dtype=np.int64)  # only the group estimators read it
            if estimator == "rloo":
                scalar = adv.rloo_advantages(rewards, groups)
            else:
                scalar = adv.grpo_advantages(rewards, groups, normalize_std=estimator == "grpo")
            values = adv.broadcast_to_tokens(scalar, offsets)
        else:
            raise InvalidArgument(f"node '{node.node_id}': unknown advantage estimator {estimator!r}")
        columns[S.ADVANTAGES] = Ragged(np.asarray(values, dtype=np.float32), offsets)
        key = self._key(ctx, node)
        self.buffer.put(key, columns)
        values = columns[S.ADVANTAGES].values
        stats = {"advantage/mean": float(values.mean()), "advantage/abs_max": float(np.abs(values).max())}
        if S.GROUP_INDEX in batch.columns:  # groups that all scored alike teach a group estimator nothing
            stats["reward/zero_variance_groups"] = adv.zero_variance_share(rewards, np.asarray(batch[S.GROUP_INDEX]))
        return NodeResult([key], stats if values.size else {})

    def dynamic_sampling(self, node: Node, ctx: StepContext) -> NodeResult:
        """DAPO: keep only groups whose rewards differ (others carry no gradient); rewrites all rows, so it
        reads (and passes on) its declared outputs too, or every column when it declares none."""
        outputs = declared(node, cat.CONFIG_OUTPUTS)
        if outputs is None:
            batch = self.buffer.get_many(ctx.input_keys(node.node_id))
        else:
            batch = self._read(node, ctx, also=outputs)
        rewards = np.asarray(batch[S.REWARDS])
        groups = np.asarray(batch[S.GROUP_INDEX])
        keep = [i for i in range(len(rewards)) if np.ptp(rewards[groups == groups[i]]) > 0]
        if not keep:  # every group is uniform: keep all rather than train on nothing
            keep = list(range(len(rewards)))
        kept = batch.take(keep)
        key = self._key(ctx, node)
        self.buffer.put(key, kept.columns, samples=kept.samples)
        return NodeResult([key], {"dynamic_sampling/kept_fraction": len(keep) / max(1, len(rewards))}, True)

    def user_compute(self, node: Node, ctx: StepContext) -> NodeResult:
        """A user COMPUTE node: `fn(batch: Batch, config: dict) -> dict[str, array | Ragged]` of new columns."""
        fn = self._executable(node)
        batch = self._read(node, ctx)
        out = fn(batch, dict(node.config))
        columns = out.columns if isinstance(out, Batch) else dict(out)
        key = self._key(ctx, node)
        self.buffer.put(key, columns)
        return NodeResult([key])

    # -- MODEL_* -------------------------------------------------------------------------
    def reward_model(self, node: Node, ctx: StepContext) -> NodeResult:
        """MODEL_INFERENCE / REWARD: the trainer's reward model scores the rows (step/scoring/reward_model.py)."""
        keys, metrics = score_node(self, node, ctx)
        return NodeResult(keys, metrics)

    def inference(self, node: Node, ctx: StepContext) -> NodeResult:
        if enum_name(node.node_role).lower() == "critic":
            key = self._key(ctx, node)
            reads = self._reads(node, ctx)
            reply = self.trainer.compute_values(reads.keys, key, columns=reads.columns)
            return NodeResult([key], {f"{node.node_id}/{k}": v for k, v in reply.metrics.items()})
        group = call_group(node, ctx)  # the log-prob nodes started with this one share its trainer call
        call = "logprobs/" + "+".join(n.node_id for n in group)
        temp = self._temperature(node, ctx)
        return ctx.once(call, lambda: run_passes(self.trainer, group, ctx, self._reads, temp))[node.node_id]

    def _temperature(self, node: Node, ctx: StepContext) -> float | None:
        """The temperature the rows of `node` were sampled at (step/scoring/temperature.py)."""
        return sampling_temperature(node, ctx.nodes.values(), self.cfg.rollout.temperature)

    def train(self, node: Node, ctx: StepContext) -> NodeResult:
        role = enum_name(node.node_role).lower()
        loss = self.cfg.algorithm.loss.model_dump()
        if role == "critic":
            loss["policy_loss"] = None  # the trainer's critic objective (value)
        t = self.cfg.trainer
        # besides its declared inputs: what the loss corrects against, and the loss mask of multi-turn episodes
        also = ratio_reads(loss)
        if any(S.LOSS_MASK in cols for cols in node_outputs(ctx.nodes.values()).values()):
            also.append(S.LOSS_MASK)
        gap = role == "actor" and loss.get("old_logprobs") == "in-train" and ctx.version is not None
        if gap:  # the train call's own pi_old pass reports the rollout gap, as the old log-prob node would
            also.extend(c for c in gap_reads(node, ctx) if c not in also)
        reads = self._reads(node, ctx, also)
        reply = self.trainer.train_step(
            role,
            reads.keys,
            loss,
            t.micro_batch_tokens,
            t.mini_batches,
            ctx.step,
            columns=reads.columns,
            weight_version=ctx.version if gap else None,
            temperature=self._temperature(node, ctx),
        )
        prefix = "critic" if role == "critic" else "actor"
        return NodeResult([], {(gap and gap_metric(k)) or f"{prefix}/{k}": v for k, v in reply.metrics.items()})
