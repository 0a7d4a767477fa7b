"""``trajkit export --chat_template T``: rows rendered through the chat template they will be trained with.

The parts, each a module: :mod:`.source` finds the template (a model directory, a Hub id in the
local cache, or a ``.jinja`` file) and the variables its tokenizer hands it; :mod:`.adapt` turns a
trajectory into the messages that template can take, recording every change it makes; :mod:`.check`
renders them the way transformers does and checks that nothing was lost or mangled; :mod:`.export`
runs the rows through all three, writes what rendered and reports the rest with their reasons.
The manual is ``docs/chat_templates.md``.
"""
