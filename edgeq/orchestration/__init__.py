"""What edgeq does with the pipeline's stages (``edgeq.pipeline.stages``): each module composes them for one
task.

``deploy`` (one model, one target), ``variants`` (``compare --target``'s builds from one calibration),
``implicit`` (``--placement implicit``: the target's implicit engine mirrored and gated against), ``retime``
(engines timed in alternation), ``fleet`` with ``fleet_file`` (one model, many targets),
``run`` (a whole pipeline file), ``tune`` (placement decided by the target's timings) and ``demo``.
Nothing below this package imports from it.
"""
