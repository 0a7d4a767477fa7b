"""The ``ray`` executor for trajkit."""
