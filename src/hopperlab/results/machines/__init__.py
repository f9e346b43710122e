"""Machines side by side (issue 18): several results folders compared, priced, checked against
per-machine references, and predictions for machines nobody here has.

One concern per module: ``runs`` (results folders -> runs per machine), ``descriptions``
(configs/machines/), ``references`` (configs/references/: judge and check), ``cost`` (cheaper
per unit), ``predict`` (the models), ``compare`` (machines.csv, machines.html, charts),
``mlflow_source`` (the same runs from one MLflow server). Machine names come from
``hopperlab.node.naming``; prices are recorded by ``hopperlab.config.cost``.
"""
