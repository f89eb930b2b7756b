"""The pipeline's stages and the run directory that records them.

``stages``: small functions over plain data (clean, quantize, lint on the host; upload, probe, build,
inspect, profile on a target through a ``Runner``; report and gate on the host again). ``rundir``: each
stage's outcome, seconds and log on disk at once. Above them, ``edgeq.orchestration`` composes the stages
(deploy, fleet, run, tune, demo); below them, ``edgeq.remote`` carries them to a target.
"""
