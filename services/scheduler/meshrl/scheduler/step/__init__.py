"""The training-step loop of the scheduler, one concern a subpackage. Each imports only those listed below it
(tests/unit/scheduler/test_step_layers.py holds them to it):

- `job/`: one job from start to end: inputs, services, warm-up, evaluation, the step loop, checkpoints.
- `pacing/`: how steps follow each other in each `training.mode` (sync, or a producer running ahead).
- `dag/`: one walk of a workflow's DAG: the executor, what each node does and which columns it reads.
- `user/`: the job's user code in worker processes: reward groups and multi-turn environment episodes.
- `scoring/`: rewards, advantages and what the loss's log-probs need (pi_old's source, the temperature).
- `prompts/`: the prompt datasets that DATA_LOAD nodes, evaluation and the warm-up draw from.
"""
