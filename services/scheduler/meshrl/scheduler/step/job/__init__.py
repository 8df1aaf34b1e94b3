"""One job from start to end (`JobRunner`, and `AgentJob` for a multi-agent workflow): its inputs prepared and
read, the services brought up and shut down, the supervised warm-up and its learning-rate schedule, the held-out
evaluation, colocated mode's turns, fleet changes between steps, the deletion of finished steps' batches, the
progress display. The step loop itself calls down into `pacing/` and `dag/`.
"""
