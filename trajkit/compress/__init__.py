"""Trajectory compression: fit trajectories into a training context without losing what they teach.

Compressors and token counters are plugins (``trajkit_compressors``, ``trajkit_token_counters``);
this package holds their contracts (:mod:`.base`), the conversation helpers every strategy shares
(:mod:`.turns`), the built-in strategies and counters, the summariser with its cache and the
streaming, resumable engine behind ``trajkit compress``. Nothing here imports ``tokenizers`` or
talks to a model until a strategy or a counter that needs one is built.
"""
