"""One walk of a workflow's DAG in a step: the executor (dependency order, concurrent branches), the dispatch
table from (node type, role) to handler, what each node does (`NodeHandlers`), the routing of a multi-agent
workflow's nodes to their agent's services, which columns a node reads (declared inputs, columns already held,
the log-prob gap's extra reads), and the log-prob nodes that share one trainer call.
"""
