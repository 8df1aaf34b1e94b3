"""A job's user code run apart from the scheduler: the worker processes (timeouts, restarts, a crash boundary),
reward functions scored per group in them, and multi-turn episodes against environments that live in them.
"""
