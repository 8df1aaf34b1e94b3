"""How a job's steps follow each other in each `training.mode`: `SyncSteps` runs each step's DAG whole;
`AsyncSteps` runs the consumer side fed by a `Producer` thread that runs ahead (where the DAG splits: `modes`),
within the staleness bound and back-pressure of `AdmissionGate`, and reports the overlap per step.
"""
