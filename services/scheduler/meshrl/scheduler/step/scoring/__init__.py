"""How a step's samples are scored and weighed: reward functions (built-in or a job's own), the reward-model
node, advantage estimators, and what the loss's log-probs need from the step: where pi_old comes from and
which columns the ratio reads, and the temperature the rows were sampled at.
"""
