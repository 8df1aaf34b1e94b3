"""The data-plane contract: which tensors each DAG node writes to the data buffer.

Every batch is one row per sample (prompts: one row per prompt). Variable-length
sequences are ragged tensors (flat values + n+1 offsets). Producers and consumers in
every service use these names; a consumer merges the batches of its upstream nodes by
column (same rows, each column written by exactly one node).
"""

from __future__ import annotations

# --- DATA_LOAD (one row per prompt) -------------------------------------------------
PROMPT_IDS = "prompt_ids"  # ragged int32: chat-templated prompt token ids
ANSWER = "answer"  # ragged uint8: utf-8 reference answer (may be empty)
PROMPT_INDEX = "prompt_index"  # int64 [P]: position of the prompt in the dataset order

# --- ROLLOUT (one row per sample; the n samples of a prompt are contiguous) ----------
# Also carries PROMPT_IDS and ANSWER repeated per sample, and SampleMeta per row
# (group_id, index_in_group, weight_version, finish_reason).
RESPONSE_IDS = "response_ids"  # ragged int32: generated token ids
ROLLOUT_LOGPROBS = "rollout_logprobs"  # ragged float32: log-probs by the rollout engine
RESPONSE_VERSIONS = "response_versions"  # ragged int32: weight version that produced each token (int64 still reads)
GROUP_INDEX = "group_index"  # int64 [N]: index of the sample's prompt in the batch
# Multi-turn episodes (a ROLLOUT node with an environment): response_ids is the whole trajectory after the
# first prompt, model turns and environment turns interleaved, exactly the token ids the engine saw and produced.
LOSS_MASK = "loss_mask"  # ragged float32: 1.0 for model tokens, 0.0 for environment tokens (not trained on)
EPISODE_TURNS = "episode_turns"  # int32 [N]: model turns of the episode
EPISODE_END = "episode_end"  # ragged uint8: utf-8 reason the episode ended (done, max_turns, max_tokens, ...)

# --- COMPUTE: reward ------------------------------------------------------------------
REWARDS = "rewards"  # float32 [N]: scalar reward per sample
ACCURACY = "accuracy"  # float32 [N]: 1.0 when the answer is correct
RM_SCORES = "rm_scores"  # float32 [N]: a reward model's score per sample (MODEL_INFERENCE node of role REWARD)

# --- COMPUTE: dynamic sampling (DAPO) keeps a subset of rows; it rewrites all columns ---
# --- COMPUTE: advantage ---------------------------------------------------------------
ADVANTAGES = "advantages"  # ragged float32: per response token
RETURNS = "returns"  # ragged float32: per response token (critic target)

# --- MODEL_INFERENCE ------------------------------------------------------------------
OLD_LOGPROBS = "old_logprobs"  # ragged float32: actor before the update
REF_LOGPROBS = "ref_logprobs"  # ragged float32: reference model
ENTROPY = "entropy"  # ragged float32
VALUES = "values"  # ragged float32: critic, per response token

# Sequences are assembled as prompt_ids ++ response_ids; per-token tensors above are
# aligned with response_ids (the log-prob of response token t given everything before it).
